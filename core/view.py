"""A read-only view of a store directory, safe beside a live broker.

``StoreView.open(root, published=...)`` takes one snapshot of what is
readable:

- with a broker running on the store, the positions it has published
  (``published_positions`` of its ``StoreState``): the CommitLog
  ``write_pos`` and each queue's ``next_offset`` / ``min_offset``
  (``core.state`` visibility rule: everything below them is complete,
  whatever the broker appends meanwhile). Attaching to a running broker's
  shared memory is the caller's (``broker/live_view.py``: core knows files,
  not processes);
- with none, what a recovery would keep, found without writing: the CommitLog
  ends at the first invalid record of its last segment past the checkpoint's
  flushed position (``recovery.find_end``: damage below it is stepped over,
  as recovery quarantines it), a queue at its first unit pointing at or past
  that end (``ConsumeQueues.valid_extent``, the rule recovery keeps units
  by: a crashed broker's undispatched tail is in the CommitLog only until
  the next broker start dispatches it).

Files are opened O_RDONLY and mapped PROT_READ: a tool or a Spark task cannot
write a byte of the store. Segment and ConsumeQueue file sizes are read from
the files themselves, and the directories a broker put elsewhere than the
root (storePathCommitLog …) from the root's record of them
(``StoreConfig.of_store``), so no broker.conf is needed. Retention may delete a
segment after the snapshot; readers see ``SegmentMissing`` then. Reading
records below the view's positions is ``core.reader``'s.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import NamedTuple

from .checkpoint import Checkpoint
from .commitlog import CommitLog
from .config import StoreConfig
from .consumequeue import ConsumeQueues
from .files import PAGE_BYTES, REAL_FILES, FileLayer
from .layout import CQ_UNIT_BYTES, CQ_UNITS_PER_FILE
from .recovery import find_end
from .state import StoreState


class NotAStore(ValueError):
    """The directory holds no shmq/RocketMQ store."""


@dataclass
class QueueExtent:
    topic: str
    queue_id: int
    min_offset: int      # first queue offset still stored
    max_offset: int      # next queue offset: units below it are readable


class Published(NamedTuple):
    """What a running broker has published: the first CommitLog byte kept,
    the CommitLog's readable end, and (topic, queue id, min, max) per queue."""
    cl_min: int
    write_pos: int
    queues: list[tuple[str, int, int, int]]


def published_positions(st: StoreState) -> Published:
    """A running broker's published positions, read from its ``StoreState``
    in the order that keeps them consistent: queue maxima first, then
    write_pos, so every unit below a queue's max points below the write_pos
    read after it."""
    queues = []
    for slot, topic, qid in st.iter_queues():
        queues.append((topic, qid, int(st.queue_min[slot]), int(st.queue_next[slot])))
    return Published(st.get("cl_min_offset"), st.write_pos, queues)


