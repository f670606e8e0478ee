"""Recovery: find the CommitLog's true end and make every ConsumeQueue agree with it.

Runs once, in the process that opens a store, before anyone appends. The
CommitLog is the only truth; ConsumeQueues are derived and never trusted past
the checkpoint.

1. Segments must be contiguous, start at multiples of the configured size and
   be no larger; otherwise stop with ``RecoveryError`` (deleting data to "fix"
   that would lose messages). A segment shorter than the configured size (cut
   by a crash, a copy, a full disk) is repaired, not fatal: it is extended
   with zeros to full size (``_repair_short_segments``, logged at ERROR with the
   file and both sizes). The last segment's records past the cut were never
   durable or are lost: the torn-tail rule below truncates at its last whole
   record. A middle segment (later segments hold records) gets a BLANK record
   after its last whole record, so the scan goes on into the next segment; the
   records that lay past the cut are reported as lost (bytes; records counted
   from the queue offsets of the records after them, whose ConsumeQueue holes
   are filled with padding units, never reused) and the whole store is
   re-dispatched. Nothing is invented: no record is made up for what was cut.
   A sole segment that holds a clean, complete-looking store of another size
   (whole records then zeros, or a BLANK ending at its end, at a multiple of
   4096 bytes) is what a store made with another ``mappedFileSizeCommitLog``
   looks like: that is refused, naming both ways out.
2. Scan from min(checkpoint.cl_flushed, checkpoint.cq_flushed) — both record
   boundaries — when a valid record starts or ends there (``_record_bound``:
   records name their own position, so a wrong checkpoint is caught), else
   from the start of the segment holding it; from the first segment without
   a usable checkpoint (or with the consumequeue directory missing).
   Validate every record (``_kernels.scan_records``: magic, sizes, topic,
   physical offset, body CRC). Zeros are the end. An invalid record past the
   checkpoint's flushed position is a torn write: it is the end. One below it
   is damage to bytes that were durable (a flipped bit, a bad sector): it is
   quarantined and the scan goes on (``_Quarantine``): its bytes are copied
   to ``<root>/quarantine/<offset>``, its range [it, the next valid record)
   becomes a PAD record whose padding unit keeps its queue offset (never
   reused, never served), and every good record after it is kept. Each one
   is an ERROR naming the offset, the file, the queue and offset lost.
   PAD records (claims an appender never finished, padded by a repair:
   ``store`` module) are skipped by the kernel; recovery finds them in the
   gaps between the rows and rewrites their queue offsets as padding units.
   A claim nobody finished lies past the published end: a torn write.
3. Truncate: zero the bytes past the end in its segment, delete later segments.
   Only what the file system says may hold data is read for it (written
   extents and cached pages: ``CommitLog.last_nonzero``), through mappings
   advised MADV_RANDOM and read ahead only as far as that data goes, so no
   read caches the preallocated zeros past the end (which would make them
   data to read): after a clean stop, at most the rest of the end's page;
   after a kill -9, the pages written past it. The report counts the bytes
   (``bytes_read_past_end``).
4. Every queue keeps its units that point wholly below the scan start. The
   records scanned are re-dispatched: their units are rewritten (counted as
   rebuilt when they differed from what was on disk). Units past a queue's
   new end are zeroed (counted as dropped). A queue whose re-dispatched
   offsets do not continue its kept units has lost units: the whole store is
   re-dispatched from the first segment.

What recovery does not read, and what checks it instead. Start time must
not grow with the backlog (a hundred million messages stored start in
seconds), so recovery reads only what the checkpoint does not cover: the
CommitLog from the flushed positions (step 2: after a clean stop, nothing),
and of each ConsumeQueue only its last files — those after the last file whose
last unit points wholly below the scan start (``ConsumeQueues.valid_extent``:
such a file, and every file before it, was durable when the checkpoint was
written, so it is trusted unread, as RocketMQ trusts all but its last three
files). A kill -9 costs the same as a clean stop: the page cache kept what
the process wrote, and the checkpoint is at most a flush interval old. The
walks read ahead in large requests (``FileLayer.will_need``) and give back
each segment they are done with (``FileLayer.drop``). What was durable and
is damaged later below the scan start — a flipped bit, a bad sector, in a
segment (the one being written included) or a ConsumeQueue unit — is not
seen here: the scrub (``core/scrub.py``) checks every record below the
flushed position in the background and lists what fails, which the next
start quarantines; a pull that reads a record from disk checks it
(``checkCRCOnRead``) and never serves a bad one (a unit that points at no
valid record included); ``shmq store inspect --verify`` checks
every unit. A lost ConsumeQueue file (a hole in a queue's file sequence) is
still found here, from the file names alone, and re-dispatched.

A unit's tags code is the Java hash of the record's TAGS, as the append wrote
it, except in topics whose caller gives a rule (``tags_code_rules``, topic →
``TagsCodeRule``): there the rule computes it from the records. The broker
keeps a delivery time in the delay-level and timer topics' units and gives
the rules that recompute it (RocketMQ: ``CommitLog.checkMessageAndReturnSize``);
core knows no topic.

The result is a ``RecoveryReport`` (what was truncated, rebuilt, dropped) and
the queue extents with which the caller initialises the ``StoreState``.
Normal (clean shutdown) and abnormal (``abort`` present) recovery run the same
checks; the report says which it was.
"""
from __future__ import annotations

import json
import logging
import os
import struct
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from . import _kernels as K
from . import layout as L
from .checkpoint import Checkpoint, abort_path
from .commitlog import CommitLog
from .config import StoreConfig, record_paths
from .consumequeue import ConsumeQueues
from .files import FileLayer
from .layout import CQ_UNIT_BYTES, CQ_UNIT_DTYPE, PROPERTY_TAGS, offset_to_file_name

SCAN_ROWS = 1 << 16
SCAN_AHEAD_BYTES = 32 << 20      # the scan reads this far ahead of itself (posix_fadvise)
log = logging.getLogger("shmq.store")
_TAGS_KEY = np.frombuffer(PROPERTY_TAGS.encode(), dtype=np.uint8)


