"""The ``shmq`` command as a user runs it."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from brokerproc import free_port


def shmq(*args, cwd=None, timeout=60, env=None):
    return subprocess.run([sys.executable, "-m", "shmq.tools", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd, env=env)


def test_dash_m_prints_every_setting_with_its_default(tmp_path):
    conf = tmp_path / "broker.conf"
    conf.write_text("# a RocketMQ broker.conf\nbrokerName=broker-b\nflushDiskType=SYNC_FLUSH\n"
                    "brokerRole=ASYNC_MASTER\n")
    r = shmq("broker", "-c", str(conf), "-m")
    assert r.returncode == 0, r.stderr
    lines = dict(line.split("=", 1) for line in r.stdout.splitlines())
    assert lines["brokerName"].startswith("broker-b") and "(default broker-a)" in lines["brokerName"]
    assert lines["listenPort"] == "10911" and lines["namesrvListenPort"] == "9876"
    assert lines["flushDiskType"].startswith("SYNC_FLUSH")
    assert "fileReservedTime" in lines and "defaultTopicQueueNums" in lines
    assert lines["autoCreateTopicEnable"] == "true"      # as broker.conf and mqadmin spell it
    assert lines["brokerRole"].startswith("ASYNC_MASTER") and lines["haListenPort"].startswith("0")
    assert "ignoring unknown setting" not in r.stderr      # brokerRole is known (broker/ha)


def test_bad_settings_are_named(tmp_path):
    conf = tmp_path / "broker.conf"
    conf.write_text("listenPort=abc\n")
    r = shmq("broker", "-c", str(conf))
    assert r.returncode == 2 and "listenPort='abc': not an integer" in r.stderr
    conf.write_text("flushDiskType=SOMETIMES\n")
    r = shmq("broker", "-c", str(conf))
    assert r.returncode == 2 and "flushDiskType" in r.stderr
    conf.write_text("=6\n")                    # a value with no name: was an unknown setting ''
    r = shmq("broker", "-c", str(conf))
    assert r.returncode == 2 and f"{conf}:1: a value with no setting name: '=6'" in r.stderr
    r = shmq("broker", "-c", str(tmp_path / "missing.conf"))
    assert r.returncode == 2 and "missing.conf" in r.stderr
    # a NameServer address without its port: the services process died of it at
    # its first registration, a traceback, and the broker exited
    conf.write_text(f"storePathRootDir={tmp_path / 'store'}\nnamesrvAddr=notahost\n")
    r = shmq("broker", "-c", str(conf))
    assert r.returncode == 2 and "namesrvAddr='notahost': want host:port" in r.stderr
    conf.write_text(f"storePathRootDir={tmp_path / 'store'}\n")
    r = shmq("broker", "-c", str(conf), "-n", "127.0.0.1:9876;127.0.0.1")
    assert r.returncode == 2 and "('127.0.0.1' is not)" in r.stderr
    r = shmq("broker", "-c", str(conf), "-n", "127.0.0.1:9876,127.0.0.1:9877")   # ',' for ';'
    assert r.returncode == 2 and "several joined by ';'" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.splitlines()) == 1


@pytest.mark.parametrize("setting", ["listenPort", "namesrvListenPort", "metricsPort"])
def test_a_port_in_use_is_one_clear_line_and_an_exit(tmp_path, setting):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        settings = {"storePathRootDir": tmp_path / "store", "listenPort": free_port(),
                    "namesrvListenPort": free_port(), "haListenPort": free_port(),
                    "workerProcessNums": 1, setting: port}
        conf = tmp_path / "broker.conf"
        conf.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        r = shmq("broker", "-c", str(conf), timeout=120)
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"shmq broker: cannot listen on 127.0.0.1:{port}") and f"({setting})" in last
    if setting == "namesrvListenPort":     # the usual cause: a NameServer runs there already
        assert f"shmq broker -n 127.0.0.1:{port}" in last
    assert "Traceback" not in r.stderr and "restarting" not in r.stderr
    # and the store was left clean for the next start
    assert not os.path.exists(tmp_path / "store" / "abort")


def refused_start(tmp_path, store, **settings) -> str:
    """The last line ``shmq broker`` writes when it must refuse to start on
    a broker.conf of ``settings`` (its store ``store``, fresh ports): exit
    status 1, no traceback."""
    conf = tmp_path / "broker.conf"
    settings = {"storePathRootDir": store, "listenPort": free_port(),
                "namesrvListenPort": free_port(), **settings}
    conf.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    r = shmq("broker", "-c", str(conf), timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    return r.stderr.strip().splitlines()[-1]


def test_a_bind_address_that_is_not_one_is_named_by_its_key(tmp_path):
    """bindAddress=bogus was blamed on the first port bound, the embedded
    NameServer's ("if a NameServer already runs there, register with it")."""
    last = refused_start(tmp_path, tmp_path / "store", bindAddress="no-such-host.invalid")
    assert last.startswith("shmq broker: bindAddress='no-such-host.invalid': not an IPv4 address")
    assert "NameServer" not in last