@dataclass
class StoreView:
    root: str
    segment_bytes: int
    units_per_file: int
    segments: list[int]            # start offsets of the CommitLog segment files
    cl_min: int                    # first CommitLog byte kept
    cl_end: int                    # CommitLog readable below this
    live: bool                     # a broker owned the store when the view was taken
    queues: dict[tuple[str, int], QueueExtent] = field(default_factory=dict)
    files: FileLayer = REAL_FILES
    config: StoreConfig | None = None    # where its directories are (StoreConfig.of_store)

    # ---------------------------------------------------------------- open
    @classmethod
    def open(cls, root: str, files: FileLayer = REAL_FILES,
             published: Published | None = None) -> StoreView:
        """Snapshot the store at ``root``: below a running broker's
        ``published`` positions, or (None) from the files alone."""
        root = os.path.abspath(os.path.expanduser(root))
        try:
            config = StoreConfig.of_store(root, files)
        except ValueError as e:        # an unreadable record: not a store we can read
            raise NotAStore(f"{root}: {e}") from None
        if not files.exists(config.commitlog_dir):
            raise NotAStore(f"{root}: no CommitLog directory {config.commitlog_dir} (not a store)")
        cl = CommitLog(files, config.commitlog_dir, 1, read_only=True)
        segs = cl.list_segments()
        segment_bytes = _segment_bytes(files, cl, segs)
        upf = _units_per_file(files, config.consumequeue_dir)
        view = cls(root, segment_bytes, upf, segs, segs[0] if segs else 0, 0, published is not None,
                   files=files, config=config)
        if published is not None:
            cl_min, write_pos, queues = published
            # Retention advances cl_min before it unlinks; a segment listed
            # here may still go, but none below cl_min is ever read.
            view.cl_min = max(view.cl_min, cl_min)
            view.cl_end = write_pos
            view.segments = [s for s in segs if s + segment_bytes > view.cl_min and s < write_pos]
            view.queues = {(t, q): QueueExtent(t, q, lo, hi) for t, q, lo, hi in queues}
        else:
            view.cl_end = view._scan_end()
            view.queues = view._queue_extents()
        return view

    # ------------------------------------------------------------- readers
    def commitlog(self) -> CommitLog:
        return CommitLog(self.files, self.config.commitlog_dir, self.segment_bytes, read_only=True)

    def consumequeues(self) -> ConsumeQueues:
        return ConsumeQueues(self.files, self.config.consumequeue_dir, self.units_per_file,
                             read_only=True)

    def topics(self) -> list[str]:
        return sorted({t for t, _ in self.queues})

    def data_end(self, seg: int) -> int:
        """Readable bytes of segment ``seg`` (from its start)."""
        return max(0, min(self.cl_end - seg, self.segment_bytes))

    def record_start_after(self, pos: int, limit: int) -> int:
        """A record start in [pos, limit), or ``limit`` if none is known: the
        nearest any ConsumeQueue points at (records are contiguous, so any
        unit's position is a record boundary). Binary searches, no scan."""
        best = limit
        cqs = self.consumequeues()
        try:
            for ext in self.queues.values():
                lo, hi = ext.min_offset, ext.max_offset
                # first queue offset whose unit points at or past ``pos``
                while lo < hi:
                    mid = (lo + hi) // 2
                    u = cqs.unit(ext.topic, ext.queue_id, mid)
                    if u is None:
                        break
                    if u[0] < pos:
                        lo = mid + 1
                    else:
                        hi = mid
                else:
                    if lo < ext.max_offset:
                        u = cqs.unit(ext.topic, ext.queue_id, lo)
                        if u is not None:
                            best = min(best, max(pos, u[0]))
        finally:
            cqs.close()
        return best

    # ------------------------------------------------------- offline scans
    def _scan_end(self) -> int:
        """End of valid data, as recovery will find it (``recovery.find_end``)."""
        if not self.segments:
            return 0
        ckpt = Checkpoint.load(self.files, self.root)
        cl = self.commitlog()
        try:
            return find_end(cl, self.segments, ckpt.cl_flushed if ckpt is not None else -1)
        finally:
            cl.close()

    def _queue_extents(self) -> dict[tuple[str, int], QueueExtent]:
        # Files whose last unit the checkpoint covers are trusted unread, as
        # recovery trusts them (``ConsumeQueues.valid_extent``); past it (a
        # crashed broker's last files) every unit is checked.
        ckpt = Checkpoint.load(self.files, self.root)
        durable = 0 if ckpt is None else max(0, min(ckpt.cl_flushed, ckpt.cq_flushed))
        cqs = self.consumequeues()
        out = {}
        try:
            for topic, qid in sorted(cqs.list_queues()):
                ext = cqs.valid_extent(topic, qid, self.cl_end, durable)   # as recovery keeps them
                if ext is None:
                    continue
                first, hi = ext
                lo = cqs.min_offset_from(topic, qid, first, hi, self.cl_min)
                out[(topic, qid)] = QueueExtent(topic, qid, lo, hi)
        finally:
            cqs.close()
        return out


def _segment_bytes(files: FileLayer, cl: CommitLog, segs: list[int]) -> int:
    """The store's segment size: the step between segment names when there are
    two or more, else the largest file. A file shorter than that was cut
    short (a crash, a copy, a full disk): it is read as far as it goes, and
    the next start's recovery extends it (``core/recovery.py``)."""
    if not segs:
        return 0
    sizes = [files.file_size(cl.path(s)) for s in segs]
    steps = [b - a for a, b in zip(segs, segs[1:])]
    # one file: its size, up to whole pages, as every segment size is
    # (StoreConfig); a file cut to a few bytes made a segment of that many,
    # and a walk of a range of such segments never ended
    return min(steps) if steps else max(PAGE_BYTES, -(-max(sizes) // PAGE_BYTES) * PAGE_BYTES)


def _units_per_file(files: FileLayer, base: str) -> int:
    for topic in files.listdir(base):
        for qid in files.listdir(os.path.join(base, topic)):
            for name in files.listdir(os.path.join(base, topic, qid)):
                if len(name) == 20 and name.isdigit():
                    return files.file_size(os.path.join(base, topic, qid, name)) // CQ_UNIT_BYTES
    return CQ_UNITS_PER_FILE