@dataclass(frozen=True)
class QueueRecords:
    """Records of one queue that recovery re-dispatches, in queue order, for
    a ``TagsCodeRule``. The arrays are valid only during the call:
    ``props_buf`` is the mapped CommitLog segment."""
    topic: str
    queue_id: int
    store_timestamp: np.ndarray   # int64 epoch ms (STORETIMESTAMP)
    props_buf: np.ndarray         # record i's properties: props_buf[props_pos[i]:+props_len[i]]
    props_pos: np.ndarray         # int64
    props_len: np.ndarray         # int64
    tags_hash: np.ndarray         # int64: the code of a record of an ordinary topic


# A topic's tags-code rule: its records → the int64 tags code of each one's unit.
TagsCodeRule = Callable[[QueueRecords], np.ndarray]


class RecoveryError(RuntimeError):
    """The store cannot be recovered without losing data; nothing was changed."""


@dataclass
class SegmentRepair:
    """A CommitLog segment found shorter than mappedFileSizeCommitLog and
    extended to full size with zeros."""
    name: str
    old_size: int
    new_size: int
    last: bool                    # the last segment (else later segments hold records)
    records_end: int = 0          # CommitLog offset past its last whole record below the cut
    lost_bytes: int = 0           # middle: bytes of the segment past records_end that are gone
    records_lost: int = 0         # middle: records counted missing from the queue offsets after

    def describe(self) -> str:
        what = (f"CommitLog segment {self.name} was {self.old_size} bytes, "
                f"extended to {self.new_size}")
        if self.last:
            return what + (" (the last one: records past the cut that the checkpoint had as flushed "
                           "are quarantined, their queue offsets kept; the rest is a torn write, "
                           "truncated)")
        return (what + f" (a middle one: {self.lost_bytes} bytes from {self.records_end} to its end "
                f"lost, {self.records_lost} records missing by their queue offsets)")


@dataclass
class Quarantined:
    """A damaged range below the flushed position, set aside by recovery."""
    phy: int                       # CommitLog offset of the bad record
    size: int                      # bytes set aside: up to the next valid record
    copy: str                      # where its bytes were copied ("" if that failed)
    records: list[tuple[str, int, int]]   # (topic, queue id, queue offset) of each record known in it
    records_lost: int = 0          # records counted missing (those, and holes padded after it)

    def describe(self) -> str:
        what = (f"{self.size} bytes at CommitLog offset {self.phy} "
                f"(copied to {self.copy or 'nowhere: the copy failed'})")
        shown = ", ".join(f"{t} queue {q} offset {o}" for t, q, o in self.records[:5])
        more = f" and {len(self.records) - 5} more" if len(self.records) > 5 else ""
        return what + (f", records: {shown}{more}" if shown else ", records unknown")


@dataclass
class RecoveryReport:
    mode: str = "normal"                 # "normal" | "abnormal" | "new"
    scan_from: int = 0                   # CommitLog offset the scan started at
    end: int = 0                         # the CommitLog end found
    min_offset: int = 0                  # the first CommitLog offset kept
    bytes_scanned: int = 0
    records_scanned: int = 0
    stop_reason: str = "end"             # "end" | "corrupt at <offset>"
    bytes_truncated: int = 0             # nonzero bytes erased past the end
    bytes_read_past_end: int = 0         # read looking for them (what may hold data: _truncate)
    segments_deleted: list[str] = field(default_factory=list)
    units_rebuilt: int = 0               # ConsumeQueue units written that differed
    units_dropped: int = 0               # ConsumeQueue units erased past a queue's end
    full_redispatch: bool = False
    offset_anomalies: int = 0            # records whose queue offset did not follow the last
    temp_files_removed: int = 0          # half-made segments left by a crash during creation
    flushed_lost_bytes: int = 0          # checkpointed-durable bytes not found (disk damage)
    segments_repaired: list[SegmentRepair] = field(default_factory=list)  # short segments extended
    records_lost: int = 0                # records counted missing (middle segment repairs)
    pads: int = 0                        # PAD records scanned (claims a dead appender left)
    cq_files_rebuilt: list[str] = field(default_factory=list)  # ConsumeQueue files of a wrong size
    quarantined: list["Quarantined"] = field(default_factory=list)  # damaged records set aside
    seconds: float = 0.0

    def summary(self) -> str:
        s = (f"{self.mode} recovery: end {self.end}, scanned {self.records_scanned} records "
             f"({self.bytes_scanned} bytes) from {self.scan_from} in {self.seconds:.3f}s; "
             f"stopped at {self.stop_reason}; truncated {self.bytes_truncated} bytes "
             f"({self.bytes_read_past_end} read past the end), "
             f"deleted {len(self.segments_deleted)} segments; ConsumeQueue units rebuilt "
             f"{self.units_rebuilt}, dropped {self.units_dropped}")
        if self.pads:
            s += (f"; {self.pads} PAD records (appends a process never finished, or damaged "
                  f"ranges set aside; their queue offsets are skipped)")
        if self.full_redispatch:
            s += "; ConsumeQueues were incomplete: re-dispatched the whole CommitLog"
        if self.flushed_lost_bytes:
            s += f"; WARNING {self.flushed_lost_bytes} bytes past the end had been flushed"
        for r in self.segments_repaired:
            s += f"; ERROR repaired a short segment: {r.describe()}"
        if self.records_lost:
            s += (f"; ERROR {self.records_lost} records lost in damaged ranges (short segments, "
                  f"quarantined records)")
        for q in self.quarantined:
            s += f"; ERROR quarantined {q.describe()}"
        if self.cq_files_rebuilt:
            s += (f"; ERROR {len(self.cq_files_rebuilt)} ConsumeQueue files of the wrong size "
                  f"were removed and rebuilt ({', '.join(self.cq_files_rebuilt)})")
        return s


@dataclass(frozen=True)
class QueueExtent:
    topic: str
    queue_id: int
    min_offset: int
    max_offset: int


@dataclass(frozen=True)
class Recovered:
    report: RecoveryReport
    write_pos: int
    cl_min_offset: int
    last_store_ts: int
    queues: list[QueueExtent]


