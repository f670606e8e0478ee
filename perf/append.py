"""Append throughput, by topology: 1 or 2 appending processes, 8 or 10,000 queues.

Each appender encodes a batch (records with CRCs, outside the lock) and
appends it to the shared store a real broker runs (owner, control block,
async flusher): the whole path a batched send takes after the socket.
Limit: memcpy into an mmap'd file, in records of the same size per second.
Several processes are forked from the harness (already holding the loaded
kernels) so that start-up is not measured.
"""
from __future__ import annotations

import multiprocessing
import time

from shmq.broker.shared_store import StoreOwner, attach
from shmq.core.config import StoreConfig
from shmq.core.records import encode, properties_bytes

FORK = multiprocessing.get_context("fork")


def config(root: str, quick: bool, **kw) -> StoreConfig:
    return StoreConfig(storePathRootDir=root, mappedFileSizeCommitLog=(256 if quick else 1024) << 20,
                       maxQueueSlots=16384, **kw)


def _loop(store, topic, qid, bodies, props, batches):
    t0 = time.monotonic()
    for _ in range(batches):
        store.append(encode(topic, bodies, queue_ids=qid, properties=props))
    return t0, time.monotonic()


def _child(cfg, topic, qid, bodies, props, batches, go, conn):
    store, cb = attach(cfg)
    store.append(encode(topic, bodies[:1], queue_ids=qid, properties=props))   # warm
    conn.send("ready")
    go.wait()
    conn.send(_loop(store, topic, qid, bodies, props, batches))
    cb.close()


def measure_append(ctx, body_bytes: int, procs: int) -> tuple[float, int, int]:
    """(messages/s, record bytes, messages) of ``procs`` processes appending
    batches of ``body_bytes`` messages, each to its own queue."""
    batch = 1000 if body_bytes <= 128 else 256
    total = {True: 1_000_000, False: 8_000_000}[ctx.quick] * 100 // max(100, body_bytes)
    batches = max(1, total // (batch * procs))
    bodies = [bytes([65 + i % 26]) * body_bytes for i in range(batch)]
    props = properties_bytes(tags="TagA", keys="order-1")
    cfg = config(ctx.sub(f"append{body_bytes}x{procs}"), ctx.quick)
    with StoreOwner(cfg) as owner:
        owner.wait_flusher_ready()
        if procs == 1:
            owner.store.append(encode("Bench", bodies[:1], properties=props))    # warm
            spans = [_loop(owner.store, "Bench", 0, bodies, props, batches)]
        else:
            go = FORK.Event()
            pipes, kids = [], []
            for q in range(procs):
                a, b = FORK.Pipe()
                p = FORK.Process(target=_child, args=(cfg, "Bench", q, bodies, props, batches, go, b))
                p.start()
                pipes.append(a)
                kids.append(p)
            for a in pipes:
                assert a.recv() == "ready"
            go.set()
            spans = [a.recv() for a in pipes]
            for p in kids:
                p.join()
                assert p.exitcode == 0
        for q in range(procs):   # verify: every message is there, in order, readable
            assert owner.store.max_offset("Bench", q) == 1 + batches * batch
            last = owner.store.get_message("Bench", q, batches * batch, 1)
            assert owner.store.read_message(int(last.phys[0])).body == bodies[-1]
    n = procs * batches * batch
    rec = int(encode("Bench", bodies[:1], properties=props).sizes[0])
    return n / (max(s[1] for s in spans) - min(s[0] for s in spans)), rec, n


def run_append(ctx, result):
    """Limit: the lower of memcpy into a mapped file and the disk's sustained
    write rate for the same number of bytes (the page cache absorbs a short
    run; a long one runs at the disk's pace once the flusher writes back)."""
    for body, procs in ((100, 1), (1024, 1), (100, 2), (1024, 2)):
        rate, rec, n = measure_append(ctx, body, procs)
        memcpy = ctx.memcpy_bps() / rec
        disk = ctx.disk_write_bps(-(-n * rec // (1 << 20)) << 20) / rec
        limit, name = min((memcpy, "memcpy into mmap'd file (records/s)"),
                          (disk, "sequential disk write, same bytes, fdatasync every 500 ms (records/s)"))
        yield result(f"append_{'100B' if body == 100 else '1KiB'}_{procs}proc", rate, "msg/s",
                     limit, name, messages=n, record_bytes=rec,
                     batch=1000 if body == 100 else 256, memcpy_limit=round(memcpy),
                     disk_limit=round(disk), target=2_000_000 if (body, procs) == (100, 1) else None)


def measure_queues(ctx, nq: int) -> float:
    batch = 16
    total = 400_000 if ctx.quick else 2_000_000
    rounds = total // batch
    bodies = [b"q" * 100] * batch
    props = properties_bytes(tags="T")
    cfg = config(ctx.sub(f"queues{nq}"), ctx.quick)
    with StoreOwner(cfg) as owner:
        owner.wait_flusher_ready()
        store = owner.store
        for q in range(nq):                  # create every queue's files first
            store.append(encode("Many", bodies[:1], queue_ids=q, properties=props))
        t0 = time.monotonic()
        for i in range(rounds):
            store.append(encode("Many", bodies, queue_ids=i % nq, properties=props))
        dt = time.monotonic() - t0
        got = sum(store.max_offset("Many", q) for q in range(nq))
        assert got == nq + rounds * batch, (got, nq + rounds * batch)
    return rounds * batch / dt


def run_queues(ctx, result):
    few = measure_queues(ctx, 8)
    many = measure_queues(ctx, 10_000)
    yield result("append_100B_10000queues", many, "msg/s", few, "same run with 8 queues",
                 batch=16, target_ratio=0.9)
