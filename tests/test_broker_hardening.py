"""A real broker keeps its store to its owner and raises its own open-files
limit (issue 15, points 5 and 6: owner-only files, nofile)."""
from __future__ import annotations

import os
import re
import resource
import stat
import subprocess
import sys
import time

import pytest

from brokerproc import BrokerProc, broker_conf
from shmq.client.remoting import RemotingClient
from shmq.client.requests import create_topic, send_message
from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.control import names


def _open_to_others(root: str) -> list[str]:
    """Every path under ``root`` (and root) with any group or other permission."""
    bad = []
    for top, dirs, files in os.walk(root):
        for p in [top] + [os.path.join(top, n) for n in files]:
            try:
                mode = os.lstat(p).st_mode
            except FileNotFoundError:
                continue   # a .tmp renamed meanwhile
            if mode & 0o077:
                bad.append(f"{p} {stat.filemode(mode)}")
    return bad


def test_store_files_the_socket_and_shared_memory_are_owner_only(tmp_path):
    conf = broker_conf(tmp_path)
    store = conf["storePathRootDir"]
    # a store an older version made: world-readable directory and file
    os.makedirs(store, mode=0o755)
    os.chmod(store, 0o755)
    with open(os.path.join(store, "old.txt"), "w"):
        pass
    os.chmod(os.path.join(store, "old.txt"), 0o644)
    b = BrokerProc(tmp_path, conf).start()
    try:
        with RemotingClient(b.addr) as c:
            assert c.invoke(create_topic("Private", 2)).code == R.SUCCESS
            assert c.invoke(send_message("Private", b"hello", queue_id=0)).code == R.SUCCESS
            assert c.invoke(send_message("Private", b"later", queue_id=1,
                                         props={"DELAY": "1"})).code == R.SUCCESS
            assert c.invoke(send_message("Private", b"timed", queue_id=1,
                                         props={"TIMER_DELAY_SEC": "2"})).code == R.SUCCESS
        time.sleep(1.5)   # the delayed message is reposted; offsets persisted
        assert stat.S_IMODE(os.stat(b.unix).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(store).st_mode) == 0o700
        assert re.search(r"store directory \S+ was mode 0755: made owner-only \(0700\)", b.log())
        os.remove(os.path.join(store, "old.txt"))   # an older version's file: left as it was
        assert _open_to_others(store) == []
        shm, sem, _ = names(store)
        for p in (f"/dev/shm{shm}", f"/dev/shm/sem.{sem[1:]}"):
            assert stat.S_IMODE(os.stat(p).st_mode) == 0o600, p
        made = {os.path.relpath(os.path.join(t, n), store)
                for t, ds, fs in os.walk(store) for n in ds + fs}
        assert {"commitlog", "consumequeue", "config", "lock", "abort", "broker.sock"} <= made
    finally:
        assert b.stop() == 0
    # a clean stop writes the checkpoint, offsets and .bak files: owner-only too
    made = {os.path.relpath(os.path.join(t, n), store) for t, ds, fs in os.walk(store) for n in fs}
    assert {"checkpoint", "config/consumerOffset.json", "config/topics.json.bak"} <= made, made
    assert _open_to_others(store) == []


def _limits(pid: int) -> tuple[int, int]:
    with open(f"/proc/{pid}/limits") as f:
        for line in f:
            if line.startswith("Max open files"):
                soft, hard = line.split()[3:5]
                return int(soft), int(hard)
    raise AssertionError("no Max open files line")


def test_the_broker_raises_its_open_files_limit_and_its_children_inherit_it(tmp_path):
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 256:
        pytest.skip(f"hard nofile is {hard}: nothing to raise")
    b = BrokerProc(tmp_path, broker_conf(tmp_path))
    real_popen = subprocess.Popen

    def popen(*a, preexec_fn=None, **kw):   # start `shmq broker` with soft nofile 256
        def preexec():
            if preexec_fn is not None:      # brokerproc's: it dies with this process
                preexec_fn()
            resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        return real_popen(*a, preexec_fn=preexec, **kw)

    subprocess.Popen = popen
    try:
        b.start()
    finally:
        subprocess.Popen = real_popen
    try:
        soft, _ = _limits(b.proc.pid)
        assert soft > 256 and (hard == resource.RLIM_INFINITY or soft == hard), soft
        assert f"open files limit (RLIMIT_NOFILE) raised from 256 to {soft}" in b.log()
        kids = b.children()
        assert "shmq-worker-0" in kids and "shmq-services" in kids, kids
        for name in ("shmq-worker-0", "shmq-services", "shmq-flusher"):
            if name in kids:
                assert _limits(kids[name])[0] == soft, name
    finally:
        assert b.stop() == 0


def test_accept_out_of_descriptors_is_one_error_a_second_naming_the_limit(caplog, monkeypatch):
    import errno
    import logging

    from shmq.broker import boss as boss_mod

    class Listener:
        def accept(self):
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    now = [100.0]
    monkeypatch.setattr(boss_mod.time, "monotonic", lambda: now[0])
    b = boss_mod.Boss.__new__(boss_mod.Boss)   # only what _accept touches
    b.fd_failures, b.fd_logged_at = 0, float("-inf")
    caplog.set_level(logging.ERROR, logger="shmq.boss")
    for _ in range(500):                        # a busy loop's worth of failures
        b._accept(Listener(), "tcp")
        now[0] += 0.001
    now[0] += 1.0
    b._accept(Listener(), "tcp")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert f"RLIMIT_NOFILE soft {soft}" in lines[0]
    assert "ulimit -n" in lines[0] and "LimitNOFILE" in lines[0]
    assert "(1 time(s) since the last such line)" in lines[0]
    assert "(500 time(s) since the last such line)" in lines[1]