def test_a_unix_socket_path_too_long_for_the_kernel_is_one_clear_line_before_recovery(tmp_path):
    store = tmp_path / ("d" * 60) / ("e" * 60) / "store"     # broker.sock beside it: > 107 bytes
    last = refused_start(tmp_path, store)
    assert last.startswith(f"shmq broker: cannot listen on the Unix socket {store}/broker.sock")
    assert "set unixSocketPath to a shorter one" in last
    assert not store.exists()      # refused before the store was opened


def test_empty_flags_unreadable_files_and_a_socket_directory_that_is_not_there_are_named(tmp_path):
    """An empty -c, -n or --bind is refused (an empty -c was a broker on every
    default, its store in ~/store); a broker.conf that is not UTF-8 is named;
    a unixSocketPath in a directory that does not exist is named by its key."""
    for argv, says in ((("broker", "-c", ""), "argument -c/--config: empty"),
                       (("broker", "-n", " "), "argument -n/--namesrv: empty"),
                       (("namesrv", "--bind", ""), "argument --bind: empty")):
        r = shmq(*argv)
        assert r.returncode == 2 and says in r.stderr, (argv, r.stderr)
    conf = tmp_path / "broker.conf"
    conf.write_bytes(b"listenPort=\xc1\xc2\n")
    r = shmq("broker", "-c", str(conf))
    assert (r.returncode, r.stderr.strip()) == (
        2, f"shmq broker: {conf}: not UTF-8 text (invalid start byte at byte 11)")
    conf.write_text(f"storePathRootDir={tmp_path / 'store'}\nlistenPort={free_port()}\n"
                    f"namesrvListenPort={free_port()}\nhaListenPort={free_port()}\n"
                    f"unixSocketPath={tmp_path / 'nowhere' / 'broker.sock'}\n")
    r = shmq("broker", "-c", str(conf), timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        f"shmq broker: cannot listen on the Unix socket {tmp_path / 'nowhere' / 'broker.sock'} "
        f"(unixSocketPath): No such file or directory")
    assert not os.path.exists(tmp_path / "store" / "abort")     # left clean for the next start


def test_a_store_path_that_is_a_file_is_named(tmp_path):
    a_file = tmp_path / "not-a-dir"
    a_file.write_text("")
    conf = tmp_path / "broker.conf"
    for path, says in ((a_file, f"storePathRootDir={a_file} is a file, not a directory"),
                       (a_file / "store", f"storePathRootDir={a_file / 'store'}: {a_file} "
                                          f"is a file, not a directory")):
        conf.write_text(f"storePathRootDir={path}\n")
        r = shmq("broker", "-c", str(conf))
        assert (r.returncode, r.stderr) == (2, f"shmq broker: {says}\n")
    r = shmq("store", "inspect", str(a_file))
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and str(a_file) in r.stderr


def test_a_bad_namesrv_port_is_a_usage_error():
    r = shmq("namesrv", "-p", "99999")
    assert r.returncode == 2 and "'99999' is not a port" in r.stderr and "Traceback" not in r.stderr


def test_help_names_shmq_bench_json_flag():
    """`shmq bench --help` is perf's own (it knows --table, not the --json
    that only `shmq bench` takes), so `shmq --help` names it."""
    r = shmq("--help")
    assert r.returncode == 0 and "(--json: the JSON lines on stdout instead)" in " ".join(r.stdout.split())


def _importing_numpy(pid: int, timeout: float = 60.0) -> None:
    """Wait until process ``pid`` maps numpy's core extension: shmq's own
    code runs (``tools.entry`` imports the command, which imports numpy),
    so the interpreter's start-up is over. (A Ctrl-C before that, while
    Python imports ``site``, is the interpreter's own "Fatal Python error",
    whatever program it starts: on a busy machine that took over 0.1 s.)"""
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/maps") as f:
                if "_multiarray_umath" in f.read():
                    return
        except OSError:          # it ended: the caller reads why
            return
        time.sleep(0.001)
    raise AssertionError(f"process {pid} did not import numpy within {timeout:.0f} s")


def test_ctrl_c_at_any_point_of_a_start_is_never_a_traceback(tmp_path):
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) while
    `shmq broker` starts: while its modules load (numpy, numba: a
    KeyboardInterrupt from deep in an import, a traceback) it ends with
    "shmq: interrupted" and 130; while its fork server loads (which died of
    the same, a traceback and "unexpected EOF") or later, the boss stops it
    cleanly. Each point: no traceback, the process group gone. The points
    count from the moment shmq's imports reach numpy (``_importing_numpy``)."""
    import signal
    import time
    conf = tmp_path / "broker.conf"
    conf.write_text(f"storePathRootDir={tmp_path / 'store'}\nlistenPort={free_port()}\n"
                    f"namesrvListenPort={free_port()}\nhaListenPort={free_port()}\n")
    for delay in (0.0, 0.3, 0.7, 1.4):
        p = subprocess.Popen([sys.executable, "-m", "shmq.tools", "broker", "-c", str(conf)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
        _importing_numpy(p.pid)
        time.sleep(delay)
        os.killpg(p.pid, signal.SIGINT)
        out, _ = p.communicate(timeout=60)
        assert "Traceback" not in out and "unexpected EOF" not in out, (delay, out)
        assert p.returncode in (0, 130, -signal.SIGINT), (delay, p.returncode, out)
        assert p.returncode != 130 or out.strip().endswith("shmq: interrupted"), out
