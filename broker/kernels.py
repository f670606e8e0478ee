"""A cold start's kernel compilation: in parallel, with progress, stoppable.

The broker's processes all load one list of kernels (``core.jit.BROKER``).
Loaded from numba's cache that takes ~0.3 s a process; compiled, ~25 s of
CPU. Before this module the boss compiled on its own, then every child it
spawned found the cache half-written and compiled the rest again beside it:
39-71 s of silence on a busy 2-core machine, deaf to Ctrl-C.

Now the boss asks ``core.jit.cold_units`` what the cache lacks and, if
anything, compiles it *before* starting any other process: in up to one
spawned ``shmq-compile`` process per core, each taking the costliest unit
left (units are disjoint, so no kernel compiles twice and no two processes
write one cache entry). The boss stays in its own loop: it logs each unit as
it finishes, and a signal ends the compilers at once. Then every process
loads the cache and freezes its kernels (``core.jit.freeze``).
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import time
from collections.abc import Callable

from shmq.core import jit

log = logging.getLogger("shmq.kernels")
POLL_S = 0.05


class Interrupted(Exception):
    """A signal arrived while the kernels were compiling."""


def _init(boss_pid: int) -> None:
    from shmq.ipc.control import die_with_parent, set_process_name
    die_with_parent(boss_pid)
    set_process_name("shmq-compile")
    jit.skip_blas_probe()
    signal.signal(signal.SIGINT, signal.SIG_IGN)     # Ctrl-C reaches the boss, which ends us


def _compile(name: str) -> tuple[str, float]:
    t0 = time.monotonic()
    jit.UNITS[name]()
    return name, time.monotonic() - t0


def compile_cold(names=jit.BROKER, jobs: int | None = None,
                 should_stop: Callable[[], bool] = lambda: False) -> int:
    """Compile the units of ``names`` the cache lacks, in parallel, logging
    progress; returns how many it compiled. Raises ``Interrupted`` (the
    compilers killed) as soon as ``should_stop()`` turns true."""
    cold = jit.cold_units(names)
    if not cold:
        return 0
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(cold)))
    total_s = sum(u.cost_s for u in cold)
    log.info("first start: compiling %d groups of kernels (%s) in %d processes, about %.0f s "
                "of CPU; cached for later starts", len(cold), ", ".join(u.name for u in cold),
                jobs, total_s)
    t0 = time.monotonic()
    pool = multiprocessing.get_context("spawn").Pool(jobs, _init, (os.getpid(),))
    try:
        pending = [pool.apply_async(_compile, (u.name,)) for u in cold]   # costliest first
        done = 0
        while pending:
            if should_stop():
                raise Interrupted("stopped while compiling kernels")
            still = []
            for r in pending:
                if r.ready():
                    name, took = r.get()      # a compile error is a bug: it propagates
                    done += 1
                    log.info("compiled %s (%.1f s): %d/%d, %.0f s so far", name, took, done,
                                len(cold), time.monotonic() - t0)
                else:
                    still.append(r)
            pending = still
            if pending:
                time.sleep(POLL_S)
        pool.close()
        return done
    finally:
        pool.terminate()
        pool.join()
