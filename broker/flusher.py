"""The flush process: group commit, and the store's periodic duties.

One loop, in visible phases; it sleeps on its wake-up socket (slot 0) until
an appender asks for a flush or the next periodic duty is due:

    1. CommitLog   SYNC_FLUSH: whenever flush_request_pos > flushed_pos, flush
                   everything published so far (one fdatasync per segment
                   touched, however many sends wait: group commit), publish
                   flushed_pos, wake every process flagged WANT_FLUSH. The
                   workers lead the group commit of their own sync sends at
                   the end of each turn (broker/worker.py ``group_commit``)
                   and do not ask, nor does a direct producer with one
                   sync send waiting (client/direct.py ``FlushWaiter``):
                   the flusher's rounds are for direct producers with many
                   waiting, a round that failed elsewhere, and whatever is
                   left unflushed each flushIntervalCommitLog.
                   A round holds the flush lock (core/files.py
                   ``FlushLock``); one that finds it taken leaves the round
                   to its holder.
                   ASYNC_FLUSH: every flushIntervalCommitLog ms, if at least
                   flushCommitLogLeastPages pages are dirty or
                   flushCommitLogThoroughInterval ms have passed.
    2. ConsumeQueues and checkpoint, every flushIntervalConsumeQueue ms: the
       queues with flushConsumeQueueLeastPages dirty pages, and all of them
       every flushConsumeQueueThoroughInterval ms. The checkpoint's
       ConsumeQueue position advances at a thorough flush, and at any flush
       that left no queue with unflushed units (core/store.py's
       ``flush_consume_queues``), so a kill -9 rescans about a second of writes.
    3. Next segment: created (fallocate) by a helper thread once the current
       one is half full, so a roll never waits for it. ENOSPC there is a
       WARNING naming the file and the disk; it is tried again later.
    4. Disk, every DISK_CHECK_S: the used fraction of the disk under the
       store (statvfs); above diskSpaceWarningLevelRatio percent it publishes
       ``disk_full`` in the shared state, and sends are refused
       (SERVICE_NOT_AVAILABLE) until it falls back.
    5. Retention, every cleanResourceInterval ms (core/retention.py), with
       the groups' consumer offsets: the broker's live table when this store
       has one, and config/consumerOffset.json. An admin's
       deleteExpiredCommitLog (``delete_cl_seq`` moved) runs it at once and
       makes the next MANUAL_DELETE_PASSES passes ignore deleteWhen, as
       RocketMQ's executeDeleteFilesManually; cleanExpiredCQ
       (``clean_cq_seq`` moved) trims the ConsumeQueues at once.

SIGTERM: finish the loop, flush everything, write the checkpoint, exit 0.
The clock is injectable; ``step`` runs one pass, so tests drive it directly.
"""
from __future__ import annotations

import logging
import signal
import threading
import time

from shmq.core import jit
from shmq.core.retention import (CleanReport, ConsumerOffsets, clean_consume_queues, clean_expired,
                                 offsets_from_file, publish_disk_full)
from shmq.core.store import MessageStore
from shmq.ipc.control import WANT_FLUSH, ControlBlock, die_with_parent, set_process_name

from .logs import setup as setup_logs

PAGE_BYTES = 4096
PREPARE_RETRY_S = 10.0    # after a failed creation (ENOSPC), try again this much later
DISK_CHECK_S = 2.0        # seconds between disk use checks (RocketMQ: 10 s)
HELD_BACK_LOG_S = 300.0   # a WARNING that forced cleanup keeps unread messages, at most this often
MANUAL_DELETE_PASSES = 20  # DefaultMessageStore.MANUAL_DELETE_FILE_MAX_TIMES
LOCKED_OUT_RETRY_S = 0.001  # a pending request another process's flush round holds the lock for
log = logging.getLogger("shmq.flusher")


