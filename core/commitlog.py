"""CommitLog segment files: naming, creation, the per-process open-file cache.

The CommitLog is ``<storePathCommitLog>/<20-digit start offset>`` files
(the directory defaults to ``<root>/commitlog``) of ``segment_bytes`` each,
records back to back, a BLANK record at the end of each full segment. It is
the only source of truth of the store.

This class knows positions and files only: it never decides where the end is
(``StoreState.write_pos`` does) and never takes a lock. Writers use
``write`` (pwrite into the page cache); readers use ``view`` (a slice of a
MAP_SHARED mapping, zero-copy). Why pwrite for writers and not stores through
the mapping: a store into a mapped page of a folio filled by a large write
dirties the whole folio, so every small sync writes up to 1 MiB; pwrite
dirties only what it writes (DESIGN §5; ``perf/`` bench ``flush_write_path``
measures both on this host).

Invariants: a segment file has exactly ``segment_bytes`` bytes and appears
under its name only when complete; segments are contiguous from the first
kept one; a record never spans two segments.
"""
from __future__ import annotations

import os
import struct
import threading

import numpy as np

from . import _kernels as K
from .files import PAGE_BYTES, FileLayer, Handle
from .layout import BLANK_MAGIC_I32, END_FILE_MIN_BLANK_BYTES, offset_to_file_name


_BLANK = struct.Struct(">ii")   # TOTALSIZE, MAGICCODE
SCAN_WINDOW_BYTES = 32 << 20    # last_nonzero reads, and holds, this much at a time


class SegmentMissing(LookupError):
    """A position lies in a segment file that does not exist (deleted or never made)."""


class FileRange:
    """``n`` bytes of an open file from ``off``: a piece of a reply that the
    broker's reactor sends by sendfile(2), advancing ``off`` and ``n`` as
    the socket takes bytes (so: mutable; slots, one per pull)."""
    __slots__ = ("fd", "off", "n")

    def __init__(self, fd: int, off: int, n: int):
        self.fd, self.off, self.n = fd, off, n


