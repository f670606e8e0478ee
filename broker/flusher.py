"""The flush process: group commit, and the store's periodic duties.

One loop, in visible phases; it sleeps on its wake-up socket (slot 0) until
an appender asks for a flush or the next periodic duty is due:

    1. CommitLog   SYNC_FLUSH: whenever flush_request_pos > flushed_pos, flush
                   everything published so far (one fdatasync per segment
                   touched, however many sends wait: group commit), publish
                   flushed_pos, wake every process flagged WANT_FLUSH.
                   ASYNC_FLUSH: every flushIntervalCommitLog ms, if at least
                   flushCommitLogLeastPages pages are dirty or
                   flushCommitLogThoroughInterval ms have passed.
    2. ConsumeQueues and checkpoint, every flushIntervalConsumeQueue ms: the
       queues with flushConsumeQueueLeastPages dirty pages, and all of them
       every flushConsumeQueueThoroughInterval ms (only then does the
       checkpoint's ConsumeQueue position advance).
    3. Next segment: created (fallocate) by a helper thread once the current
       one is half full, so a roll never waits for it.
    4. Retention, every cleanResourceInterval ms.

SIGTERM: finish the loop, flush everything, write the checkpoint, exit 0.
The clock is injectable; ``step`` runs one pass, so tests drive it directly.
"""
from __future__ import annotations

import logging
import signal
import threading
import time

from shmq.core import jit
from shmq.core.retention import clean_expired
from shmq.core.store import MessageStore
from shmq.ipc.control import WANT_FLUSH, ControlBlock, die_with_parent, set_process_name

PAGE_BYTES = 4096
PREPARE_WHEN_LEFT = 0.5   # create the next segment when half of this one is left
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
        self.flushes = 0
        self.stopping = False
        self._preparing: threading.Thread | None = None
        self._prepared = -1

    def step(self) -> float:
        """One pass of the loop; returns the seconds until the next is due."""
        cfg, st, now = self.cfg, self.store.state, self.clock()
        fl = st.flushed_pos
        if cfg.sync_flush:
            if st.get("flush_request_pos") > fl or (now >= self.next_cl and st.write_pos > fl):
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
        if now >= self.next_clean:
            rep = clean_expired(self.store)
            if rep.segments_deleted:
                log.info("retention (%s): deleted %s, %d ConsumeQueue files", rep.reason,
                         rep.segments_deleted, rep.cq_files_deleted)
            self.next_clean = now + cfg.cleanResourceInterval / 1000
        if self.cb is not None:
            self.cb.heartbeat()
        return max(0.0, min(self.next_cl, self.next_cq, self.next_clean) - self.clock())

    def flush_commitlog(self) -> None:
        before = self.store.state.flushed_pos
        if self.store.flush_commitlog() > before:
            self.flushes += 1
            if self.cb is not None:
                self.cb.wake_flagged(WANT_FLUSH)

    def prepare_next_segment(self) -> None:
        """Have the segment after the one being written exist before it is
        needed. Creation runs in a thread (its system calls release the GIL)
        so group commit never waits behind it."""
        cl = self.store.cl
        wp = self.store.state.write_pos
        nxt = cl.segment_start(wp) + cl.segment_bytes
        if (nxt - wp > cl.segment_bytes * PREPARE_WHEN_LEFT or nxt == self._prepared
                or (self._preparing is not None and self._preparing.is_alive())):
            return
        path = cl.path(nxt)
        self._prepared = nxt
        if cl.files.exists(path):
            return
        self._preparing = threading.Thread(target=cl.files.create_preallocated,
                                           args=(path, cl.segment_bytes), daemon=True,
                                           name="segment-prealloc")
        self._preparing.start()

    def run(self) -> None:
        while not self.stopping:
            timeout = self.step()
            if self.cfg.sync_flush:
                # group commit: never sleep past a pending request
                if self.store.state.get("flush_request_pos") > self.store.state.flushed_pos:
                    continue
            self.cb.wait(timeout)
        self.finish()

    def finish(self) -> None:
        """Flush everything and checkpoint (shutdown)."""
        if self._preparing is not None:
            self._preparing.join()
        self.flush_commitlog()
        self.store.flush_consume_queues()
        self.store.write_checkpoint()


def flusher_main(config, owner_pid: int) -> None:
    """Entry point of the flush process (spawned by the store owner; it dies
    with the owner)."""
    from shmq.broker.shared_store import attach

    die_with_parent(owner_pid)
    set_process_name("shmq-flusher")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s flusher %(message)s")
    store, cb = attach(config, role="flusher")
    jit.freeze()                      # no compile on a request path (core/jit.py)
    f = Flusher(store, cb)

    def on_term(signum, frame):
        f.stopping = True
        cb.wake(cb.slot)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        f.run()
    finally:
        cb.close()