def recover(config: StoreConfig, files: FileLayer,
            tags_code_rules: Mapping[str, TagsCodeRule] | None = None) -> Recovered:
    """Recover the store (see the module doc). ``tags_code_rules``: topic →
    how the tags codes of its re-dispatched units are computed, for topics
    whose code is not the TAGS hash."""
    rules = dict(tags_code_rules or {})
    t0 = time.perf_counter()
    root = config.storePathRootDir
    seg = config.mappedFileSizeCommitLog
    files.makedirs(root)
    record_paths(config, files)          # StorePathMoved: configured away from the data
    cl = CommitLog(files, config.commitlog_dir, seg, random_faults=True)
    cqs = ConsumeQueues(files, config.consumequeue_dir, config.cq_units_per_file)
    try:
        rep = RecoveryReport(mode="abnormal" if files.exists(abort_path(root)) else "normal")
        rep.temp_files_removed = cl.remove_temporaries()
        segs = cl.list_segments()
        short = _check_segments(cl, segs, seg)
        rep.cq_files_rebuilt = _remove_bad_cq_files(cqs)
        repaired_middle = _repair_short_segments(cl, segs, short, rep)
        if not segs:
            rep.mode = "new"
            queues = _finish_queues(cqs, {}, {}, 0, 0, rep)
            rep.seconds = time.perf_counter() - t0
            return Recovered(rep, 0, 0, 0, queues)
        ckpt = Checkpoint.load(files, root)
        cl_min = segs[0]
        if ckpt is None or ckpt.cl_flushed < 0 or not files.listdir(cqs.dir):
            scan_from = segs[0]
        else:
            scan_from = max(min(ckpt.cl_flushed, ckpt.cq_flushed), segs[0])
            if scan_from >= segs[-1] + seg:
                scan_from = segs[-1]      # past the segments there are: the last one's start
        if repaired_middle or rep.cq_files_rebuilt:
            scan_from = segs[0]   # records lost mid-log, or units lost: re-dispatch everything
            rep.full_redispatch = bool(repaired_middle)
        kept = _kept_extents(cqs, cl_min, scan_from)
        if scan_from % seg and not _record_bound(cl, cqs, scan_from, kept):
            scan_from -= scan_from % seg
            kept = _kept_extents(cqs, cl_min, scan_from)
        dispatch = _Dispatcher(cqs, kept, rep, rules, pad_after=repaired_middle,
                               whole=cl_min == 0)
        flushed = ckpt.cl_flushed if ckpt is not None else -1
        quarantine = _Quarantine(cl, cqs, root, flushed, rep, dispatch)
        damage = DamageLog(files, root)
        for begin, _, _ in damage.load():      # what the scrub found while the broker ran
            if cl_min <= begin < segs[-1] + seg:
                quarantine.listed(begin)
        end, last_ts = _scan(cl, segs, scan_from, config.checkCRCOnRecover, rep, dispatch.chunk,
                             dispatch.pad, quarantine)
        if ckpt is not None and ckpt.cl_flushed > end:
            rep.flushed_lost_bytes = ckpt.cl_flushed - end
        _truncate(cl, segs, end, rep)
        # Retention deletes ConsumeQueue files only after CommitLog segments:
        # with the CommitLog whole from 0, a queue must start at offset 0.
        gap = dispatch.gap or (cl_min == 0 and any(first > 0 for first, _ in kept.values()))
        if gap and scan_from > segs[0]:
            rep.full_redispatch = True
            scan_from = segs[0]
            kept = _kept_extents(cqs, cl_min, scan_from)
            dispatch = _Dispatcher(cqs, kept, rep, rules,
                                   pad_after=repaired_middle or bool(rep.quarantined),
                                   whole=cl_min == 0)
            _scan(cl, segs, scan_from, config.checkCRCOnRecover, RecoveryReport(), dispatch.chunk,
                  dispatch.pad)
        dispatched = dispatch.new_max
        rep.scan_from, rep.end, rep.min_offset = scan_from, end, cl_min
        queues = _finish_queues(cqs, kept, dispatched, cl_min, end, rep)
        _count_lost(rep, dispatch)
        for r in rep.segments_repaired:
            if r.last:
                log.error("recovery: the CommitLog now ends at %d, after the short last segment %s "
                          "(%d bytes of a cut record truncated, %d ConsumeQueue units past the end "
                          "dropped)", end, r.name, rep.bytes_truncated, rep.units_dropped)
        # What survived a process crash may still be only in the page cache:
        # make it durable before anyone counts it as flushed.
        cl.flush(scan_from, end)
        damage.clear()                          # quarantined above, or no longer there
        assert cl_min <= scan_from <= end <= segs[-1] + seg, (
            "recovery: the end lies in the kept segments, at or past where the scan began",
            cl_min, scan_from, end)
        assert all(0 <= q.min_offset <= q.max_offset for q in queues), (
            "recovery: every queue's min offset is at or below its max")
        rep.seconds = time.perf_counter() - t0
        if not last_ts and ckpt is not None:
            # nothing read past the checkpoint (a clean stop): the newest record
            # is the one it names; 0 would checkpoint "no timestamp" until the
            # next append (and a Java broker recovers from the first file on that)
            last_ts = ckpt.physic_ts
        return Recovered(rep, end, cl_min, last_ts, queues)
    finally:
        cl.close()
        cqs.close()


def find_end(cl: CommitLog, segs: list[int], flushed: int) -> int:
    """Where recovery will find the CommitLog's end, found without writing
    (the inspector and Spark read a store no broker owns this way): earlier
    segments end with their BLANK record; the last one at its first invalid
    record past ``flushed`` (the checkpoint's), damage below it being
    stepped over as recovery quarantines it. A last segment with no record
    at its start is usually the one the flusher preallocates: the end is
    then in the segment before it."""
    seg_bytes = cl.segment_bytes
    out = np.empty((SCAN_ROWS, K.N_SCAN), dtype=np.int64)
    for i in range(len(segs) - 1, -1, -1):
        s = segs[i]
        buf = cl.map(s)            # a short file (cut) maps short: past it are zeros
        pos, status, held = 0, K.SCAN_END, 0
        while pos < buf.shape[0]:
            cl.will_need(s + pos, min(s + seg_bytes, s + pos + SCAN_AHEAD_BYTES), data_only=True)
            if pos - held >= SCAN_AHEAD_BYTES:
                cl.drop(s + held, s + pos)
                held = pos
            _, pos, status = K.scan_records(buf, pos, buf.shape[0], s, False, K.CRC_TABLES,
                                            _TAGS_KEY[:0], out)
            if status == K.SCAN_FULL:
                continue
            if status == K.SCAN_CORRUPT and s + pos < flushed:      # damage: recovery steps over
                nxt = next_valid_record(buf, s, pos + 1, buf.shape[0])
                pos = nxt if nxt is not None else min(flushed - s, seg_bytes)
                status = K.SCAN_END
                continue
            break
        if status == K.SCAN_BLANK or pos >= seg_bytes:
            return s + seg_bytes
        if pos > 0 or i == 0:
            return s + pos
    return 0


