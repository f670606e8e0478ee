"""Loading the numba kernels: one specialisation each, warmed by unit, then frozen.

What it owns: the list of warm-up *units* (a unit runs a few kernels once on
tiny inputs, so that they are compiled, or loaded from numba's cache, before
any request needs them), a probe that says which units the cache lacks, and
``freeze``, which ends compilation in a process. It never starts processes:
compiling cold units in parallel is the broker's job (``broker/kernels.py``).

The invariant: **each kernel has one canonical specialisation**. Numba
compiles a function anew for every combination of argument types it meets,
and a read-only array (a ``PROT_READ`` mapping, ``np.frombuffer`` of bytes)
is another type than a writable one. Before this module existed the
warm-ups covered some combinations and the request paths met others: the
first SEND_BATCH on a cold cache compiled ``encode_uniform`` for 1-5 s inside
a worker, and a client waiting 5 s timed out. Now:

- every array a kernel only reads is typed read-only in its unit (``readonly``
  makes a read-only view: no copy), every array it writes is writable, every
  integer is int64;
- after its units have run, a broker process calls ``freeze()``: numba then
  never compiles again in it and fits a later call to the specialisation it
  has (a writable array converts to the read-only type, an int32 to int64).
  A call no specialisation fits raises ``TypeError`` at once: a bug that the
  tests see, never a multi-second compile on a request path.

With the JIT off (``NUMBA_DISABLE_JIT=1``) the kernels are plain functions:
the units still run (and ``readonly`` inputs make any write to an input fail
loudly), ``cold_units`` and ``freeze`` do nothing.
"""
from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass

import numpy as np


BLAS_PROBE = "scipy.linalg.cython_blas"


def skip_blas_probe() -> None:
    """For shmq's own programs (the ``shmq`` command, the broker's fork
    server, the compilers), before their first kernel load: numba asks once
    per process, when its array-math registry first loads, whether a BLAS
    is there by importing ``scipy.linalg.cython_blas`` - which imports all of
    scipy.linalg where scipy is installed, 0.2-0.9 s of CPU at the start of
    every such process (the boss and the fork server on every broker
    start). shmq's kernels use no BLAS, so its programs load that registry
    here with the probe's module hidden, and numba finds none; the module
    is importable again afterwards. Never called where shmq is a library in
    someone else's process (a client's direct mode): their numba code may
    want its BLAS."""
    if "numba.np.arraymath" in sys.modules:
        return
    hidden = sys.modules.setdefault(BLAS_PROBE, None) is None
    try:
        import numba.np.arraymath  # noqa: F401  (numba's probe runs here, once)
    except ImportError:     # no numba (shmq without its broker extra): the caller says so
        pass
    finally:
        if hidden and sys.modules.get(BLAS_PROBE, 0) is None:
            del sys.modules[BLAS_PROBE]


def readonly(a: np.ndarray) -> np.ndarray:
    """``a`` as a read-only view (the kernels' canonical type for inputs)."""
    if not a.flags.writeable:
        return a
    v = a.view()
    v.flags.writeable = False
    return v


@dataclass(frozen=True)
class Unit:
    """A warm-up: ``run`` ("module:function") calls ``kernels`` (names in
    ``module_of_kernels``) once each with their canonical argument types.
    ``cost_s`` is its cold compile time measured here, for scheduling."""
    name: str
    run: str
    kernels: tuple[str, ...]
    module_of_kernels: str = "shmq.core._kernels"
    cost_s: float = 1.0

    def __call__(self) -> None:
        mod, fn = self.run.split(":")
        getattr(importlib.import_module(mod), fn)()

    def dispatchers(self) -> list:
        mod = importlib.import_module(self.module_of_kernels)
        return [getattr(mod, k) for k in self.kernels]


_R = "shmq.core.records"
UNITS = {u.name: u for u in (
    Unit("encode", f"{_R}:warm_up_encode", ("encode_uniform", "encode_batch", "tags_codes",
                                            "find_property", "java_hash_utf8"), cost_s=4.0),
    Unit("batch", f"{_R}:warm_up_batch", ("split_batch", "stamp_batch", "int_properties"),
         cost_s=1.5),
    Unit("scan", f"{_R}:warm_up_scan", ("scan_records", "last_nonzero", "uniq_hashes"),
         cost_s=2.5),
    Unit("queue", f"{_R}:warm_up_queue", ("cq_put_many", "cq_scan", "cq_valid_units",
                                          "min_phy_from", "cq_put_units", "cq_group_rows",
                                          "queues_due"),
         cost_s=1.5),
    Unit("index", "shmq.core.index:warm_up", ("index_records", "index_select", "index_check"),
         cost_s=5.0),
    Unit("timer", "shmq.core.timer:warm_up", ("_insert", "_read_list", "_release"),
         module_of_kernels="shmq.core.timer", cost_s=1.0),
    Unit("lane", "shmq.core.sends:warm_up", ("read_sends", "encode_sends", "place_answers",
                                             "send_ok_frames", "read_pulls"),
         cost_s=18.0),
    Unit("pull", f"{_R}:warm_up_pull", ("pull_rows",), cost_s=1.0),
    Unit("readers", f"{_R}:warm_up_readers", ("records_at", "arrow_columns", "property_spans",
                                              "gather_spans"), cost_s=4.0),
)}

# What each kind of process loads. The broker's processes share one list, so
# a cold start compiles it once (in parallel) and every process then loads it.
BROKER = ("encode", "batch", "scan", "queue", "index", "timer", "lane")
READERS = ("scan", "readers")


def _cached(dispatcher) -> bool:
    """Whether numba's cache holds code of ``dispatcher`` for this machine.

    Reads the cache index the way numba's ``IndexDataCacheFile`` does (it is
    not public API: if its shape changes, the answer is True, so the unit is
    loaded in-process - slower when cold, never wrong)."""
    cache = getattr(dispatcher, "_cache", None)
    index_file = getattr(cache, "_cache_file", None)
    if index_file is None:       # the JIT is off, or caching is
        return True
    try:
        entries = index_file._load_index()
        magic = dispatcher.targetctx.codegen().magic_tuple()
    except (AttributeError, OSError, ValueError, EOFError):
        return True
    return any(isinstance(key, tuple) and len(key) > 1 and key[1] == magic for key in entries)


def cold_units(names=BROKER) -> list[Unit]:
    """The units whose kernels the cache lacks, costliest first."""
    cold = [UNITS[n] for n in names if not all(_cached(d) for d in UNITS[n].dispatchers())]
    return sorted(cold, key=lambda u: -u.cost_s)


def load(names=BROKER) -> None:
    """Run ``names``'s units in this process (loads from the cache what is there)."""
    for n in names:
        UNITS[n]()


def freeze(names=BROKER) -> None:
    """No more compilation in this process for the kernels of ``names``
    (after ``load``): see the module's header."""
    for n in names:
        for d in UNITS[n].dispatchers():
            if hasattr(d, "disable_compile"):
                d.disable_compile()


def compile_counts(names=BROKER) -> dict[str, int]:
    """Kernel name → how many specialisations this process holds (tests:
    after ``load``, exactly one each)."""
    out = {}
    for n in names:
        u = UNITS[n]
        for k, d in zip(u.kernels, u.dispatchers()):
            out[k] = len(getattr(d, "signatures", [None]))
    return out
