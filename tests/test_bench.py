"""``shmq bench`` and ``shmq profile`` as a user runs them: real subprocesses,
quick sizes, one cheap bench where any will do.

- a run opens with the machine record (CPU, cores, kernel, file system,
  the OS settings sysctl/tune.py reads) and every result line carries it;
- ``--results`` writes the Markdown table with limit and peer columns;
- against a broker someone else runs (``--broker``) a broker bench measures
  it, and the benches that need their own store or other settings are
  skipped with the reason, leaving that broker running;
- a bench that fails is a ``failed`` line, the run goes on, and it exits 1;
- ``shmq profile`` writes one valid SVG flame graph per broker process (a
  frame name py-spy read half-written made well-formed);
- the benches' lean send client writes the frames ``send_cmd`` encodes and
  stops at an answer out of its place.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
from brokerproc import free_port, start_broker

CHEAP = "flush_write_path"       # four short fdatasync loops on the scratch disk: ~2 s


def shmq(*args, cwd, timeout=120):
    return subprocess.run([sys.executable, "-m", "shmq.tools", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd, check=False)


def jsonl(path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("bench")
    r = shmq("bench", "--quick", "--out", d / "run.jsonl", "--results", d / "RESULTS.md", CHEAP, cwd=d)
    assert r.returncode == 0, r.stderr
    return d, r


def test_a_run_opens_with_the_machine_and_every_result_carries_it(quick_run):
    d, r = quick_run
    first, *results = jsonl(d / "run.jsonl")
    m = first["machine"]
    assert m["cpu"] and m["cores"] == os.cpu_count() and m["kernel"] == os.uname().release
    assert m["filesystem"] and m["scratch"]["filesystem"] == m["filesystem"]
    assert m["scratch"]["path"].startswith(str(d))                  # ./.perf-scratch of the run
    with open("/proc/sys/vm/dirty_ratio") as f:                     # tune.py's reading, as is
        assert m["sysctl"]["vm.dirty_ratio"] == int(f.read())
    assert {"vm.swappiness", "thp.enabled", "fs.type", "limits.nofile"} <= set(m["sysctl"])
    assert results and all(x["bench"].startswith(CHEAP) for x in results)
    for x in results:
        assert x["machine"] == m and x["run"] == m["run"]
        assert x["value"] > 0 and x["limit"] > 0 and x["limit_name"]
    # the terminal table: the machine in words, then one row per result
    assert m["cpu"] in r.stdout and f"run {m['run']}" in r.stdout
    rows = [line for line in r.stdout.splitlines() if line.startswith(CHEAP)]
    assert [row.split()[0] for row in rows] == [x["bench"] for x in results]


def test_results_markdown_puts_limit_and_peer_beside_each_figure(quick_run):
    d, _ = quick_run
    md = (d / "RESULTS.md").read_text()
    results = jsonl(d / "run.jsonl")[1:]
    assert "A `--quick` run" in md and results[0]["machine"]["kernel"] in md
    assert "| vm.dirty_ratio |" in md
    assert "| benchmark | result | limit (same run) | ratio | peer (same run) |" in md
    for x in results:
        row = next(line for line in md.splitlines() if line.startswith(f"| {x['bench']} |"))
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert len(cells) == 5 and x["limit_name"] in cells[2] and cells[3] == f"{x['ratio']:.3g}"


def test_a_named_broker_is_measured_and_never_owned(tmp_path):
    (tmp_path / "broker").mkdir()
    with start_broker(tmp_path / "broker") as b:
        out = tmp_path / "named.jsonl"
        r = shmq("bench", "--quick", "--broker", b.addr, "--out", out,
                 "broker_send", "broker_sync_flush", "recovery", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert b.proc.poll() is None                                  # still its owner's
        assert b.stop() == 0
    first, *lines = jsonl(out)
    m = first["machine"]
    assert m["broker"] == b.addr
    assert m["broker_store"]["path"] == os.path.realpath(b.store) and m["broker_store"]["filesystem"]
    sends = {x["bench"]: x for x in lines if x["bench"].startswith("broker_send")}
    assert set(sends) == {"broker_send_1conn_unix", "broker_send_1conn_tcp"}   # its socket is local
    assert all(x["value"] > 0 and x["machine"] == m for x in sends.values())
    skipped = {x["bench"]: x["skipped"] for x in lines if "skipped" in x}
    assert set(skipped) == {"broker_sync_flush", "recovery"}
    assert "flushDiskType=SYNC_FLUSH" in skipped["broker_sync_flush"]
    assert "flushDiskType=ASYNC_FLUSH" in skipped["broker_sync_flush"]
    assert "store of its own" in skipped["recovery"]


def test_a_bench_that_fails_is_named_and_the_run_goes_on(tmp_path):
    """A bench whose checks fail gets a ``failed`` line (why, its traceback
    on stderr), the benches after it still run, and the run exits 1."""
    code = ("import sys\nimport perf.__main__ as M\n"
            "def boom(ctx, result):\n"
            "    yield result('boom_first', 1.0, 'msg/s', 2.0, 'a limit')\n"
            "    raise AssertionError('send 7: opaque 8')\n"
            "M.BENCHES = {'boom': boom, **M.BENCHES}\n"
            "sys.exit(M.main(sys.argv[1:]))\n")
    out, md = tmp_path / "run.jsonl", tmp_path / "RESULTS.md"
    r = subprocess.run([sys.executable, "-c", code, "--quick", "--out", out, "--results", md,
                        "boom", CHEAP], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(pathlib.Path(__file__).resolve().parents[1])})
    assert r.returncode == 1, r.stderr
    lines = jsonl(out)[1:]
    assert lines[0]["bench"] == "boom_first" and lines[0]["value"] == 1.0
    assert lines[1]["bench"] == "boom" and lines[1]["failed"] == "AssertionError: send 7: opaque 8"
    assert [x for x in lines[2:] if x["bench"].startswith(CHEAP) and x["value"] > 0]
    assert "Traceback" in r.stderr and "1 FAILED (boom)" in r.stderr
    assert "| boom | failed: AssertionError: send 7: opaque 8 |" in md.read_text()


def test_an_unreachable_broker_is_named(tmp_path):
    addr = f"127.0.0.1:{free_port()}"
    r = shmq("bench", "--quick", "--broker", addr, "broker_send", cwd=tmp_path)
    assert r.returncode == 1 and f"cannot reach the broker at {addr}" in r.stderr


def test_without_a_checkout_it_says_where_it_looked(tmp_path, monkeypatch):
    """perf/ is not installed with shmq: found beside shmq's source or in the
    current directory, else an error naming both."""
    from shmq.tools import bench
    assert bench.perf_checkout() == os.path.dirname(os.path.dirname(bench.__file__))
    monkeypatch.setattr(bench, "__file__", str(tmp_path / "site" / "tools" / "bench.py"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(bench.NoCheckout, match=r"no perf/ folder beside shmq's source \(.*site\) "
                                               r"or in the current directory"):
        bench.perf_checkout()


@pytest.mark.profile
def test_profile_writes_a_flame_graph_per_broker_process(tmp_path):
    from perf.profile import ptrace_problem
    problem = ptrace_problem()
    if problem and not os.environ.get("CI"):                          # CI must prove it
        pytest.skip(problem)
    out = tmp_path / "prof"
    # broker_produce keeps a worker busy (one-at-a-time sends leave it idle
    # most of the time, and py-spy drops idle samples: a few dozen in all)
    # --idle samples the waits too, and each process's line says its share
    # of time waiting for the append lock, its turn to publish, and in its poll
    r = shmq("profile", "--idle", "--quick", "--duration", 4, "--out", out, "broker_produce",
             cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    n = int(re.search(r"# (\d+) broker processes recorded", r.stdout).group(1))
    found = re.findall(r"^(\S+) +pid (\d+) +(\S+\.svg)", r.stdout, re.MULTILINE)
    assert len(found) == n
    shares = {role: [float(v) for v in got] for role, *got in re.findall(
        r"^(\S+) +pid \d+ +\S+\.svg  append lock ([\d.]+)%, publish wait ([\d.]+)%, poll ([\d.]+)%$",
        r.stdout, re.MULTILINE)}
    assert len(shares) == n, r.stdout
    for role, (lock, publish, poll) in shares.items():
        assert lock + publish + poll <= 100.0, (role, shares)
    # a quick produce leaves each worker waiting in its poll part of the time
    assert all(shares[role][2] > 0 for role in shares if role.startswith("worker")), shares
    roles = {role for role, _, _ in found}
    assert {"boss", "worker-0", "worker-1", "flusher", "services"} <= roles
    for role, pid, svg in found:
        assert os.path.basename(svg) == f"{role}-{pid}.svg"
        root = ET.parse(svg).getroot()
        assert root.tag == "{http://www.w3.org/2000/svg}svg", (svg, root.tag)
    assert sorted(p.name for p in out.glob("*.svg")) == sorted(os.path.basename(s) for _, _, s in found)
    # the workers that served the sends were sampled in the send handler
    workers = [s for role, _, s in found if role.startswith("worker")]
    assert any("broker/handlers/send.py" in pathlib.Path(s).read_text() for s in workers)


def test_a_flame_graph_with_a_torn_frame_name_is_made_well_formed(tmp_path):
    """py-spy ``--nonblocking`` can read a frame's name half-written: NUL
    bytes and bytes that are no UTF-8 in a ``<title>`` (a CI run's worker
    graph), which no XML parser or browser opens. ``shmq profile`` replaces
    them (U+FFFD) once py-spy is done; every frame keeps its samples, and a
    clean graph is left as it was."""
    from perf.profile import clean_svg, wait_shares
    svg = tmp_path / "worker-0-1.svg"
    svg.write_bytes(b'<svg xmlns="http://www.w3.org/2000/svg">'
                    b'<g><title>all (10 samples, 100%)</title></g>'
                    b'<g><title>(\xff\xfe$\x00\x00\x00$\x00) (1 samples, 10.00%)</title></g>'
                    b'<g><title>MessageStore._await (core/store.py:600) (3 samples, 30.00%)</title>'
                    b'</g></svg>')
    with pytest.raises(ET.ParseError):
        ET.parse(svg)
    assert clean_svg(str(svg)) == 6                      # 2 bytes no UTF-8, 4 NULs
    titles = [t.text for t in ET.parse(svg).getroot().iter("{http://www.w3.org/2000/svg}title")]
    assert titles[1] == "(\ufffd\ufffd$\ufffd\ufffd\ufffd$\ufffd) (1 samples, 10.00%)"
    assert wait_shares(svg.read_text())["publish wait"] == 0.3
    before = svg.read_bytes()
    assert clean_svg(str(svg)) == 0 and svg.read_bytes() == before


def test_the_socket_limits_leave_no_socket_files_or_temporary_directories(tmp_path):
    """perf.net_limits over a Unix socket, from a scratch path too long for
    one (so the socket goes to a directory of its own under TMPDIR): the
    round trip and the bulk stream leave nothing behind there or in scratch."""
    scratch = tmp_path / ("s" * 100)
    scratch.mkdir()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    code = ("import sys\nfrom perf import net_limits as N\n"
            "assert N.round_trip('unix', sys.argv[1], 0.01)['n'] > 0\n"
            "assert N.bulk('unix', sys.argv[1], 2 << 20, rounds=1)['bps'] > 0\n")
    r = subprocess.run([sys.executable, "-c", code, str(scratch)], capture_output=True, text=True,
                       timeout=120, cwd=pathlib.Path(__file__).resolve().parent.parent,
                       env={**os.environ, "TMPDIR": str(tmp)})
    assert r.returncode == 0, r.stderr[-2000:]
    assert os.listdir(tmp) == [] and os.listdir(scratch) == []


@pytest.mark.parametrize("keyed", [False, True])
def test_the_bench_sender_writes_send_cmd_frames_and_refuses_an_answer_out_of_its_place(keyed):
    """perf.worker_cpu.Sender (the scaling, broker_cpu and SYNC_FLUSH w64
    benches' client): each frame is the bytes ``send_cmd`` encodes, its
    opaque, UNIQ_KEY and body put in; answers in their place are counted,
    and one at another queue offset than its send's stops the bench."""
    import socket
    from perf.broker import PROPS, body_of, send_cmd
    from perf.worker_cpu import Sender
    from shmq.ipc.remoting import JSON, decode_all, encode, send_ok_head

    a, b = socket.socketpair()
    a.settimeout(10)
    try:
        s = Sender(a, "BenchT", 4, keyed=keyed, qid=2, first=5, together=True)
        for i in (0, 1, 12345):
            props = PROPS if not keyed else f"{PROPS}\x02UNIQ_KEY\x01{os.getpid():08X}{i:024X}"
            cmd = send_cmd("BenchT", 2, body_of(2, 5 + i), props)
            cmd.opaque = Sender.OPAQUE0 + i
            want = encode(cmd)
            got = s.frame(i)
            assert got[:8] == want[:8] and _without_born(got) == _without_born(want)

        def answer(i, offset):
            b.sendall(send_ok_head(JSON, Sender.OPAQUE0 + i, "00" * 16, 2, offset))

        answer(0, 5)
        answer(1, 6)
        assert s.step(2) == 2 and s.issued == 4                 # the window: 4 in flight
        cmds = decode_all(b.recv(1 << 20))
        assert [c.opaque - Sender.OPAQUE0 for c in cmds] == [0, 1, 2, 3]
        assert [c.body for c in cmds] == [body_of(2, 5 + i) for i in range(4)]
        answer(2, 7)
        answer(3, 9)                                            # send 3 is at offset 8
        with pytest.raises(AssertionError, match="send 3: .*queueOffset 9"):
            s.step(2)
    finally:
        a.close()
        b.close()


def _without_born(frame: bytes) -> bytes:
    """A send frame less its bornTimestamp (the template's is its own)."""
    return re.sub(rb'"g":"\d+"', b'"g":""', frame[8:])