def _check_segments(cl: CommitLog, segs: list[int], seg: int) -> list[tuple[int, int]]:
    """Refuse what cannot be repaired without losing data; return the short
    segments, (start, size), to repair. Changes nothing."""
    for a, b in zip(segs, segs[1:]):
        if b != a + seg:
            raise RecoveryError(f"CommitLog segment {offset_to_file_name(a + seg)} is missing "
                                f"between {offset_to_file_name(a)} and {offset_to_file_name(b)}")
    short = []
    for s in segs:
        if s % seg:
            raise RecoveryError(f"CommitLog segment {offset_to_file_name(s)} does not start at a "
                                f"multiple of mappedFileSizeCommitLog={seg}")
        size = cl.files.file_size(cl.path(s))
        if size > seg:
            raise RecoveryError(f"CommitLog segment {offset_to_file_name(s)} has {size} bytes, "
                                f"expected mappedFileSizeCommitLog={seg} (the store was made with "
                                f"a larger mappedFileSizeCommitLog: start with that)")
        if size < seg:
            if len(segs) == 1 and _whole_store_of_size(cl, s, size):
                raise RecoveryError(
                    f"CommitLog segment {offset_to_file_name(s)} has {size} bytes, expected "
                    f"mappedFileSizeCommitLog={seg}; its records end cleanly, so the store was "
                    f"probably made with mappedFileSizeCommitLog={size}: start with that. If the "
                    f"file was cut short instead (a copy, a full disk), extend it with zeros "
                    f"(truncate -s {seg} {cl.path(s)}) and start again")
            short.append((s, size))
    return short


def _whole_store_of_size(cl: CommitLog, s: int, size: int) -> bool:
    """Does the segment file at ``s`` look complete at its own ``size``: a
    4096-multiple holding whole records then only zeros, or ending with a
    BLANK record exactly at its end? (A cut file ends mid-record or in data.)"""
    if size <= 0 or size % 4096:
        return False
    h = cl.files.open(cl.path(s), writable=False)
    try:
        buf = cl.files.map(h)
        pos, status = _records_end(buf, s)
        if status == K.SCAN_BLANK:
            return True
        return status == K.SCAN_END and int(K.last_nonzero(buf, pos)) < 0
    finally:
        cl.files.close(h)


def _records_end(buf: np.ndarray, base: int) -> tuple[int, int]:
    """(position past the last whole record of ``buf``, scan status)."""
    out = np.empty((SCAN_ROWS, K.N_SCAN), dtype=np.int64)
    pos = 0
    while True:
        _, pos, status = K.scan_records(buf, pos, buf.shape[0], base, True, K.CRC_TABLES,
                                        _TAGS_KEY, out)
        if status != K.SCAN_FULL:
            return pos, status


def _repair_short_segments(cl: CommitLog, segs: list[int], short: list[tuple[int, int]],
                           rep: RecoveryReport) -> bool:
    """Extend each short segment to full size with zeros; a middle one also
    gets a BLANK record after its last whole record (what was past it is
    gone). Returns whether a middle segment was repaired."""
    seg = cl.segment_bytes
    middle = False
    for s, size in short:
        last = cl.at_or_past_head(segs, s)    # past the write head: only the never durable
        r = SegmentRepair(offset_to_file_name(s), size, seg, last)
        # its records past the cut: never durable (a crash) or lost (a copy, a disk)
        cl.files.extend(cl.path(s), seg)
        if not last:
            middle = True
            buf = cl.map(s)
            pos, status = _records_end(buf[:size], s)
            if status == K.SCAN_BLANK:      # cannot be: a BLANK ends at the full size
                pos = size
            pos = min(pos, seg - 8)
            r.records_end = s + pos
            r.lost_bytes = seg - pos
            cl.zero(s + pos, s + size)        # the record the cut went through
            cl.write_blank(s + pos)
            cl.flush(s, s + seg)
        rep.segments_repaired.append(r)
        log.error("recovery: %s", r.describe())
    return middle


def _remove_bad_cq_files(cqs: ConsumeQueues) -> list[str]:
    """ConsumeQueue files of another size than mappedFileSizeConsumeQueue are
    derived data: remove them (recovery rebuilds them from the CommitLog)."""
    out = []
    for topic, qid in cqs.list_queues():
        for fi in cqs.list_files(topic, qid):
            path = cqs.file_path(topic, qid, fi)
            size = cqs.files.file_size(path)
            if size != cqs.file_bytes:
                log.error("recovery: ConsumeQueue file %s has %d bytes, expected %d: removed, "
                          "rebuilt from the CommitLog", path, size, cqs.file_bytes)
                cqs.files.unlink(path)
                out.append(f"{topic}/{qid}/{offset_to_file_name(fi * cqs.file_bytes)}")
    return out


def _count_lost(rep: RecoveryReport, dispatch: "_Dispatcher") -> None:
    """Give each damaged range (a repaired middle segment, a quarantined
    record) the records counted missing after it: the queue holes padded
    after it and before the next one."""
    middles = [r for r in rep.segments_repaired if not r.last]
    marks = sorted([(r.records_end, r) for r in middles] + [(q.phy, q) for q in rep.quarantined],
                   key=lambda m: m[0])
    for phy, n in dispatch.padded:
        owner = None
        for at, r in marks:
            if at <= phy:
                owner = r
        if owner is not None:
            owner.records_lost += n
            rep.records_lost += n
    for r in middles:
        log.error("recovery: %d records lost with the %d bytes cut from CommitLog segment %s "
                  "(their queue offsets are skipped, never reused)", r.records_lost,
                  r.lost_bytes, r.name)
    for q in rep.quarantined:
        if q.records_lost > len(q.records):
            log.error("recovery: %d records lost with the quarantined range at %d (their queue "
                      "offsets are skipped, never reused)", q.records_lost, q.phy)


