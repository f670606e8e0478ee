"""Abnormal recovery: how fast the whole CommitLog is validated and re-dispatched.

A store is written and shut down, then its checkpoint is removed and the
abort marker left, so recovery must scan every segment from the first
(magic, sizes, physical offset, body CRC of every record) and re-dispatch
every record against the ConsumeQueues. Limit: reading the same segment
files sequentially from the page cache. The kernel alone (scan and validate,
no dispatch) is reported beside it.
"""
from __future__ import annotations

import os
import time

import numpy as np

from perf.limits import sequential_read
from shmq.core.checkpoint import Checkpoint, abort_path
from shmq.core.config import StoreConfig
from shmq.core.files import REAL_FILES
from shmq.core.reader import scan_out, walk
from shmq.core.records import encode, properties_bytes, warm_up
from shmq.core.recovery import recover
from shmq.core.store import close_clean, open_local


def run(ctx, result):
    warm_up()   # no compile time in the figures, whatever ran before
    root = ctx.sub("recovery")
    target = (256 if ctx.quick else 2048) << 20
    cfg = StoreConfig(storePathRootDir=root, mappedFileSizeCommitLog=128 << 20, maxQueueSlots=1024)
    store, _ = open_local(cfg)
    bodies = [os.urandom(200) for _ in range(500)]
    n = 0
    while store.state.write_pos < target:
        store.append(encode("Rec", bodies, queue_ids=n // 500 % 8,
                            properties=properties_bytes(tags="R", keys="k")))
        n += 500
    end = store.state.write_pos
    close_clean(store)
    os.unlink(Checkpoint.path(root))
    REAL_FILES.touch(abort_path(root))
    rec = recover(cfg, REAL_FILES)
    rep = rec.report
    assert (rep.mode, rep.scan_from, rep.end, rep.records_scanned) == ("abnormal", 0, end, n), rep
    assert rep.units_rebuilt == 0 and rep.bytes_truncated == 0, rep
    paths = [os.path.join(root, "commitlog", f) for f in sorted(os.listdir(os.path.join(root, "commitlog")))]
    limit = sequential_read(paths)
    kernel = _kernel_scan_rate(paths, cfg.mappedFileSizeCommitLog)
    yield result("recovery_abnormal_scan", rep.bytes_scanned / rep.seconds / 1e9, "GB/s",
                 limit / 1e9, "sequential read, page cache (GB/s)", records=n,
                 bytes=rep.bytes_scanned, seconds=round(rep.seconds, 3),
                 kernel_scan_gbps=round(kernel / 1e9, 3))


def _kernel_scan_rate(paths, seg) -> float:
    import mmap
    out = scan_out(1 << 16)
    key = np.frombuffer(b"TAGS", np.uint8)
    total, t = 0, time.perf_counter()
    for i, p in enumerate(paths):
        with open(p, "rb") as f:
            buf = np.frombuffer(mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ), np.uint8)
        total += walk(buf, i * seg, 0, buf.shape[0], True, out, tags_key=key).pos
    return total / (time.perf_counter() - t)
