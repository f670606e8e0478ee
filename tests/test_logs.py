"""Log files (broker/logs.py) and a CommitLog outside the store root (storePathCommitLog).

One broker for the module, configured as an operator would: ``logLevel=DEBUG``
in broker.conf, its CommitLog on "another disk" (a directory outside
storePathRootDir). The rotation tests run plain processes that call the same
``setup`` every broker process calls, with a tiny size cap.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import defaultdict

import pytest

from brokerproc import BrokerProc, broker_conf, routed_topic

LINE = re.compile(r"^\S+ \S+ (w\d) (DEBUG|INFO|WARNING|ERROR) (\S+) (\w+) (\d+)$")
WRITER = """
import logging, sys
from shmq.broker.logs import setup
setup(sys.argv[1])
sys.stdin.readline()                  # all start writing together
store, broker = logging.getLogger("shmq.store"), logging.getLogger("shmq.broker")
for i in range(int(sys.argv[2])):
    store.info("line %d", i)
    store.debug("debug %d", i)
broker.info("info 0")
broker.warning("warning 0")
"""


def run_writers(log_dir, n_procs: int, lines: int, **env) -> None:
    env = {**os.environ, "SHMQ_LOG_DIR": str(log_dir), **{k: str(v) for k, v in env.items()}}
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, f"w{i}", str(lines)], env=env,
                              stdin=subprocess.PIPE, stderr=subprocess.DEVNULL)
             for i in range(n_procs)]
    for p in procs:
        p.stdin.write(b"go\n")
        p.stdin.close()
    for p in procs:
        assert p.wait(60) == 0


def read_lines(log_dir, name: str) -> dict[str, list[list[str]]]:
    """file name -> its lines, split (every line must be whole)."""
    out = {}
    for f in sorted(os.listdir(log_dir)):
        if f == name or f.startswith(name + "."):
            with open(os.path.join(log_dir, f)) as fh:
                text = fh.read()
            assert text.endswith("\n") or not text   # empty: made by the last rotation
            out[f] = [LINE.match(line).groups() for line in text.splitlines()]
    return out


def test_rotation_across_processes_keeps_index_files_and_each_writers_lines_gapless(tmp_path):
    cap, kept, procs, lines = 8192, 3, 4, 1500
    run_writers(tmp_path, procs, lines, SHMQ_LOG_FILE_MAX_SIZE=cap, SHMQ_LOG_FILE_MAX_INDEX=kept)
    files = read_lines(tmp_path, "store.log")
    assert sorted(files) == ["store.log", "store.log.1", "store.log.2", "store.log.3"]
    for f in files:
        assert os.path.getsize(tmp_path / f) < 2 * cap       # rotated soon after the cap
    # oldest file first: each writer's lines are in order and what is kept of
    # them runs without a gap to its last line (none lost at a rotation)
    seen = defaultdict(list)
    for f in ["store.log.3", "store.log.2", "store.log.1", "store.log"]:
        for role, level, logger, word, n in files[f]:
            # INFO only (the default level)
            assert (level, logger, word) == ("INFO", "shmq.store", "line")
            seen[role].append(int(n))
    assert seen
    for role, ns in seen.items():
        assert ns == list(range(ns[0], lines)), role
    assert sum(map(len, seen.values())) < procs * lines      # rotation did drop the oldest


def test_no_line_is_lost_or_torn_when_every_rotation_is_kept(tmp_path):
    procs, lines = 4, 1500
    run_writers(tmp_path, procs, lines, SHMQ_LOG_FILE_MAX_SIZE=8192, SHMQ_LOG_FILE_MAX_INDEX=1000,
                SHMQ_LOG_LEVEL="DEBUG")
    files = read_lines(tmp_path, "store.log")
    assert len(files) > 20                                   # it rotated, often
    got = sorted((role, word, int(n)) for rows in files.values() for role, _, _, word, n in rows)
    assert got == sorted((f"w{i}", word, n) for i in range(procs) for n in range(lines)
                         for word in ("line", "debug"))
    # the other area's lines went to its own file
    assert sorted(r[3] for r in read_lines(tmp_path, "broker.log")["broker.log"]) == \
        ["info"] * procs + ["warning"] * procs


def test_SHMQ_LOG_LEVEL_sets_the_level_and_a_bad_one_is_refused_naming_it(tmp_path):
    run_writers(tmp_path, 1, 1, SHMQ_LOG_LEVEL="warn")
    assert [r[3] for r in read_lines(tmp_path, "broker.log")["broker.log"]] == ["warning"]
    assert not os.path.exists(tmp_path / "store.log")        # no line at WARN: no file
    r = subprocess.run([sys.executable, "-m", "shmq.tools", "namesrv", "-p", "0"],
                       env={**os.environ, "SHMQ_LOG_LEVEL": "LOUD"}, capture_output=True,
                       text=True, timeout=60)
    assert (r.returncode, r.stderr.strip()) == (
        2, "shmq namesrv: logLevel='LOUD': must be one of TRACE, DEBUG, INFO, WARN, ERROR, OFF")


def test_old_store_spellings_are_read_and_bad_store_paths_are_refused_naming_the_keys(tmp_path):
    from shmq.broker.config import BrokerConfig
    c, unknown = BrokerConfig.from_strings({"mapedFileSizeCommitLog": str(16 << 20),
                                            "mapedFileSizeConsumeQueue": "6000",
                                            "storePathRootDir": str(tmp_path / "root"),
                                            "storePathIndex": str(tmp_path / "idx")})
    assert unknown == []
    assert (c.store.mappedFileSizeCommitLog, c.store.mappedFileSizeConsumeQueue) == (16 << 20, 6000)
    assert (c.store.commitlog_dir, c.store.index_dir) == (str(tmp_path / "root" / "commitlog"),
                                                          str(tmp_path / "idx"))
    for values, says in (
            ({"mapedFileSizeCommitLog": str(16 << 20), "mappedFileSizeCommitLog": str(32 << 20)},
             "mapedFileSizeCommitLog=16777216 and mappedFileSizeCommitLog=33554432: one setting"),
            ({"storePathCommitLog": "/a,/b"},
             "storePathCommitLog=/a,/b: one directory, not a list"),
            ({"storePathConsumeQueue": "/q", "storePathIndex": "/q"},
             "storePathCommitLog, storePathConsumeQueue and storePathIndex must be different")):
        with pytest.raises(ValueError, match=re.escape(says)):
            BrokerConfig.from_strings(values)


# ------------------------------------------------------------ one broker


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("logs")
    conf = broker_conf(tmp, logLevel="DEBUG",
                       storePathCommitLog=os.path.join(str(tmp), "disk2", "commitlog"))
    b = BrokerProc(tmp, conf).start()
    try:
        yield b
    finally:
        b.stop()
        b.kill9()


def send(b, topic: str, n: int) -> None:
    from shmq.client.remoting import RemotingClient
    from shmq.client.requests import send_message
    from shmq.ipc.codes import ResponseCode
    with RemotingClient(b.addr) as c:
        for i in range(n):
            r = c.invoke(send_message(topic, f"m{i}".encode(), queue_id=0))
            assert r.code == ResponseCode.SUCCESS, r.remark


def inspect(capsys, store: str) -> dict:
    """``shmq store inspect --json``, run in this process (test_inspect tests the command)."""
    from shmq.tools.cli import main
    code = main(["store", "inspect", store, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def test_the_commitlog_lands_in_storePathCommitLog_survives_a_restart_and_inspect_finds_it(broker, capsys):
    root, cl_dir = broker.conf["storePathRootDir"], broker.conf["storePathCommitLog"]
    topic = routed_topic(broker, "TopicDisk2", 1)
    send(broker, topic, 20)
    assert os.listdir(cl_dir) and not os.path.exists(os.path.join(root, "commitlog"))
    broker.stop()
    broker.start()
    send(broker, topic, 5)
    doc = inspect(capsys, root)
    assert doc["commitlog_dir"] == cl_dir and doc["live"]
    [q] = [q for q in doc["queues"] if q["topic"] == topic]
    assert q["max_offset"] == 25                               # the 20 before the restart kept
    assert all(os.path.dirname(s["file"]) in ("", cl_dir) for s in doc["segments"])


def test_log_files_hold_each_areas_lines_at_the_broker_conf_level(broker):
    from shmq.client.remoting import RemotingClient
    with RemotingClient(broker.addr):
        pass                                  # closed by its peer: a remoting DEBUG line
    remoting = os.path.join(broker.log_dir, "remoting.log")
    deadline = time.monotonic() + 30
    while not (os.path.exists(remoting) and "closed by peer" in read_text(remoting)):
        assert time.monotonic() < deadline, "no remoting DEBUG line"
        time.sleep(0.02)
    broker.stop()                             # for good: every line written
    logs = {f: read_text(os.path.join(broker.log_dir, f)) for f in os.listdir(broker.log_dir)}
    assert {"broker.log", "store.log", "remoting.log", "namesrv.log"} <= set(logs)
    assert re.search(r" boss INFO shmq\.boss loaded \d+ consumer offsets$", logs["broker.log"],
                     re.M)
    assert re.search(r" worker-\d INFO shmq\.worker serving", logs["broker.log"], re.M)
    assert re.search(r" boss INFO shmq\.store \w+ recovery: end \d+", logs["store.log"], re.M)
    assert re.search(r" worker-\d DEBUG shmq\.reactor connection \S+: closed by peer$",
                     logs["remoting.log"], re.M)
    assert " namesrv INFO shmq.broker.namesrv " in logs["namesrv.log"]
    assert not any(" shmq.store " in line for line in logs["broker.log"].splitlines())


def test_a_store_opened_without_its_storePathCommitLog_is_refused_naming_where_the_data_is(broker):
    from shmq.core.config import StoreConfig, StorePathMoved
    from shmq.core.store import open_local
    root = broker.conf["storePathRootDir"]
    broker.stop()                             # for good (the module's last test)
    with pytest.raises(StorePathMoved, match=re.escape(
            f"storePathCommitLog={root}/commitlog: this store's data is in "
            f"{broker.conf['storePathCommitLog']}")):
        open_local(StoreConfig(storePathRootDir=root, mappedFileSizeCommitLog=16 << 20,
                               maxMessageSize=1 << 20, maxQueueSlots=4096))


def read_text(path: str) -> str:
    with open(path) as f:
        return f.read()
