"""One store, many processes: the owner that opens it, and attaching to it.

``StoreOwner`` is the process that owns a store directory (the broker's boss):

    open   take <store>/lock, recover (with the caller's tags-code rules;
           log the report), create the control
           block, fill the StoreState from the recovery, create ``abort``,
           spawn the flusher
    supervise (call often)
           for each registered process that died: if it held the append lock,
           take the lock over, repair and release it; repair the claims it
           left unfinished or unpublished (``MessageStore.repair_after_death``:
           roll back, pad or publish); free its slot; restart the flusher if
           it was the flusher
    close  stop the flusher (it flushes and checkpoints), flush again,
           remove ``abort``, unlink the control block, release the lock

``attach`` is what every other process (worker, flusher, a test's writer)
calls: it maps the control block and returns a ``MessageStore`` whose
appends wake parked readers and, under SYNC_FLUSH, the flusher.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import time
from collections.abc import Mapping

import posix_ipc

from shmq.core.checkpoint import abort_path
from shmq.core.config import StoreConfig
from shmq.core.files import REAL_FILES, StoreLock
from shmq.core import dedup, jit
from shmq.core.retention import publish_disk_full
from shmq.core.records import warm_up
from shmq.core.recovery import RecoveryReport, TagsCodeRule, recover
from shmq.core.state import STATE_RUNNING, STATE_STOPPING, StoreState, state_bytes
from shmq.core.store import MessageStore, flush_all, init_state
from shmq.ipc.control import (LOCK_GRACE_S, FLUSHER_SLOT, ROLE_FLUSHER, ROLE_OTHER, ROLE_OWNER, ROLE_WORKER,
                              WANT_FLUSH, WANT_PUBLISH, ControlBlock, NotRunning, pid_alive)

log = logging.getLogger("shmq.store")

_ROLES = {"flusher": ROLE_FLUSHER, "worker": ROLE_WORKER, "owner": ROLE_OWNER, "other": ROLE_OTHER}
FLUSHER_STOP_TIMEOUT_S = 30


def _store(config: StoreConfig, cb: ControlBlock, opening: bool = False) -> MessageStore:
    state = StoreState.over(cb.region(), cb.lock)
    root = config.storePathRootDir
    if state is None or (not opening and state.get("state") != STATE_RUNNING):
        raise NotRunning(f"store {root} is still being opened by its owner; try again")
    if (state.queue_slots, state.get("segment_bytes")) != (config.maxQueueSlots,
                                                           config.mappedFileSizeCommitLog):
        raise ValueError(f"store {root} runs with maxQueueSlots={state.queue_slots} and "
                         f"mappedFileSizeCommitLog={state.get('segment_bytes')}; this process was "
                         f"given {config.maxQueueSlots} and {config.mappedFileSizeCommitLog}")
    return MessageStore(config, state,
                        on_published=lambda queues: cb.wake_flagged(WANT_PUBLISH, queues),
                        on_flush_request=lambda: cb.wake(FLUSHER_SLOT))


def attach(config: StoreConfig, role: str = "worker") -> tuple[MessageStore, ControlBlock]:
    """Attach this process to a running store. Loads the broker's kernels
    first (``core/jit.py``; a broker process then freezes them)."""
    jit.load(jit.BROKER)
    cb = ControlBlock.attach(config.storePathRootDir)
    try:
        cb.register(_ROLES[role], slot=FLUSHER_SLOT if role == "flusher" else None)
        return _store(config, cb), cb
    except BaseException:
        cb.close()
        raise


def extra_region(cb: ControlBlock, store: MessageStore) -> memoryview:
    """The shared memory an owner asked for beyond the store's state
    (``StoreOwner(extra_bytes=...)``): the broker's registries."""
    return cb.region()[store.state.nbytes:]


def wait_flushed(store: MessageStore, cb: ControlBlock, end: int, wait=None,
                 clock=time.monotonic) -> bool:
    """Block a SYNC_FLUSH send until its bytes are durable; False on
    syncFlushTimeout (the caller answers FLUSH_DISK_TIMEOUT). ``wait`` and
    ``clock`` default to the control block's wake-up and the monotonic
    clock (tests give a fake pair)."""
    if store.state.flushed_pos >= end:
        return True
    cb.set_flag(WANT_FLUSH, True)
    try:
        return store.wait_flushed(end, store.config.syncFlushTimeout, wait or cb.wait, clock)
    finally:
        cb.set_flag(WANT_FLUSH, False)


