"""Real kill -9: writers, the flusher, or everything, at random moments.

Several writer processes append to one store through a supervising owner;
the test kills writers (the owner repairs a dead lock holder and they are
replaced) and the flusher (the owner restarts it), then kills every process
at once. After recovery every acknowledged message must be there, intact,
exactly once, with dense queue offsets but for padding units: the holes an
append leaves when its writer is killed mid-write while later appends (of
other writers) finish (``core/store.py``: claim, write, publish). Under SYNC_FLUSH an acknowledgement
means the bytes were on disk; under ASYNC_FLUSH it only means they were
published, which still survives a process crash (the page cache does), so
both modes demand everything acknowledged.

Rounds: SHMQ_STRESS_ROUNDS (20 for a full run). The bounded default is
one round per mode, each about nine kills at random moments: the
suite's 10-minute budget (two rounds cost ~10 s more in CI).
"""
from __future__ import annotations

import os
import random
import signal
import time

import pytest

import procs
from conftest import small_config, stress_rounds
from shmq.core import _kernels as K
from shmq.core.store import open_local
from shmq.ipc.control import unlink_names

CTX = procs.context()
WRITERS = 3
ROUND_SECONDS = 2.0


def kill(p_or_pid):
    pid = p_or_pid if isinstance(p_or_pid, int) else p_or_pid.pid
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def acked(ack_path):
    out = set()
    if os.path.exists(ack_path):
        for line in open(ack_path).read().splitlines():
            parts = line.split()
            if len(parts) == 2:
                out.update(range(int(parts[0]), int(parts[1]) + 1))
    return out


def one_round(root, flush, seed):
    rng = random.Random(seed)
    cfg = small_config(root, mappedFileSizeCommitLog=128 * 1024, flushDiskType=flush)
    ready, stop = CTX.Event(), CTX.Event()
    owner = CTX.Process(target=procs.crash_owner, args=(cfg, ready, stop))
    owner.start()
    assert ready.wait(60), "owner did not start"
    writers, next_wid = {}, 0

    def start_writer():
        nonlocal next_wid
        p = CTX.Process(target=procs.crash_writer,
                        args=(cfg, next_wid, os.path.join(root, f"ack.{next_wid}"), flush == "SYNC_FLUSH"))
        p.start()
        writers[next_wid] = p
        next_wid += 1

    for _ in range(WRITERS):
        start_writer()
    start_deadline = time.monotonic() + 120
    while not all(acked(os.path.join(root, f"ack.{w}")) for w in range(WRITERS)):
        assert time.monotonic() < start_deadline, "writers did not start"
        time.sleep(0.05)
    deadline = time.monotonic() + ROUND_SECONDS
    events = []
    while time.monotonic() < deadline:
        time.sleep(rng.uniform(0.05, 0.4))
        if rng.random() < 0.6:
            wid = rng.choice([w for w, p in writers.items() if p.is_alive()] or [None])
            if wid is not None:
                kill(writers[wid])
                events.append(f"kill writer {wid}")
                start_writer()
        else:
            pid = int(open(os.path.join(root, "flusher.pid")).read())
            kill(pid)
            events.append(f"kill flusher {pid}")
    everyone = [owner, *writers.values()]
    pid_file = os.path.join(root, "flusher.pid")
    rng.shuffle(everyone)
    for p in everyone:
        kill(p)
    kill(int(open(pid_file).read()))
    for p in everyone:
        p.join(30)
    events.append("kill all")
    return cfg, list(writers), events


@pytest.mark.parametrize("flush", ["SYNC_FLUSH", "ASYNC_FLUSH"])
def test_kill_9_loses_no_acknowledged_message(tmp_path, flush):
    for rnd in range(stress_rounds(1)):
        seed = random.randrange(1 << 30)
        root = str(tmp_path / f"round{rnd}")
        os.makedirs(root)
        cfg, wids, events = one_round(root, flush, seed)
        unlink_names(root)   # the killed owner's block: no broker reclaims it, the store goes
        ctx = f"seed {seed}, events {events}"
        store, report = open_local(cfg)
        assert report.mode == "abnormal" and report.offset_anomalies == 0, ctx
        seen = {}
        for topic in procs.CRASH_TOPICS:
            for qid in range(3):
                msgs = store.read_queue(topic, qid)   # decodes with CRC check
                offsets = [m.queue_offset for m in msgs]
                holes = sorted(set(range(store.max_offset(topic, qid))) - set(offsets))
                assert offsets == sorted(set(offsets)), ctx
                assert all(store.cqs.unit(topic, qid, h)[1] == K.CQ_PAD_SIZE for h in holes), ctx
                for m in msgs:
                    wid, seq, _ = m.body.split(b":", 2)
                    key = (int(wid), int(seq))
                    assert key not in seen, f"duplicate {key}; {ctx}"
                    seen[key] = m
        total_acked = 0
        for wid in wids:
            want = acked(os.path.join(root, f"ack.{wid}"))
            total_acked += len(want)
            missing = sorted(s for s in want if (wid, s) not in seen)
            assert not missing, f"writer {wid} lost acknowledged {missing[:10]}; {ctx}"
        assert total_acked > 0, ctx
        store.close()
