"""SYNC_FLUSH: throughput and messages per fdatasync as producers grow 1 → 16.

Each producer is a process that appends one 100-byte message and waits for
the flusher to make it durable before the next (a synchronous send). With
more producers, more sends wait on the same fdatasync: group commit. Limit:
the raw fdatasync rate (4 KiB overwrite of a preallocated file), i.e. what
one message per sync could reach at best.
"""
from __future__ import annotations

import multiprocessing
import time

from perf.append import config
from shmq.broker.shared_store import StoreOwner, attach, wait_flushed
from shmq.core.records import encode, properties_bytes

FORK = multiprocessing.get_context("fork")


def _producer(cfg, qid, conn):
    store, cb = attach(cfg)
    props = properties_bytes(tags="S")
    body = b"s" * 100
    conn.send("ready")
    while (seconds := conn.recv()) is not None:
        acked = timeouts = 0
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            r = store.append(encode("Sync", [body], queue_ids=qid, properties=props))
            if wait_flushed(store, cb, r.end):
                acked += 1
            else:
                timeouts += 1
        conn.send((acked, timeouts))
    cb.close()


def run(ctx, result):
    steps = [1, 4, 16] if ctx.quick else [1, 2, 4, 8, 16]
    seconds = 1.0 if ctx.quick else 3.0
    fsync_rate, fsync_p50 = ctx.fdatasync()
    cfg = config(ctx.sub("sync"), ctx.quick, flushDiskType="SYNC_FLUSH")
    with StoreOwner(cfg) as owner:
        owner.wait_flusher_ready()
        pipes, kids = [], []
        for q in range(max(steps)):
            a, b = FORK.Pipe()
            p = FORK.Process(target=_producer, args=(cfg, q, b))
            p.start()
            pipes.append(a)
            kids.append(p)
        for a in pipes:
            assert a.recv() == "ready"
        st = owner.store.state
        acked_by = [0] * len(pipes)
        try:
            for k in steps:
                f0 = st.get("flush_seq")
                for a in pipes[:k]:
                    a.send(seconds)
                got = [a.recv() for a in pipes[:k]]
                flushes = st.get("flush_seq") - f0
                acked = sum(g[0] for g in got)
                for i, g in enumerate(got):
                    acked_by[i] += g[0] + g[1]
                yield result(f"sync_flush_{k}producers", acked / seconds, "msg/s", fsync_rate,
                             "raw fdatasync/s (4 KiB overwrite)", producers=k,
                             msgs_per_fdatasync=round(acked / max(1, flushes), 2),
                             timeouts=sum(g[1] for g in got), fdatasync_p50_us=round(fsync_p50, 1))
        finally:
            for a in pipes:
                a.send(None)
            for p in kids:
                p.join()
        for q, n in enumerate(acked_by):   # verify: every send is in its queue
            assert owner.store.max_offset("Sync", q) == n, (q, n)
