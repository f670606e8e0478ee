"""Shared fixtures: small stores (tiny segments so rolls happen) in temp dirs."""
from __future__ import annotations

import contextlib
import fcntl
import os

import pytest

from shmq.broker.kernels import compile_cold
from shmq.core.config import StoreConfig
from shmq.core.jit import BROKER, READERS, freeze, load

SMALL_SEGMENT = 64 * 1024
SMALL_CQ_UNITS = 100


def small_config(root: str, **kw) -> StoreConfig:
    base = dict(storePathRootDir=root, mappedFileSizeCommitLog=SMALL_SEGMENT,
                mappedFileSizeConsumeQueue=SMALL_CQ_UNITS * 20, maxMessageSize=8192,
                maxQueueSlots=16384)
    base.update(kw)
    return StoreConfig(**base)


@pytest.fixture(scope="session", autouse=True)
def _kernels_loaded(tmp_path_factory):
    """On a cold numba cache (a fresh clone's first run) every kernel a
    broker loads is compiled first, in parallel, as a broker's first start
    does (broker/kernels.py: a process per core, disjoint units); then this
    process loads them from the cache and freezes them, as every broker
    process does (core/jit.py): a test's call with a writable array then
    runs the canonical read-only specialisation instead of compiling one of
    its own (on a cold cache the index backfill test compiled for 28 s, the
    scrub's for 5). Before, this process compiled its four units alone (~14
    s in CI) and the first broker the other two (~11 s): 26 s, against 20 s
    so (2-core VM, load 2.7). The columnar readers' kernels (READERS: the
    Spark sources', the direct reads') join them: left unfrozen, this
    process compiled records_at, arrow_columns and the property spans
    alone, once for test_kernels' writable arrays and again for the Spark
    sources' mix (a read-only segment, writable rows) in test_spark's
    in-process tests (on a cold cache those two files' in-process tests
    compiled for 83 s here under a profiler, 12 s with them frozen; 154 ->
    133 s of CPU in all, load 6). The Spark workers, which freeze nothing,
    compile that mix themselves on a cold cache (~7 s, the two in parallel)."""
    units = BROKER + tuple(u for u in READERS if u not in BROKER)
    with _one_worker_at_a_time(tmp_path_factory, "numba-compile"):
        compile_cold(units)
        load(units)
    freeze(units)


@contextlib.contextmanager
def _one_worker_at_a_time(tmp_path_factory, name: str):
    """Under pytest-xdist every worker runs the session fixtures: on a cold
    numba cache both would compile every kernel at once, each with a
    compiler process per core (twice the CPU, each cache entry written
    twice). Holding this flock (in the temp root the workers of a run
    share), the first compiles and the others then find the cache warm and
    only load it (~1 s): numba writes each index and data file under a
    temporary name and renames it, so a reader never sees half of one.
    Without xdist there is no one to wait for."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    fd = os.open(tmp_path_factory.getbasetemp().parent / f"{name}.lock", os.O_RDWR | os.O_CREAT,
                 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)                      # and with it the lock


@pytest.fixture(scope="session", autouse=True)
def _logs_in_tmp(tmp_path_factory):
    """Every broker process a test starts (they inherit the environment)
    writes its log files here, never into ~/logs/shmqlogs; brokerproc's
    brokers write into their own test's directory instead."""
    mp = pytest.MonkeyPatch()
    mp.setenv("SHMQ_LOG_DIR", str(tmp_path_factory.mktemp("shmqlogs")))
    yield
    mp.undo()


_OWNERS: list = []      # every StoreOwner this process made, until its test ends


@pytest.fixture(scope="session", autouse=True)
def _owners_tracked():
    """Every StoreOwner this process makes is remembered, for
    ``_owners_released``."""
    from shmq.broker.shared_store import StoreOwner
    mp = pytest.MonkeyPatch()
    made = StoreOwner.__init__

    def init(self, *args, **kw):
        made(self, *args, **kw)
        _OWNERS.append(self)
    mp.setattr(StoreOwner, "__init__", init)
    yield
    mp.undo()