def _scan(cl: CommitLog, segs: list[int], scan_from: int, check_crc: bool,
          rep: RecoveryReport, on_rows, on_pad=None, on_damage=None) -> tuple[int, int]:
    """Validate from ``scan_from``, handing each chunk of rows to
    ``on_rows(buf, rows)`` (rows are only valid during the call) and each
    PAD record, in CommitLog order among them, to ``on_pad(pad)``; returns
    (end, store timestamp of the last record). ``on_damage(s, buf, pos)``
    is asked about an invalid record: True when it set the range aside (a
    PAD record now starts there) and the scan goes on."""
    out = np.empty((SCAN_ROWS, K.N_SCAN), dtype=np.int64)
    last_ts = 0
    end = scan_from
    first = scan_from - scan_from % cl.segment_bytes
    for s in segs[segs.index(first):]:
        if s != first:
            cl.drop(s - cl.segment_bytes, s)   # done with the one before: out of this RSS
        buf = cl.map(s)
        pos = held = start = scan_from - s if s == first else 0
        while True:
            begin = pos
            cl.will_need(s + pos, s + pos + SCAN_AHEAD_BYTES,   # large reads, not a fault a page,
                         data_only=True)                        # and no zeros past the end
            if pos - held >= SCAN_AHEAD_BYTES:                  # and one window held, not the segment
                cl.drop(s + held, s + pos)
                held = pos
            n, pos, status = K.scan_records(buf, pos, buf.shape[0], s, check_crc, K.CRC_TABLES,
                                            _TAGS_KEY, out)
            _emit(buf, s, out[:n], begin, pos, on_rows, on_pad, rep)
            if n:
                last_ts = int(out[n - 1, K.S_STORE_TS])
                rep.records_scanned += n
            if status == K.SCAN_CORRUPT and on_damage is not None and on_damage(s, buf, pos):
                continue
            if status != K.SCAN_FULL:
                break
        end = s + pos
        rep.bytes_scanned += pos - start
        if status == K.SCAN_BLANK or (status == K.SCAN_END and pos == buf.shape[0]):
            end = s + buf.shape[0]         # a BLANK, or a PAD, ends the segment
            continue
        if status == K.SCAN_FOREIGN:
            raise RecoveryError(f"record at {s + pos} has the RocketMQ 5 magic (MESSAGE_MAGIC_V2): "
                                f"this store was written by RocketMQ 5 and cannot be served")
        rep.stop_reason = "end" if status == K.SCAN_END else f"corrupt record at {s + pos}"
        break
    return end, last_ts


def _record_bound(cl: CommitLog, cqs: ConsumeQueues, at: int,
                  kept: dict[tuple[str, int], tuple[int, int]]) -> bool:
    """Whether the checkpoint's position ``at`` (inside a segment) is a record
    boundary, so the scan may start there and not at its segment's start:
    a valid record (magic, sizes, PHYSICALOFFSET, body CRC) starts at
    ``at``, or one ends there — the last record a ``kept`` unit points at,
    as at the end of the data after a clean stop. Records name their own
    position, so a checkpoint that is wrong (or from another store) is
    caught here and the scan starts at the segment's start."""
    s = at - at % cl.segment_bytes
    buf = cl.map(s)
    out = np.empty((1, K.N_SCAN), dtype=np.int64)
    n, _, _ = K.scan_records(buf, at - s, buf.shape[0], s, True, K.CRC_TABLES, _TAGS_KEY[:0], out)
    if n and int(out[0, K.S_PHY]) == at:
        return True
    units = (cqs.unit(*key, past - 1) for key, (first, past) in kept.items() if past > first)
    ends = [(phy, size) for phy, size, _ in filter(None, units) if size != K.CQ_PAD_SIZE]
    phy, size = max(ends, key=sum, default=(0, 0))
    if phy + size != at or phy < s:
        return False
    n, _, _ = K.scan_records(buf, phy - s, at - s, s, True, K.CRC_TABLES, _TAGS_KEY[:0], out)
    return n == 1 and int(out[0, K.S_PHY]) == phy and int(out[0, K.S_SIZE]) == size


def _emit(buf: np.ndarray, base: int, rows: np.ndarray, begin: int, stop: int, on_rows, on_pad,
          rep: RecoveryReport) -> None:
    """Hand on, in CommitLog order, the rows scan_records found in
    buf[begin:stop] and the PAD records it skipped: whatever lies before a
    row that does not start where the one before it ended (or ``begin``), and
    after the last row, is pads, since the kernel skips nothing else."""
    n = rows.shape[0]
    if n == 0:
        _pads(buf, base, begin, stop, on_pad, rep)
        return
    at = rows[:, K.S_PHY] - base
    ends = at + rows[:, K.S_SIZE]
    prev = np.concatenate(([begin], ends[:-1]))
    first = 0
    for c in np.flatnonzero(at != prev).tolist():
        if c > first:
            on_rows(buf, rows[first:c])
        _pads(buf, base, int(prev[c]), int(at[c]), on_pad, rep)
        first = c
    on_rows(buf, rows[first:])
    _pads(buf, base, int(ends[-1]), stop, on_pad, rep)


def _pads(buf: np.ndarray, base: int, pos: int, stop: int, on_pad, rep: RecoveryReport) -> None:
    while pos < stop:
        pad = L.read_pad(buf, pos, base)   # scan_records skips nothing but whole pads
        rep.pads += 1
        if on_pad is not None:
            on_pad(pad)
        pos += pad.size


def _truncate(cl: CommitLog, segs: list[int], end: int, rep: RecoveryReport) -> None:
    """Zero the bytes past ``end`` in its segment and delete the segments
    after it (the preallocated next one kept while it is empty). Only what
    the file system says may hold data is read (``CommitLog.last_nonzero``):
    the pages written or cached past the end — after a kill -9 the torn
    tail, after a clean stop with a cold page cache the rest of the end's
    own block — never the preallocated zeros of the rest of the segment."""
    seg = cl.segment_bytes
    end_seg = end - end % seg
    if end_seg in segs:
        last, read = cl.last_nonzero(end, end_seg + seg)
        rep.bytes_read_past_end += read
        if last >= 0:
            rep.bytes_truncated += last + 1 - end
            cl.zero(end, last + 1)
            cl.flush(end, end_seg + seg)
    for s in segs:
        if s <= end_seg:
            continue
        if s == end_seg + seg:
            last, read = cl.last_nonzero(s, s + seg)
            rep.bytes_read_past_end += read
            if last < 0:
                continue  # the preallocated next segment: still empty, keep it
        buf = cl.map(s)
        rep.bytes_truncated += int(np.count_nonzero(buf))
        cl.delete_segment(s)
        rep.segments_deleted.append(offset_to_file_name(s))


