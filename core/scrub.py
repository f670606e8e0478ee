"""Scrub: check the durable records of the CommitLog in the background.

Recovery validates only what the checkpoint does not cover (from its
flushed position on, ``core/recovery.py``), and pulls check only what they
read from disk (``checkCRCOnRead``), so damage to an older record that
stays in the page cache, or that nobody reads for a while, would go unseen
until a consumer met it. The services process runs a ``Scrubber`` as one of
its features: it walks the CommitLog from the oldest segment, at
``scrubBytesPerSecond``, checking each record as recovery does
(``_kernels.scan_records`` with the body CRC), up to the *checked end*:
the start of the segment being written, or the flushed position inside it
when that is further (what a start no longer rescans); then follows that
end as segments are sealed and records are flushed; and starts a new pass
from the oldest ``scrubPassIntervalHours`` after the last one began (0: at
once). The checked end is a record boundary (``flushed_pos`` is a past
``write_pos``), so a record running past it is damage too. It gives back
the pages it checked every ``backgroundScanWindowBytes``
(``CommitLog.drop``): its process's RSS holds one window of the store.

A damaged range it finds — from the bad record to the next valid one
(``recovery.next_valid_record``), at most to the checked end — is an ERROR
naming the offset, and goes into ``<root>/quarantine/damaged.json``
(``DamageLog``): the workers read that file once a second and never serve
a record in a listed range (the queue moves past it, as for any record
failing ``checkCRCOnRead``), and the next start's recovery quarantines
every listed range below the flushed position as it does damage it finds
itself, then empties the list.
"""
from __future__ import annotations

import logging
import time

import numpy as np

from . import _kernels as K
from .commitlog import SegmentMissing
from .config import StoreConfig
from .layout import offset_to_file_name
from .recovery import DamageLog, next_valid_record

log = logging.getLogger("shmq.store")
ROWS = 4096                  # records checked per kernel call


class Scrubber:
    """A services feature (``step(now_ms)``): see the module doc."""

    def __init__(self, store, config: StoreConfig, clock=time.monotonic):
        self.store, self.config, self.clock = store, config, clock
        self.damage = DamageLog(store.files, store.root)
        self.rate = config.scrubBytesPerSecond
        self.pass_s = config.scrubPassIntervalHours * 3600
        self.pos = -1                  # next CommitLog offset to check; -1: idle
        self.resume = 0                # where checking stopped: what is sealed or flushed since
                                       # goes on from here
        self._new_pass = False         # a pass from the oldest is under way (logged when done)
        self.pass_began = float("-inf")
        self.last = clock()
        self.found = 0                 # damaged ranges found since start
        self.checked = 0               # bytes checked since start
        self.window = config.backgroundScanWindowBytes
        self._held = -1                # checked bytes from here on are still mapped in this process
        self._rows = np.empty((ROWS, K.N_SCAN), dtype=np.int64)
        self._empty_key = np.zeros(0, dtype=np.uint8)

    def step(self, now_ms: int) -> int:
        """Check about as many bytes as the pace allows since the last step."""
        now = self.clock()
        budget = int((now - self.last) * self.rate)
        self.last = now
        if self.rate <= 0 or budget <= 0:
            return 0
        if self.pos < 0:
            if now - self.pass_began >= self.pass_s:           # a new pass from the oldest
                self.pass_began, self.pos = now, self.store.state.get("cl_min_offset")
                self._new_pass = True
            elif self._checked_end() > self.resume:            # sealed or flushed since
                self.pos = self.resume
            else:
                return 0
        done = 0
        while done < budget and self.pos >= 0:
            if self._held < 0:
                self._held = max(self.pos, 0)
            done += self._check(budget - done)
            if self.pos < 0 or self.pos - self._held >= self.window:
                self._give_back()
        self.checked += done
        return done

    def _give_back(self) -> None:
        """Unmap what the scrub checked since the last time (``CommitLog.drop``):
        a pass reads the whole CommitLog, this process holds one window."""
        end = self.pos if self.pos >= 0 else self.resume
        if end > self._held:
            self.store.cl.drop(self._held, end)
        self._held = -1

    def _checked_end(self) -> int:
        """Where checking stops for now: the start of the segment being
        written (everything below is sealed), or the flushed position
        when it is past that (durable records of the segment being written)."""
        st = self.store.state
        wp = st.write_pos
        return max(wp - wp % self.config.mappedFileSizeCommitLog, min(st.flushed_pos, wp))

    def _check(self, budget: int) -> int:
        """Check from ``pos``, within its segment; returns the bytes passed."""
        seg_bytes = self.config.mappedFileSizeCommitLog
        limit = self._checked_end()
        pos = max(self.pos, self.store.state.get("cl_min_offset"))
        if pos >= limit:
            if self._new_pass:
                log.info("scrub: checked the CommitLog up to %d; %d damaged ranges found "
                         "since start", limit, self.found)
                self._new_pass = False
            self.pos, self.resume = -1, max(pos, limit)
            return 1
        seg = pos - pos % seg_bytes
        try:
            buf = self.store.cl.map(seg)
        except (SegmentMissing, FileNotFoundError):              # deleted by retention meanwhile
            self.pos = seg + seg_bytes
            return 1
        rel = pos - seg
        end = min(buf.shape[0], limit - seg)
        rows = max(1, min(ROWS, budget // 256))
        n, stop, status = K.scan_records(buf, rel, end, seg, True, K.CRC_TABLES,
                                         self._empty_key, self._rows[:rows])
        if status == K.SCAN_BLANK or (status == K.SCAN_END and stop == buf.shape[0]):
            self.pos = seg + seg_bytes                           # a BLANK, or a PAD, ends it
        elif status == K.SCAN_FULL or (status == K.SCAN_END and stop == end):
            self.pos = seg + stop
        else:                       # below the checked end, anything else is damage
            self.pos = self._damaged(buf, seg, stop, end)
        return max(1, self.pos - pos)

    def _damaged(self, buf: np.ndarray, seg: int, rel: int, end: int) -> int:
        nxt = next_valid_record(buf, seg, rel + 1, end)
        stop = seg + (nxt if nxt is not None else end)
        why = (f"no valid record at CommitLog offset {seg + rel} (segment {offset_to_file_name(seg)}; "
               f"found by the scrub)")
        self.found += 1
        self.damage.add(seg + rel, stop, why)
        log.error("scrub: %s: %d bytes to %d set aside; pulls will not serve them and the next "
                  "start quarantines them (shmq store inspect --offset %d shows it)",
                  why, stop - seg - rel, stop, seg + rel)
        return stop