class StoreOwner:
    def __init__(self, config: StoreConfig, extra_bytes: int = 0,
                 tags_code_rules: Mapping[str, TagsCodeRule] | None = None, mp_context=None,
                 dedup_window: int = 0):
        self.config = config
        # the duplicate-send window's length (core.dedup; the broker's
        # sendDedupWindowSize), 0: none
        self.dedup_window = dedup_window
        self.extra_bytes = extra_bytes   # shared memory for the caller, after the state
        self.tags_code_rules = tags_code_rules   # for recovery (core.recovery.recover)
        self.root = config.storePathRootDir
        self.lockfile: StoreLock | None = None
        self.cb: ControlBlock | None = None
        self.store: MessageStore | None = None
        self.flusher: multiprocessing.Process | None = None
        self.report: RecoveryReport | None = None
        self.repairs: list[str] = []
        self._ctx = mp_context or multiprocessing.get_context("spawn")   # the flusher's

    def open(self) -> RecoveryReport:
        cfg = self.config
        self.lockfile = REAL_FILES.lock_store(self.root)
        try:
            warm_up()
            if ControlBlock.retire_stale(self.root):
                log.warning("retired the control block of a previous owner of %s", self.root)
            rec = recover(cfg, REAL_FILES, self.tags_code_rules)
            self.report = rec.report
            log.info("%s", rec.report.summary())
            self.cb = ControlBlock.create(self.root,
                                          state_bytes(cfg.maxQueueSlots, self.dedup_window)
                                          + self.extra_bytes, cfg.maxProcessSlots)
            state = StoreState(self.cb.region(), self.cb.lock, cfg.maxQueueSlots,
                               dedup_entries=self.dedup_window)
            state.initialize(cfg.mappedFileSizeCommitLog)
            self.cb.register(ROLE_OWNER)
            init_state(state, rec)
            self.store = _store(cfg, self.cb, opening=True)
            if self.dedup_window:
                t0 = time.monotonic()
                if dedup.restore(self.store, self.root, rec.write_pos, clean=rec.report.mode == "normal"):
                    log.info("duplicate-send window: taken back as the clean stop left it "
                             "in %.3f s", time.monotonic() - t0)
                else:
                    made = dedup.rebuild(self.store)
                    log.info("duplicate-send window: %d of %d entries refilled from the store "
                             "in %.3f s", made, self.dedup_window, time.monotonic() - t0)
            self.store.files.touch(abort_path(self.root))
            self._measure_disk()
            self.start_flusher()
        except BaseException:
            self._release()
            raise
        return rec.report

    def _measure_disk(self) -> None:
        """Publish ``disk_full`` once before any writer attaches; the flusher
        keeps it current from then on (a full disk refuses the first send too)."""
        try:
            ratio = self.store.disk_usage_ratio()
        except OSError as e:
            log.warning("cannot measure the disk under %s: %s", self.root, e)
            return
        changed = publish_disk_full(self.store, ratio)
        if changed:
            log.warning("%s", changed)

    def start_flusher(self) -> None:
        from shmq.broker.flusher import flusher_main
        p = self._ctx.Process(target=flusher_main, args=(self.config, os.getpid()),
                              name="shmq-flusher", daemon=False)
        p.start()
        self.flusher = p

    def supervise(self, restart_flusher: bool = True) -> list[str]:
        """Handle every registered process that died; returns what was done."""
        done = []
        cb = self.cb
        store = self.store
        holder = cb.dead_lock_holder()   # also one that died before it had a slot
        if holder:
            what = self._repair(lock_held=True)
            done.append(f"pid {holder} died holding the append lock: {what}")
        dead = cb.dead_processes()
        for slot, pid in dead:   # lock holders first: the repair below takes the lock
            if cb.died_holding_lock(slot, pid):
                what = self._repair(lock_held=True)
                done.append(f"pid {pid} died holding the append lock: {what}")
        if dead or store.repair_pending:
            # appends the dead left claimed but unfinished, or finished but unpublished
            what = self._repair(lock_held=False)
            if what != "none":
                who = ", ".join(str(pid) for _, pid in dead) or "earlier"
                done.append(f"appends of dead processes ({who}): {what}")
        for slot, pid in dead:
            cb.clear_slot(slot)
            done.append(f"pid {pid} (slot {slot}) is gone")
        if restart_flusher and self.flusher is not None and not self.flusher.is_alive():
            self.flusher.join()
            done.append(f"flusher pid {self.flusher.pid} exited ({self.flusher.exitcode}): restarted")
            self.start_flusher()
        for d in done:
            log.warning("%s", d)
        self.repairs.extend(done)
        return done

    def _repair(self, lock_held: bool) -> str:
        """``repair_after_death``; with ``lock_held`` (taken over from a dead
        holder) the lock is released after it. A repair the disk refuses
        (ENOSPC, EIO) is an ERROR and is tried again at the next supervise:
        until then the dead claim holds back the appends after it, whose
        senders see errors, and nothing acknowledged is lost."""
        if lock_held and self.cb.sem.value != 0:
            # the dead process was taken to hold the lock, but it is free: the
            # repair takes it like any appender (see release_dead_lock)
            log.error("lock repair: the append lock a dead process was taken to hold is free "
                      "(recorded holder %d): repairing under the lock taken anew",
                      int(self.cb.hdr_lock_owner[0]))
            lock_held = False
        try:
            return self.store.repair_after_death(lock_held=lock_held)
        except OSError as e:
            self.store.repair_pending = True
            log.error("repairing the appends of a dead process failed (%s): tried again at the "
                      "next supervise", e)
            return f"repair failed ({e})"
        finally:
            if lock_held:
                self.cb.release_dead_lock()

    def wait_flusher_ready(self, timeout_s: float = 60) -> None:
        """Until the flusher has registered in its slot (tests, benchmarks)."""
        deadline = time.monotonic() + timeout_s
        while int(self.cb.procs["pid"][FLUSHER_SLOT]) != self.flusher.pid:
            if not self.flusher.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"flusher did not start (exit code {self.flusher.exitcode})")
            time.sleep(0.01)

    def close(self) -> None:
        """Clean shutdown: everything flushed and checkpointed, abort removed.
        New claims are refused first (``StoreStopping``): the workers are
        gone by now, but a client appending directly (client/direct.py) may
        not be, and what it claims after the last flush would not be in it.
        A stop whose flush fails (ENOSPC, EIO) raises and leaves ``abort``
        (the next start recovers), but still gives back the shared memory,
        its names and the lock: this process is on its way out, and nothing
        else would unlink them before the store's next start."""
        try:
            if self.store is not None:
                self.store.state.set("state", STATE_STOPPING)
            if self.flusher is not None and self.flusher.is_alive():
                self.flusher.terminate()
                self.flusher.join(FLUSHER_STOP_TIMEOUT_S)
                if self.flusher.is_alive():
                    self.flusher.kill()
                    self.flusher.join()
            if self.store is not None:
                self.supervise(restart_flusher=False)
                self._take_back_lock()
                flush_all(self.store)
                dedup.save(self.store, self.root)     # before the abort file goes: a clean stop's
                self.store.files.unlink(abort_path(self.root))
        finally:
            self._release()

    def _take_back_lock(self, wait_s: float = 10.0) -> None:
        """Never hang at shutdown on an append lock a dead process left that
        supervise did not recognise as held (it can miss one that died
        between taking and recording the lock under heavy load): if the lock
        stays taken with no live holder, repair and release it."""
        cb = self.cb
        deadline = time.monotonic() + wait_s
        while True:
            try:
                cb.sem.acquire(0.5)
                cb.sem.release()
                return
            except posix_ipc.BusyError:
                holder = int(cb.hdr_lock_owner[0])
                live = holder and pid_alive(holder, int(cb.hdr_lock_owner_start[0]))
                if not live and time.monotonic() > deadline - wait_s + 2 * LOCK_GRACE_S:
                    what = self._repair(lock_held=True)
                    log.warning("append lock left taken by a dead process: %s, released", what)
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the append lock is held by live pid {holder}; "
                                       f"cannot flush at shutdown")

    def _release(self) -> None:
        if self.store is not None:
            self.store.close()
            self.store = None
        if self.cb is not None:
            self.cb.unlink()
            self.cb.close()
            self.cb = None
        if self.lockfile is not None:
            self.lockfile.release()
            self.lockfile = None

    def __enter__(self) -> "StoreOwner":
        self.open()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