def _kept_extents(cqs: ConsumeQueues, cl_min: int, scan_from: int) -> dict[tuple[str, int], tuple[int, int]]:
    """(topic, qid) → (first offset on disk, offset past the last unit pointing
    wholly below ``scan_from``) for every queue on disk."""
    out = {}
    for key in cqs.list_queues():
        ext = cqs.valid_extent(*key, scan_from)
        if ext is not None:
            out[key] = ext
    return out


DAMAGE_FILE = "damaged.json"


class DamageLog:
    """The damaged CommitLog ranges found while the broker runs:
    ``<root>/quarantine/damaged.json``, a list of [begin, end, why]."""

    def __init__(self, files: FileLayer, root: str):
        self.files = files
        self.dir = os.path.join(root, "quarantine")
        self.path = os.path.join(self.dir, DAMAGE_FILE)

    def load(self) -> list[tuple[int, int, str]]:
        raw = self.files.read_bytes(self.path)
        if not raw:
            return []
        try:
            return sorted((int(b), int(e), str(w)) for b, e, w in json.loads(raw))
        except (ValueError, TypeError) as err:
            log.error("%s is not a list of [begin, end, why]: %s; the ranges in it are not "
                      "avoided", self.path, err)
            return []

    def add(self, begin: int, end: int, why: str) -> None:
        ranges = [r for r in self.load() if r[0] != begin] + [(begin, end, why)]
        self.files.makedirs(self.dir)
        self.files.write_durable(self.path, json.dumps(sorted(ranges)).encode())

    def clear(self) -> None:
        if self.files.exists(self.path):
            self.files.unlink(self.path)

    def stamp(self) -> tuple[int, int]:
        """(mtime ns, size) of the file on disk, (0, 0) when there is none:
        the workers reload the ranges when it changes."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return 0, 0
        return st.st_mtime_ns, st.st_size


def damaged_at(ranges: list[tuple[int, int, str]], phy: int, size: int) -> str | None:
    """Why [phy, phy + size) overlaps a listed damaged range, or None."""
    for begin, end, why in ranges:
        if begin < phy + size and phy < end:
            return why
    return None


class _Quarantine:
    """``_scan``'s ``on_damage``: sets aside an invalid record below the
    flushed position (see the module doc); past it, or with no checkpoint,
    an invalid record is a torn write and ends the log (returns False)."""

    QUARANTINE_TOPIC = "SHMQ_QUARANTINED"    # a PAD's topic when the record's queue is unknown

    def __init__(self, cl: CommitLog, cqs: ConsumeQueues, root: str, flushed: int,
                 rep: RecoveryReport, dispatch: "_Dispatcher"):
        self.cl, self.cqs, self.flushed, self.rep, self.dispatch = cl, cqs, flushed, rep, dispatch
        self.dir = os.path.join(root, "quarantine")

    def __call__(self, s: int, buf: np.ndarray, pos: int) -> bool:
        phy = s + pos
        if phy >= self.flushed:
            return False
        seg_end = buf.shape[0]
        self.cl.will_need(phy, min(s + seg_end, phy + SCAN_AHEAD_BYTES),   # the search reads
                          data_only=True)                  # through MADV_RANDOM mappings
        stop = next_valid_record(buf, s, pos + 1, seg_end)
        if stop is None:
            # nothing valid after it in this segment: what was flushed is the
            # range set aside (the checkpoint's positions are record bounds)
            stop = min(self.flushed - s, seg_end)
        # The records the range held, by the ConsumeQueue units pointing into
        # it (derived data written at append: they usually outlive damage to
        # the records), else by the damaged record's own header: each becomes
        # a PAD record at its own position carrying its queue offset.
        tiles = _units_in(self.cqs, phy, s + stop)
        if not tiles or tiles[0][0] != phy:
            tiles.insert(0, (phy, _queue_in_header(buf, pos, stop, s)))
        copy = self._copy(phy, bytes(buf[pos:stop]))
        records = []
        for i, (at, queue) in enumerate(tiles):
            end = tiles[i + 1][0] if i + 1 < len(tiles) else s + stop
            topic, qid, qoff = queue or (self.QUARANTINE_TOPIC, 0, 0)
            if end - at >= L.PAD_FIXED_BYTES + len(topic.encode()):
                head = L.pad_header(L.Pad(at, end - at, topic, qid, qoff, 1 if queue else 0))
                self.cl.zero(at + len(head), end)
                self.cl.write(at, head)
                records += [queue] if queue else []
            elif end == s + seg_end:
                self.cl.zero(at, end)
                self.cl.write_blank(at)       # a damaged BLANK, or a sliver at the segment's end
            else:
                return False                  # too small to hold a record: cannot be set aside
        self.cl.flush(phy, s + stop)
        q = Quarantined(phy, stop - pos, copy, records, records_lost=len(records))
        self.rep.quarantined.append(q)
        self.rep.records_lost += q.records_lost
        self.dispatch.pad_after = True        # queue holes after it are its records: pad them
        log.error("recovery: the record at CommitLog offset %d (segment %s) fails its check "
                  "(magic, sizes, own offset or body CRC) below the flushed position %d: "
                  "quarantined %s; never served, queue offsets never reused; every record "
                  "after it is kept", phy, offset_to_file_name(s), self.flushed, q.describe())
        return True

    def listed(self, begin: int) -> None:
        """Quarantine a range the scrub listed (``DamageLog``), wherever it
        lies: below the scan, its queues' padding units are written here."""
        seg = self.cl.segment_bytes
        s = begin - begin % seg
        buf = self.cl.map(s)
        pos = begin - s
        out = np.empty((1, K.N_SCAN), dtype=np.int64)
        n, _, status = K.scan_records(buf, pos, buf.shape[0], s, True, K.CRC_TABLES,
                                      _TAGS_KEY[:0], out)
        if n or status in (K.SCAN_BLANK, K.SCAN_FULL) or \
                int.from_bytes(buf[pos + 4:pos + 8].tobytes(), "big") == L.PAD_MAGIC:
            return              # whole now (the damage was in memory), or quarantined before
        if self(s, buf, pos):
            for topic, qid, qoff in self.rep.quarantined[-1].records:
                self.cqs.put_padding(topic, qid, qoff, 1)

    def _copy(self, phy: int, data: bytes) -> str:
        path = os.path.join(self.dir, offset_to_file_name(phy))
        try:
            self.cl.files.makedirs(self.dir)
            self.cl.files.write_durable(path, data)
        except OSError as e:
            log.error("recovery: could not copy the damaged bytes at %d to %s: %s", phy, path, e)
            return ""
        return path