@pytest.fixture(autouse=True)
def _owners_released(_owners_tracked):
    """A store a test opened and left open (it failed before its close, or
    dropped its owner unclosed) gives back its shared memory, semaphore and
    lock file when the test ends: each is a name in /dev/shm (32 MiB of
    it) that outlives the test run otherwise. Stores opened before the test
    (a wider fixture's) are left alone, and one the test closed has
    nothing to give back."""
    n = len(_OWNERS)
    yield
    for o in _OWNERS[n:]:
        if o.cb is not None:
            o._release()
    del _OWNERS[n:]


@pytest.fixture
def store_dir(tmp_path):
    d = tmp_path / "store"
    d.mkdir()
    return str(d)


def stress_rounds(default: int) -> int:
    """How many rounds a stress test runs: SHMQ_STRESS_ROUNDS, or the bounded default."""
    return int(os.environ.get("SHMQ_STRESS_ROUNDS", default))


def keeps_every_page(directory) -> bool:
    """Whether the file system under ``directory`` keeps every page of a file
    in memory (tmpfs, ramfs): there, written and fsynced pages stay resident
    after POSIX_FADV_DONTNEED, so there is no page cache to leave as found."""
    from shmq.core.files import REAL_FILES
    path = os.path.join(str(directory), ".keeps-every-page")
    with open(path, "wb") as f:
        f.write(b"x" * (64 << 10))
        f.flush()
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    h = REAL_FILES.open(path, writable=False)
    try:
        return bool(REAL_FILES.cached(h, 0, h.size).all())
    finally:
        REAL_FILES.close(h)
        os.unlink(path)


# ------------------------------------------------------------ pytest-xdist
# `python -m pytest` runs the files in parallel (pyproject's addopts: -n auto
# --dist loadfile): the suite mostly waits (real clients' timers, delays,
# broker starts; load < 1.5 on 2 cores when run serially), so two files at a
# time take about half the time. A file runs whole in one worker (its module
# fixtures start one broker for all its tests). One file runs in this
# process, as without xdist; `-n 0` runs any selection so.
MAX_WORKERS = 4


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """How many workers `-n auto` starts: none for one file (loadfile would
    give it one worker anyway; here -s and --pdb work as usual), else one a
    core, at least 2 (the suite waits more than it computes) and at most
    MAX_WORKERS: every test file starts brokers of ~6 processes each (boss,
    workers, flusher, services, NameServer) and real clients with their own
    threads, a cold start's compile takes a process per core, and the
    longest files (1.5-2 minutes) bound the run anyway, so more workers
    would add contention, not speed."""
    files = {arg.split("::")[0] for arg in config.args}
    if len(files) == 1 and files.pop().endswith(".py"):
        return 0
    return max(2, min(MAX_WORKERS, len(os.sched_getaffinity(0))))   # the cores it may run on


# The slowest files first (their shares of the test time in two fresh-clone
# runs under xdist, 2026-11-26, 2-core VM: test_compat_clients and
# test_kernels ~10% each, test_spark 7%, the rest 5% or less): started
# first, they end in the middle of the run with the many short files around
# them, instead of one of them starting late and running alone at the end.
# xdist hands the files out in this order (--no-loadscope-reorder keeps it;
# its default orders by test count); the files not named follow in theirs.
SLOWEST_FIRST = (
    "test_compat_clients.py", "test_kernels.py", "test_spark.py", "test_boss.py",
    "test_control.py", "test_crash.py", "test_features.py", "test_direct.py",
    "test_broker_robust.py", "test_examples.py", "test_dedup.py", "test_faults.py", "test_ha.py",
    "test_cli.py", "test_bench.py", "test_inspect.py", "test_config_files.py", "test_claims.py",
    "test_admin.py", "test_jit.py",
)


def pytest_collection_modifyitems(config, items):
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return                                  # serial: the usual order
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))   # stable: a file's own order kept