class Flusher:
    def __init__(self, store: MessageStore, cb: ControlBlock | None, clock=time.monotonic):
        self.store = store
        self.cb = cb
        self.cfg = store.config
        self.clock = clock
        now = clock()
        self.next_cl = now
        self.next_thorough = now + self.cfg.flushCommitLogThoroughInterval / 1000
        self.next_cq = now + self.cfg.flushIntervalConsumeQueue / 1000
        self.next_cq_thorough = now + self.cfg.flushConsumeQueueThoroughInterval / 1000
        self.next_clean = now + self.cfg.cleanResourceInterval / 1000
        self.next_disk = now
        self.disk_ratio: float | None = None
        self.flushes = 0
        self.locked_out = False       # the last round found the flush lock taken
        self.stopping = False
        self._preparing: threading.Thread | None = None
        self._prepared = -1
        self._prepare_failed_at: float | None = None
        self._held_back_logged = float("-inf")
        # the broker's live consumer offsets (broker/registry.py), where the
        # owner gave this store a registry; None: config/consumerOffset.json only
        self.live_offsets = None
        # called with each flush round's nanoseconds (broker/stats.py: FlushMeter),
        # and before the loop sleeps (its settle)
        self.on_flush = None
        self.on_idle = None
        # admins' requests (broker/handlers/admin.py): those seen, passes left
        self.delete_cl_seen = store.state.get("delete_cl_seq")
        self.clean_cq_seen = store.state.get("clean_cq_seq")
        self.manual_passes = 0

    def step(self) -> float:
        """One pass of the loop; returns the seconds until the next is due."""
        cfg, st, now = self.cfg, self.store.state, self.clock()
        if st.get("delete_cl_seq") != self.delete_cl_seen:
            self.delete_cl_seen = st.get("delete_cl_seq")
            self.manual_passes = MANUAL_DELETE_PASSES
            self.next_clean = now
        if st.get("clean_cq_seq") != self.clean_cq_seen:
            self.clean_cq_seen = st.get("clean_cq_seq")
            log.info("cleanExpiredCQ: deleted %d ConsumeQueue files", clean_consume_queues(self.store))
        fl = st.flushed_pos
        if cfg.sync_flush:
            requested = st.get("flush_request_pos") > fl
            if requested or now >= self.next_cl:    # (nothing to flush: look again an
                if requested or st.write_pos > fl:  # interval on; a request wakes it)
                    self.flush_commitlog()
                self.next_cl = now + cfg.flushIntervalCommitLog / 1000
        elif now >= self.next_cl:
            dirty = st.write_pos - fl
            if dirty >= cfg.flushCommitLogLeastPages * PAGE_BYTES or (dirty > 0 and now >= self.next_thorough):
                self.flush_commitlog()
                self.next_thorough = now + cfg.flushCommitLogThoroughInterval / 1000
            self.next_cl = now + cfg.flushIntervalCommitLog / 1000
        if now >= self.next_cq:
            thorough = now >= self.next_cq_thorough
            self.store.flush_consume_queues(thorough)
            self.store.write_checkpoint()
            self.next_cq = now + cfg.flushIntervalConsumeQueue / 1000
            if thorough:
                self.next_cq_thorough = now + cfg.flushConsumeQueueThoroughInterval / 1000
        self.prepare_next_segment()
        if now >= self.next_disk:
            self.check_disk()
            self.next_disk = now + DISK_CHECK_S
        if now >= self.next_clean:
            manual = self.manual_passes > 0
            self.manual_passes -= manual
            self.report_clean(clean_expired(self.store, manual=manual, disk_ratio=self.disk_ratio,
                                            consumer_offsets=self.consumer_offsets))
            self.next_clean = now + cfg.cleanResourceInterval / 1000
        if self.cb is not None:
            self.cb.heartbeat()
        return max(0.0, min(self.next_cl, self.next_cq, self.next_clean, self.next_disk)
                   - self.clock())

    def check_disk(self) -> None:
        """Measure the disk under the store; publish ``disk_full`` (read by
        every send) when it crosses diskSpaceWarningLevelRatio."""
        try:
            ratio = self.store.disk_usage_ratio()
        except OSError as e:
            log.warning("cannot measure the disk under %s: %s", self.store.root, e)
            return
        self.disk_ratio = ratio
        changed = publish_disk_full(self.store, ratio)
        if changed:
            log.warning("%s", changed)

    def consumer_offsets(self) -> ConsumerOffsets | None:
        """Each group's committed offsets: the lower of the live table's and
        the last saved file's (a group in either counts), so that nothing a
        group has not consumed passes for consumed."""
        saved = offsets_from_file(self.store)
        if saved is None or self.live_offsets is None:
            return saved
        try:
            live = self.live_offsets()
        except Exception as e:    # the table is the boss's; never let it stop retention
            log.warning("consumer offsets: live table unreadable (%s); using %s only", e,
                        "config/consumerOffset.json")
            return saved
        merged = {k: dict(v) for k, v in saved.items()}
        for key, groups in live.items():
            m = merged.setdefault(key, {})
            for g, off in groups.items():
                m[g] = min(off, m.get(g, off))
        return merged

    def report_clean(self, rep: CleanReport) -> None:
        if rep.segments_deleted:
            log.info("retention (%s): deleted %s, %d ConsumeQueue files", rep.reason,
                     rep.segments_deleted, rep.cq_files_deleted)
        for group, queues in sorted(rep.lost.items()):
            detail = ", ".join(f"{t}:{q} {n}" for (t, q), n in sorted(queues.items()))
            why = ("forced cleanup (cleanFileForciblyEnable=true)" if rep.forced
                   else "retention (fileReservedTime passed)")
            (log.error if rep.forced else log.warning)(
                "%s deleted %d messages group %s had not consumed (%s): %s", why,
                sum(queues.values()), group, rep.reason, detail)
        if rep.held_back:
            now = self.clock()
            if now - self._held_back_logged >= HELD_BACK_LOG_S:
                self._held_back_logged = now
                log.warning("retention (%s): kept %s although the disk is past "
                            "diskSpaceCleanForciblyRatio %d%%: they hold messages not yet "
                            "consumed by %s (cleanFileForciblyEnable=false); sends are refused "
                            "above diskSpaceWarningLevelRatio %d%%", rep.reason, rep.held_back,
                            self.cfg.diskSpaceCleanForciblyRatio, "; ".join(rep.held_for[:10])
                            + (f" and {len(rep.held_for) - 10} more" if len(rep.held_for) > 10
                               else ""), self.cfg.diskSpaceWarningLevelRatio)

    def flush_commitlog(self, block: bool = False) -> None:
        """A group commit round (``MessageStore.flush_commitlog``). Not
        ``block``ing: while another process holds the flush lock — a worker
        leading the group commit of its turn, in its fdatasync — this pass
        leaves the CommitLog to it (``locked_out``; the loop looks again
        within LOCKED_OUT_RETRY_S), so a worker stopped mid-round never
        stops the flusher's other duties."""
        st = self.store.state
        before = st.flushed_pos
        t0 = time.perf_counter_ns()
        target = self.store.flush_commitlog(block)
        self.locked_out = target < 0
        if target < 0:
            return
        # What sync sends wait on (flushed_pos >= their end): it may only grow,
        # and only to a published position (bytes below it are all written).
        after = st.flushed_pos
        assert before <= after <= st.write_pos, (
            f"group commit: flushed_pos went from {before} to {after} (write_pos "
            f"{st.write_pos}); it never goes backwards nor past what is published")
        if target > before:
            ns = time.perf_counter_ns() - t0
            self.flushes += 1
            if self.cb is not None:     # the sends waiting on it first, then the gauges
                self.cb.wake_flagged(WANT_FLUSH)
            if self.on_flush is not None:
                self.on_flush(ns)

    def prepare_next_segment(self) -> None:
        """Have the segment after the one being written exist before it is
        needed: from the moment the writers enter a segment (an append that
        rolls wakes the flusher), as RocketMQ's AllocateMappedFileService
        creates the file after the new one on every roll; not before the
        first append made the first one. Creation runs in
        a thread (its system calls release the GIL) so group commit never
        waits behind it; an append that rolls first creates it itself, a
        fallocate and two fsyncs on its path (~0.1 s here at 256 MiB)."""
        cl = self.store.cl
        wp = self.store.state.write_pos
        cur = cl.segment_start(wp)
        nxt = cur + cl.segment_bytes
        if nxt != self._prepared and not cl.files.exists(cl.path(cur)):
            # nothing written yet (a new store): the first append makes the
            # segment it writes in, and this the next one then. Made ahead
            # of an empty store, the next segment was the only file, and the
            # store restarted from there: its first message at 1 GiB
            return
        if (self._prepare_failed_at is not None and nxt == self._prepared
                and self.clock() - self._prepare_failed_at >= PREPARE_RETRY_S):
            self._prepared = -1          # try the failed one again
        if nxt == self._prepared or (self._preparing is not None and self._preparing.is_alive()):
            return
        path = cl.path(nxt)
        self._prepared = nxt
        self._prepare_failed_at = None
        if cl.files.exists(path):
            return
        self._preparing = threading.Thread(target=self._preallocate, args=(path, cl.segment_bytes),
                                           daemon=True, name="segment-prealloc")
        self._preparing.start()

    def _preallocate(self, path: str, size: int) -> None:
        """The prealloc thread: a failure (ENOSPC) is a WARNING, retried
        PREPARE_RETRY_S later; the append that rolls creates it itself."""
        try:
            self.store.cl.files.create_preallocated(path, size)
        except OSError as e:
            try:
                used = f"{self.store.disk_usage_ratio():.1%} used"
            except OSError:
                used = "use unknown"
            log.warning("cannot create the next CommitLog segment %s (%d bytes) on the disk "
                        "under %s (%s): %s; trying again in %.0f s", path, size, self.store.root,
                        used, e.strerror or e, PREPARE_RETRY_S)
            self._prepare_failed_at = self.clock()

    def run(self) -> None:
        while not self.stopping:
            timeout = self.step()
            if self.cfg.sync_flush:
                # group commit: never sleep past a pending request (one that
                # another process's round holds the lock for: a little)
                if self.store.state.get("flush_request_pos") > self.store.state.flushed_pos:
                    if not self.locked_out:
                        continue
                    timeout = min(timeout, LOCKED_OUT_RETRY_S)
            if self.on_idle is not None:
                self.on_idle()
            self.cb.wait(timeout)
        self.finish()

    def finish(self) -> None:
        """Flush everything and checkpoint (shutdown)."""
        if self._preparing is not None:
            self._preparing.join()
        self.flush_commitlog(block=True)
        if self.on_idle is not None:
            self.on_idle()
        self.store.flush_consume_queues()
        self.store.write_checkpoint()