def next_valid_record(buf: np.ndarray, s: int, start: int, end: int) -> int | None:
    """Position of the first valid record (a message, a PAD or the segment's
    BLANK) at or after ``start`` in the segment ``buf`` at CommitLog offset
    ``s``: a candidate carries a magic at +4 and must pass scan_records' checks."""
    out = np.empty((1, K.N_SCAN), dtype=np.int64)
    magics = [struct.pack(">I", m) for m in (L.MESSAGE_MAGIC, L.PAD_MAGIC, L.BLANK_MAGIC)]
    window = 1 << 22
    lo = max(start, 0) + 4
    while lo < end:
        hi = min(end, lo + window + 3)
        chunk = buf[lo:hi].tobytes()
        hits = sorted(i for m in magics for i in _find_all(chunk, m))
        for i in hits:
            c = lo + i - 4
            if chunk[i:i + 4] == magics[1]:
                try:
                    if c + L.read_pad(buf, c, s).size <= end:   # a whole PAD record
                        return c
                except ValueError:
                    pass
                continue
            n, _, status = K.scan_records(buf, c, end, s, True, K.CRC_TABLES, _TAGS_KEY[:0], out)
            if n or status == K.SCAN_BLANK:
                return c
        lo += window
    return None


def _find_all(chunk: bytes, needle: bytes):
    i = chunk.find(needle)
    while i >= 0:
        yield i
        i = chunk.find(needle, i + 1)


def _units_in(cqs: ConsumeQueues, lo: int, hi: int) -> list[tuple[int, tuple[str, int, int]]]:
    """(phy, (topic, queue id, queue offset)) of each ConsumeQueue unit on
    disk pointing into [lo, hi), by phy; units closer together than a
    record can be are not believed (a stale unit)."""
    upf = cqs.units_per_file
    found = []
    for topic, qid in cqs.list_queues():
        for fi in cqs.list_files(topic, qid):
            cq = cqs.mapped(topic, qid, fi, create=False)
            if cq is None:
                continue
            units = cq.view(CQ_UNIT_DTYPE)
            phy = units["phy_offset"]
            for i in np.flatnonzero((phy >= lo) & (phy < hi) & (units["size"] > 0)
                                    & (units["size"] != K.CQ_PAD_SIZE)).tolist():
                found.append((int(phy[i]), (topic, qid, fi * upf + i)))
    found.sort()
    out: list[tuple[int, tuple[str, int, int]]] = []
    for at, queue in found:
        if not out or at - out[-1][0] >= L.RECORD_FIXED_BYTES:
            out.append((at, queue))
    return out


def _queue_in_header(buf: np.ndarray, pos: int, stop: int, s: int) -> tuple[str, int, int] | None:
    """(topic, queue id, queue offset) read from a damaged record's header,
    when what it says is consistent: the message magic, its own offset, a
    topic of 1..127 UTF-8 bytes inside [pos, stop)."""
    head = buf[pos:stop].tobytes()
    if len(head) < L.RECORD_FIXED_BYTES:
        return None
    magic, = struct.unpack_from(">I", head, L.OFF_MAGIC)
    qid, = struct.unpack_from(">i", head, L.OFF_QUEUEID)
    qoff, phy = struct.unpack_from(">qq", head, L.OFF_QUEUEOFFSET)
    sysflag, = struct.unpack_from(">i", head, L.OFF_SYSFLAG)
    if magic != L.MESSAGE_MAGIC or phy != s + pos or qid < 0 or qoff < 0:
        return None
    bh = 20 if sysflag & L.SYSFLAG_BORNHOST_V6 else 8
    sh = 20 if sysflag & L.SYSFLAG_STOREHOST_V6 else 8
    q = 48 + bh + 8 + sh + 12
    if q + 4 > len(head):
        return None
    blen, = struct.unpack_from(">i", head, q)
    t = q + 4 + blen
    if blen < 0 or t + 1 > len(head):
        return None
    tlen = head[t]
    if not 1 <= tlen <= L.TOPIC_BYTES_MAX or t + 1 + tlen > len(head):
        return None
    try:
        return head[t + 1:t + 1 + tlen].decode("utf-8"), qid, qoff
    except UnicodeDecodeError:
        return None