class CommitLog:
    def __init__(self, files: FileLayer, directory: str, segment_bytes: int,
                 read_only: bool = False, random_faults: bool = False):
        """``directory``: StoreConfig.commitlog_dir. ``read_only``: open
        segments O_RDONLY and map them PROT_READ (tools and readers beside a
        live broker: they cannot write a byte). ``random_faults``: every
        mapping advised MADV_RANDOM, for a reader that reads ahead exactly
        what it will read (recovery: the kernel's read-around of a fault at
        the end, 8 MiB on some disks, would cache the zeros after it)."""
        self.files = files
        self.dir = directory
        self.segment_bytes = segment_bytes
        self.read_only = read_only
        self.random_faults = random_faults
        self._open: dict[int, Handle] = {}
        self._opening = threading.Lock()
        self._random: set[str] = set()     # segments whose mapping is advised MADV_RANDOM
        if not read_only:
            files.makedirs(self.dir)

    # ---------------------------------------------------------------- names
    def segment_start(self, phy: int) -> int:
        return phy - phy % self.segment_bytes

    def path(self, start: int) -> str:
        return os.path.join(self.dir, offset_to_file_name(start))

    def list_segments(self) -> list[int]:
        """Start offsets of the segment files on disk, ascending. Files whose
        names are not 20 digits (temporaries, strays) are ignored."""
        out = []
        for name in self.files.listdir(self.dir):
            if len(name) == 20 and name.isdigit():
                out.append(int(name))
        return sorted(out)

    def remove_temporaries(self) -> int:
        """Delete segments a crash left half-made (``<name>.<pid>.<thread>.tmp``,
        never linked to a segment name); recovery only. Returns how many."""
        n = 0
        for name in self.files.listdir(self.dir):
            if name.endswith(".tmp") and name[:20].isdigit():
                self.files.unlink(os.path.join(self.dir, name))
                n += 1
        return n

    # ---------------------------------------------------------------- files
    def handle(self, start: int) -> Handle:
        h = self._open.get(start)
        if h is None:
            # Opened under a lock: a direct producer's flush thread
            # (client/direct.py FlushWaiter) resolves handles while its
            # loop's appends open them, and two openers would leak one.
            with self._opening:
                h = self._open.get(start) or self._open_segment(start)
        return h

    def _open_segment(self, start: int) -> Handle:
        path = self.path(start)
        if not self.files.exists(path):
            raise SegmentMissing(f"CommitLog segment {offset_to_file_name(start)} does not exist")
        h = self.files.open(path, writable=not self.read_only)
        if h.size != self.segment_bytes and not (self.read_only and h.size < self.segment_bytes):
            # a reader maps a short file (cut by a crash, a copy, a full
            # disk) as far as it goes: recovery repairs it at the next start
            self.files.close(h)
            raise ValueError(f"{path}: {h.size} bytes, expected {self.segment_bytes} "
                             f"(mappedFileSizeCommitLog differs from the store's)")
        self._open[start] = h
        return h

    def ensure_segment(self, start: int) -> Handle:
        """Open the segment at ``start``, creating it (zero-filled, atomically)
        if nobody has yet; the flusher usually has, ahead of the writer."""
        assert start % self.segment_bytes == 0, ("a segment starts at a multiple of its size", start)
        if start not in self._open and not self.files.exists(self.path(start)):
            self.files.create_preallocated(self.path(start), self.segment_bytes)
        return self.handle(start)

    def map(self, start: int) -> np.ndarray:
        h = self.handle(start)
        if self.random_faults:
            self._advise_random(h)
        return self.files.map(h)

    def prefault(self, start: int, begin: int, end: int) -> None:
        """Map bytes [begin, end) of the mapped segment at ``start`` in one
        call, before a sequential read of them."""
        self.files.prefault(self.handle(start), begin, end)

    def will_need(self, begin: int, end: int, alone: bool = False, data_only: bool = False) -> None:
        """Read [begin, end) ahead into the page cache, in the background
        (``FileLayer.will_need``), segment by segment; missing ones skipped.
        ``alone``: what the caller asks for is all it will read of these
        segments (a reader far behind, of one queue among several): their
        mappings in this process are advised MADV_RANDOM as well, once, so
        a fault outside what was read ahead brings in its page, not a
        read-around of the other queues' bytes. ``data_only``: only as far
        as the file system says data goes (``FileLayer.data_extent``), for a
        scan towards an end it has not found yet: the never-written zeros
        past the end, read ahead, would be cached and so become data that
        the look past the end (``last_nonzero``) reads."""
        def ahead(h, lo, hi):
            if alone:
                self._advise_random(h)
            if data_only:
                at, upto = self.files.data_extent(h, lo)
                lo, hi = max(lo, at), min(hi, upto)
            self.files.will_need(h, lo, hi)
        self._each(begin, end, ahead)

    def _advise_random(self, h: Handle) -> None:
        """Advise the segment's mapping MADV_RANDOM, once (``will_need``)."""
        if h.path not in self._random:
            self._random.add(h.path)
            self.files.random_faults(h)

    def drop(self, begin: int, end: int, cold: bool = False) -> None:
        """Give back this process's mapped pages of [begin, end)
        (``FileLayer.drop``): a scan done with a range. Only segments this
        process has open are touched (nothing is opened to drop it)."""
        self._each(begin, end, lambda h, lo, hi: self.files.drop(h, lo, hi, cold), opened=True)

    def uncached(self, begin: int, end: int) -> list[tuple[int, int]]:
        """The runs of whole pages from the page holding ``begin`` up to
        ``end``, which must lie in one segment, that are not in the page
        cache now (``FileLayer.cached``), as page-aligned CommitLog ranges:
        what a reader that must leave the cache as it found it gives back
        with ``drop(..., cold=True)`` once it has read them."""
        start = self.segment_start(begin)
        assert end <= start + self.segment_bytes, "uncached: one segment at a time"
        lo = begin - begin % PAGE_BYTES
        flags = self.files.cached(self.handle(start), lo - start, end - start)
        # run boundaries: where the flag changes, and both ends
        edges = np.flatnonzero(np.diff(np.concatenate(([True], flags, [True])).astype(np.int8)))
        return [(lo + int(a) * PAGE_BYTES, min(lo + int(b) * PAGE_BYTES, start + self.segment_bytes))
                for a, b in zip(edges[::2], edges[1::2])]

    def last_written(self, segs: list[int]) -> int | None:
        """The last of ``segs`` (ascending) with a record at its start, or
        None: the ones after it are the flusher's preallocated next segment,
        zeros never written (it exists from the first append to a segment).
        What holds the write head, where a cut file lost only what was never
        durable, is this one, not the last file. Opens each file it looks
        at on its own (no cached handle: a repair may extend it next)."""
        for s in reversed(segs):
            path = self.path(s)
            if self.files.file_size(path) < 4:
                continue
            h = self.files.open(path, writable=False)
            try:
                if self.files.map(h)[:4].any():
                    return s
            finally:
                self.files.close(h)
        return None

    def at_or_past_head(self, segs: list[int], s: int) -> bool:
        """Is segment ``s`` of ``segs`` the one the writers were in, or an
        empty one made ahead of them (``last_written``)? A cut there loses
        only what was never durable; anywhere before it, records."""
        tail = self.last_written(segs)
        return tail is None or s >= tail

    def last_nonzero(self, begin: int, end: int) -> tuple[int, int]:
        """(CommitLog offset of the last nonzero byte in [begin, end), which
        must lie in one segment, or -1; the bytes read to find it): what
        lies past the end of the data. Only what the file system says may
        hold data is read (``FileLayer.data_extent``): never-written extents
        of a preallocated segment are not, and the read faults in only the
        pages it asks for (the mapping is advised MADV_RANDOM, the run read
        ahead exactly), since a read-around would cache the zero pages
        after a run and make them data for the next look — the rest of a
        1 GiB segment read that way, 1.7-2 s of a start. Window by window,
        each given back (``drop``): a 1 GiB segment of zeros would otherwise
        be 1 GiB of zero pages in the reader's RSS."""
        start = self.segment_start(begin)
        h = self.handle(start)
        buf = self.files.map(h)
        self._advise_random(h)
        pos, stop, last, read = begin - start, min(end - start, buf.shape[0]), -1, 0
        while pos < stop:
            lo, hi = self.files.data_extent(h, pos)
            pos = max(pos, lo)
            if pos >= stop:
                break
            hi = min(stop, max(hi, pos + 1), pos + SCAN_WINDOW_BYTES)
            self.files.will_need(h, pos, hi)
            k = int(K.last_nonzero(buf[:hi], pos))
            if k >= 0:
                last = start + k
            read += hi - pos
            self.files.drop(h, pos, hi)
            pos = hi
        return last, read

    def _each(self, begin: int, end: int, fn, opened: bool = False) -> None:
        pos = begin
        while pos < end:
            start = self.segment_start(pos)
            stop = min(end, start + self.segment_bytes)
            try:
                h = self._open.get(start) if opened else self.handle(start)
            except SegmentMissing:
                h = None
            if h is not None:
                fn(h, pos - start, stop - start)
            pos = stop

    def open_segments(self) -> list[int]:
        return list(self._open)

    def close_segment(self, start: int) -> None:
        h = self._open.pop(start, None)
        if h is not None:
            self._random.discard(h.path)
            self.files.close(h)

    def close(self) -> None:
        for start in list(self._open):
            self.close_segment(start)

    # ------------------------------------------------------------- bytes I/O
    def write(self, phy: int, data) -> None:
        """pwrite ``data`` at ``phy``; it must lie inside one segment."""
        start = self.segment_start(phy)
        n = len(data)
        assert phy + n <= start + self.segment_bytes, "a write never spans segments"
        self.files.pwrite(self.handle(start), data, phy - start)

    def blank(self, phy: int) -> bytes:
        """The BLANK record that ends the segment holding ``phy`` there."""
        left = self.segment_start(phy) + self.segment_bytes - phy
        assert left >= END_FILE_MIN_BLANK_BYTES, (
            "a claim leaves room for the blank that ends its segment", phy, left)
        return _BLANK.pack(left, BLANK_MAGIC_I32)

    def write_blank(self, phy: int) -> int:
        """End the segment holding ``phy`` with a BLANK record; returns the
        start of the next segment."""
        self.write(phy, self.blank(phy))
        return self.segment_start(phy) + self.segment_bytes

    def zero(self, begin: int, end: int) -> None:
        """Overwrite [begin, end) with zeros, segment by segment (missing ones skipped)."""
        pos = begin
        while pos < end:
            start = self.segment_start(pos)
            stop = min(end, start + self.segment_bytes)
            try:
                self.files.pwrite(self.handle(start), bytes(stop - pos), pos - start)
            except SegmentMissing:
                pass
            pos = stop

    def view(self, phy: int, size: int) -> np.ndarray:
        """Zero-copy view of [phy, phy+size), which must lie in one segment."""
        start = self.segment_start(phy)
        rel = phy - start
        assert rel + size <= self.segment_bytes
        return self.map(start)[rel:rel + size]

    def file_range(self, phy: int, size: int) -> FileRange:
        """[phy, phy+size), which must lie in one segment, as a range of its
        open file (valid while this CommitLog keeps the segment open)."""
        start = self.segment_start(phy)
        assert phy - start + size <= self.segment_bytes
        return FileRange(self.handle(start).fd, phy - start, size)

    def read(self, phy: int, size: int) -> bytes:
        return self.view(phy, size).tobytes()

    def flush(self, begin: int, end: int) -> None:
        """Make [begin, end) durable: one fdatasync per segment it touches."""
        if end <= begin:
            return
        start = self.segment_start(begin)
        last = self.segment_start(end - 1)
        while start <= last:
            try:
                self.files.sync(self.handle(start))
            except SegmentMissing:
                pass  # deleted by retention: nothing left to make durable
            start += self.segment_bytes

    def delete_segment(self, start: int) -> None:
        self.close_segment(start)
        self.files.unlink(self.path(start))
