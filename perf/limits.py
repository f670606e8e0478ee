"""Hardware limits, measured in the same run as the benchmarks they bound.

Every benchmark prints its figure next to one of these: what the machine can
do at best for the same work, with no shmq in the way.

- memcpy into an mmap'd file: copying bytes into page-cache pages of a
  preallocated file (what an append must do at least once per byte);
- fdatasync rate: overwrite 4 KiB of a preallocated file, then fdatasync
  (one group commit can cost no less);
- sequential write: 1 MiB pwrites into a preallocated file with an fdatasync
  every 500 ms (what an async-flushed store sustains at best: once the page
  cache stops absorbing the burst, the disk is the limit);
- sequential read: reading files that are in the page cache into a buffer.
"""
from __future__ import annotations

import mmap
import os
import threading
import time

import numpy as np

from shmq.core.files import REAL_FILES

CHUNK = 1 << 20


def memcpy_into_mmap(scratch: str, nbytes: int, rounds: int = 3) -> float:
    """Best bytes/s of copying ``nbytes`` into a mapped, preallocated file."""
    path = os.path.join(scratch, "limit-memcpy")
    REAL_FILES.create_preallocated(path, nbytes)
    src = np.random.default_rng(1).integers(0, 255, CHUNK, dtype=np.uint8)
    fd = os.open(path, os.O_RDWR)
    try:
        mm = mmap.mmap(fd, nbytes)
        dst = np.frombuffer(mm, np.uint8)
        best = 0.0
        for _ in range(rounds):
            t = time.perf_counter()
            for off in range(0, nbytes, CHUNK):
                dst[off:off + CHUNK] = src
            best = max(best, nbytes / (time.perf_counter() - t))
        assert dst[nbytes - CHUNK:].tobytes() == src.tobytes()
        del dst
        mm.close()
    finally:
        os.close(fd)
        os.unlink(path)
    return best


def fdatasync_rate(scratch: str, seconds: float) -> tuple[float, float]:
    """(syncs/s, p50 µs) for 4 KiB overwrites of a preallocated file."""
    path = os.path.join(scratch, "limit-fdatasync")
    REAL_FILES.create_preallocated(path, 1 << 20)
    fd = os.open(path, os.O_RDWR)
    page = os.urandom(4096)
    lat = []
    try:
        end = time.perf_counter() + seconds
        i = 0
        while time.perf_counter() < end:
            t = time.perf_counter()
            os.pwrite(fd, page, (i % 256) * 4096)
            os.fdatasync(fd)
            lat.append(time.perf_counter() - t)
            i += 1
    finally:
        os.close(fd)
        os.unlink(path)
    return len(lat) / sum(lat), float(np.median(lat)) * 1e6


def sequential_read(paths: list[str]) -> float:
    """Best bytes/s of reading the files (page cache) into one buffer, twice."""
    buf = bytearray(4 * CHUNK)
    best = 0.0
    for _ in range(2):
        total = 0
        t = time.perf_counter()
        for p in paths:
            with open(p, "rb", buffering=0) as f:
                while n := f.readinto(buf):
                    total += n
        best = max(best, total / (time.perf_counter() - t))
    return best


def sequential_write(scratch: str, nbytes: int, flush_interval_s: float = 0.5) -> float:
    """Bytes/s of writing ``nbytes`` in 1 MiB pwrites to a preallocated file
    while another thread fdatasyncs it every ``flush_interval_s``."""
    path = os.path.join(scratch, "limit-seqwrite")
    REAL_FILES.create_preallocated(path, nbytes)
    fd = os.open(path, os.O_RDWR)
    chunk = os.urandom(CHUNK)
    done = threading.Event()

    def flusher():
        while not done.wait(flush_interval_s):
            os.fdatasync(fd)

    th = threading.Thread(target=flusher)
    try:
        th.start()
        t = time.perf_counter()
        for off in range(0, nbytes - CHUNK + 1, CHUNK):
            os.pwrite(fd, chunk, off)
        rate = nbytes / (time.perf_counter() - t)
    finally:
        done.set()
        th.join()
        os.close(fd)
        os.unlink(path)
    return rate