def live_offsets(store: MessageStore, cb: ControlBlock):
    """A reader of the broker's live consumer offsets, if the owner gave this
    store a registry (the boss does; a bare StoreOwner does not), else None.
    The boss lays the registry out after the flusher starts: until it has,
    the reader returns an empty table."""
    from shmq.broker.registry import OFFSET_ROWS, Registry, registry_bytes
    from shmq.broker.shared_store import extra_region

    region = extra_region(cb, store)
    if len(region) < registry_bytes():
        return None
    reg: list[Registry] = []

    def read() -> ConsumerOffsets:
        if not reg:
            if int.from_bytes(region[:8], "little") != OFFSET_ROWS:
                return {}            # not laid out yet
            reg.append(Registry(region, store.root))
        out: dict[tuple[str, int], dict[str, int]] = {}
        for tg, queues in reg[0].offset_table().items():
            topic, _, group = tg.partition("@")
            for qid, off in queues.items():
                out.setdefault((topic, int(qid)), {})[group] = off
        return out
    return read


def flusher_main(config, owner_pid: int) -> None:
    """Entry point of the flush process (spawned by the store owner; it dies
    with the owner)."""
    from shmq.broker.shared_store import attach
    from shmq.broker.stats import FlushMeter

    die_with_parent(owner_pid)
    set_process_name("shmq-flusher")
    setup_logs("flusher")
    store, cb = attach(config, role="flusher")
    jit.freeze()                      # no compile on a request path (core/jit.py)
    f = Flusher(store, cb)
    f.live_offsets = live_offsets(store, cb)
    f.on_flush = meter = FlushMeter(store, cb)
    f.on_idle = meter.settle

    def on_term(signum, frame):
        f.stopping = True
        cb.wake(cb.slot)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        f.run()
    finally:
        cb.close()
