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

It leaves the page cache as it found it. A pass reads the whole CommitLog
(22 GB at 100 M messages); through the page cache that would evict what
the catch-up readers and the writers need, after every start. So the
scrub reads ahead itself, half a window to a window at a time, noting
first which of those pages the cache did not hold (``CommitLog.uncached``,
mincore), and drops those from the cache as soon as it has checked past
them (``drop(..., cold=True)``: POSIX_FADV_DONTNEED); the pages that were
cached stay, whoever read them. It reads through a CommitLog of its own,
one segment open at a time, its mappings advised MADV_RANDOM: a fault
reads its own page, never the kernel's read-around (read_ahead_kb, 8 MiB
on this VM, centred on the fault), which would bring back pages behind it
that it had dropped and cache pages past what it noted. It reads ahead
with ``CommitLog.will_need`` (posix_fadvise WILLNEED in pieces of the
device's read_ahead_kb, as one call reads at most that much).
Checking stops where the read-ahead ends: a record cut there is checked
whole by the next call; only a record that fits in no window (damaged, or
larger than the window) is judged against the checked end, the pages up
to it noted but not read ahead (the search for the next valid record after
damage reads only as far as it must), and the next call reads ahead anew.

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
from .commitlog import CommitLog, SegmentMissing
from .config import StoreConfig
from .files import PAGE_BYTES
from .layout import offset_to_file_name
from .recovery import DamageLog, next_valid_record

log = logging.getLogger("shmq.store")
ROWS = 4096                  # records checked per kernel call


class Scrubber:
    """A services feature (``step(now_ms)``): see the module doc."""

    def __init__(self, store, config: StoreConfig, clock=time.monotonic):
        self.store, self.config, self.clock = store, config, clock
        # its own mappings (see the module doc), one segment at a time
        self.cl = CommitLog(store.files, config.commitlog_dir, config.mappedFileSizeCommitLog,
                            read_only=True, random_faults=True)
        self._seg = -1                 # the segment self.cl has open; -1: none
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
        self._ahead = -1               # read ahead (its cold pages noted) up to here; -1: nothing
        self._cold: list[tuple[int, int]] = []   # pages read ahead the cache did not hold before
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

    def _read_ahead(self, pos: int, end: int, whole: bool = False) -> int:
        """Read [pos, end) of one segment ahead into the page cache, its
        uncached pages noted first, up to a window at a time; returns how
        far checking may go (see the module doc). ``whole``: up to ``end``,
        noted only (a record that does not fit in a window)."""
        if self._ahead < pos:                      # a new stretch (a jump, a new segment)
            self._leave(None)
            self._ahead = pos - pos % PAGE_BYTES
        if whole or self._ahead - pos < self.window // 2:
            hi = end if whole else min(end, pos + self.window)
            hi = min(-(-hi // PAGE_BYTES) * PAGE_BYTES,             # whole pages, in the segment
                     self.cl.segment_start(pos) + self.config.mappedFileSizeCommitLog)
            if hi > self._ahead:
                self._cold += self.cl.uncached(self._ahead, hi)
                if not whole:
                    self.cl.will_need(self._ahead, hi)
                self._ahead = hi
        return min(self._ahead, end)

    def _leave(self, upto: int | None) -> None:
        """Drop from the page cache the pages it brought in that lie wholly
        below ``upto`` (None: all of them, and forget what was read ahead)."""
        if upto is None:
            keep, self._ahead = [], -1
            done = self._cold
        else:
            edge = upto - upto % PAGE_BYTES
            done = [(lo, min(hi, edge)) for lo, hi in self._cold if lo < edge]
            keep = [(max(lo, edge), hi) for lo, hi in self._cold if hi > edge]
        for lo, hi in done:
            self.cl.drop(lo, hi, cold=True)
        self._cold = keep

    def _close(self) -> None:
        """Done with the open segment (for now): what it brought into the
        cache leaves it, and the segment is closed (a segment retention
        deletes is not held open)."""
        self._leave(None)
        if self._seg >= 0:
            self.cl.close_segment(self._seg)
            self._seg = -1

    def _give_back(self) -> None:
        """Unmap what the scrub checked since the last time (``CommitLog.drop``):
        a pass reads the whole CommitLog, this process holds one window."""
        end = self.pos if self.pos >= 0 else self.resume
        if end > self._held:
            self.cl.drop(self._held, end)
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
            self._close()
            return 1
        seg = pos - pos % seg_bytes
        if seg != self._seg:
            self._close()
        try:
            buf = self.cl.map(seg)
            self._seg = seg
        except (SegmentMissing, FileNotFoundError):              # deleted by retention meanwhile
            self.pos = seg + seg_bytes
            return 1
        rel = pos - seg
        end = min(buf.shape[0], limit - seg)
        cut = self._read_ahead(pos, seg + end) - seg
        rows = max(1, min(ROWS, budget // 256))
        whole = False
        while True:
            n, stop, status = K.scan_records(buf, rel, cut, seg, True, K.CRC_TABLES,
                                             self._empty_key, self._rows[:rows])
            if cut == end or stop > rel or status in (K.SCAN_FULL, K.SCAN_BLANK):
                break
            whole = True                                         # no record fits before the cut
            cut = self._read_ahead(pos, seg + end, whole=True) - seg
        if status == K.SCAN_BLANK or (status == K.SCAN_END and stop == buf.shape[0]):
            self.pos = seg + seg_bytes                           # a BLANK, or a PAD, ends it
        elif status == K.SCAN_FULL or (status == K.SCAN_END and stop == end) or cut < end:
            self.pos = seg + stop    # (cut < end: the record there is checked whole next time)
        else:                       # below the checked end, anything else is damage
            self.pos = self._damaged(buf, seg, stop, end)
        self._leave(None if whole else self.pos)   # after a whole look, read ahead anew
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