class _Dispatcher:
    """Rewrites the ConsumeQueue units of scanned records, chunk by chunk.
    ``new_max``: queue → offset past its last record; ``gap``: some queue's
    first re-dispatched offset lies past its kept units (units were lost).
    A topic in ``rules`` gets its tags codes from its rule."""

    def __init__(self, cqs: ConsumeQueues, kept, rep: RecoveryReport,
                 rules: dict[str, TagsCodeRule], pad_after: bool = False, whole: bool = False):
        self.cqs, self.kept, self.rep, self.rules = cqs, kept, rep, rules
        # ``whole``: the CommitLog starts at 0 (retention deleted nothing), so
        # every queue starts at offset 0 and a first record past 0 follows a hole
        self.whole = whole
        self.new_max: dict[tuple[str, int], int] = {}
        self.gap = False
        # ``pad_after``: records were cut from a middle segment; a queue whose
        # offsets jump past records it had (dispatched or kept) lost those:
        # their units become padding (skipped by readers, offsets never reused)
        self.pad_after = pad_after
        self.padded: list[tuple[int, int]] = []   # (phy of the record after a hole, units padded)
        self.topics: dict[int, str] = {}

    def chunk(self, buf: np.ndarray, rows: np.ndarray) -> None:
        """Write the units of the scanned ``rows`` (``cq_group_rows``: one
        kernel call groups them by queue and lays out their units; then a
        Python step per queue, not per record)."""
        n = rows.shape[0]
        units = np.empty(n, dtype=CQ_UNIT_DTYPE)
        order = np.empty(n, dtype=np.int64)
        qoffs = np.empty(n, dtype=np.int64)
        bounds = np.empty(n + 1, dtype=np.int64)
        anomalies = np.empty(n, dtype=np.int64)
        groups = K.cq_group_rows(rows, units.view(np.uint8), order, qoffs, bounds, anomalies)
        rep, topics = self.rep, self.topics
        for g, a, b in zip(range(groups), bounds[:groups].tolist(), bounds[1:groups + 1].tolist()):
            row = rows[int(order[a])]
            th = int(row[K.S_TOPIC_HASH])
            topic = topics.get(th)
            if topic is None:        # the first record of a topic not seen yet names it
                p, tl = int(row[K.S_TOPIC_POS]), int(row[K.S_TOPIC_LEN])
                topic = topics[th] = buf[p:p + tl].tobytes().decode("utf-8", "replace")
            key = (topic, int(row[K.S_QUEUE_ID]))
            q = qoffs[a:b]
            self._arrive(key, int(q[0]), int(row[K.S_PHY]))
            anomalous = int(anomalies[g])
            rep.offset_anomalies += anomalous
            u = units[a:b]
            rule = self.rules.get(topic)
            if rule is not None:
                u["tags_code"] = _ruled_codes(rule, key, buf, rows[order[a:b]])
            rep.units_rebuilt += _write_units(self.cqs, key, q, u, consecutive=not anomalous)
            self.new_max[key] = int(q[-1]) + 1

    def pad(self, pad: L.Pad) -> None:
        """A PAD record (a claim its appender never finished): its queue
        offsets are padding units again, as the repair that wrote it left them."""
        if not pad.units:
            return
        key = (pad.topic, pad.queue_id)
        self._arrive(key, pad.queue_offset, pad.phy_offset)
        q = np.arange(pad.queue_offset, pad.queue_offset + pad.units, dtype=np.int64)
        units = np.zeros(pad.units, dtype=CQ_UNIT_DTYPE)
        units["size"] = K.CQ_PAD_SIZE
        self.rep.units_rebuilt += _write_units(self.cqs, key, q, units)
        self.new_max[key] = pad.queue_offset + pad.units

    def _arrive(self, key: tuple[str, int], q0: int, phy: int) -> None:
        """The queue ``key`` goes on at offset ``q0`` (a record or a pad at
        ``phy``): note units lost before it, or pad them (``pad_after``)."""
        rep = self.rep
        first, kept = self.kept.get(key, (0, 0))
        expect = self.new_max.get(key, kept)
        known = key in self.new_max or kept > first or self.whole
        if self.pad_after and q0 > expect and known:
            n = q0 - expect
            self.cqs.put_padding(key[0], key[1], expect, n)
            self.padded.append((phy, n))
            expect = q0
        if q0 > expect:
            self.gap = True
        if q0 != expect and key in self.new_max:
            rep.offset_anomalies += 1


def _ruled_codes(rule: TagsCodeRule, key: tuple[str, int], buf: np.ndarray,
                 rows: np.ndarray) -> np.ndarray:
    codes = rule(QueueRecords(key[0], key[1], rows[:, K.S_STORE_TS], buf, rows[:, K.S_PROPS_POS],
                              rows[:, K.S_PROPS_LEN], rows[:, K.S_TAGS_CODE]))
    codes = np.asarray(codes)
    # a rule that answers something else is a bug: crash, never write it
    assert codes.shape == (rows.shape[0],) and codes.dtype.kind == "i", (key, codes.shape, codes.dtype)
    return codes


def _write_units(cqs: ConsumeQueues, key, qoffs: np.ndarray, units: np.ndarray,
                 consecutive: bool = True) -> int:
    """Write ``units`` at their queue offsets ``qoffs`` (``consecutive``:
    each one more than the one before, the usual case: one run); returns
    how many differed on disk. Their pages get blocks first
    (``ConsumeQueues.put_units``): on a full disk a store through the
    mapping into a hole was a SIGBUS that killed the slave or the
    recovering broker; now it is ENOSPC."""
    if consecutive:
        assert int(qoffs[-1]) - int(qoffs[0]) == qoffs.shape[0] - 1, (key, qoffs[0], qoffs[-1])
        return cqs.put_units(key[0], key[1], int(qoffs[0]), units)
    cut = np.flatnonzero(np.diff(qoffs) != 1) + 1     # runs of consecutive offsets, in order
    changed = 0
    for a, b in zip([0] + cut.tolist(), cut.tolist() + [qoffs.shape[0]]):
        changed += cqs.put_units(key[0], key[1], int(qoffs[a]), units[a:b])
    return changed


def _finish_queues(cqs: ConsumeQueues, kept, dispatched, cl_min: int, end: int,
                   rep: RecoveryReport) -> list[QueueExtent]:
    """Zero units past each queue's end; compute min offsets; sync the files."""
    out = []
    upf = cqs.units_per_file
    any_changed = False
    for key in sorted(set(kept) | set(dispatched)):
        mx = dispatched.get(key, kept.get(key, (0, 0))[1])
        files = cqs.list_files(*key)          # as re-dispatch left them
        first = files[0] * upf if files else 0
        changed = key in dispatched
        for fi in files:
            cq = cqs.mapped(key[0], key[1], fi, create=False).reshape(-1, CQ_UNIT_BYTES)
            lo = max(0, mx - fi * upf)
            if lo >= upf:
                continue
            dirty = np.flatnonzero(cq[lo:].any(axis=1))
            if dirty.shape[0]:
                rep.units_dropped += int(dirty.shape[0])
                cq[lo:lo + int(dirty[-1]) + 1] = 0
                changed = True
        mn = cqs.min_offset_from(key[0], key[1], first, mx, cl_min) if mx > first else mx
        any_changed |= changed
        out.append(QueueExtent(key[0], key[1], mn, mx))
    if any_changed:
        cqs.files.sync_filesystem(cqs.dir)
    return out

