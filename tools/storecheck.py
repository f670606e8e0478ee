"""Check a whole store, read-only: every CommitLog record and every ConsumeQueue unit.

``verify(view)`` walks the segments of a ``StoreView`` with the scan kernel
(``core.reader.walk``: the scan kernel with ``check_crc=True``: magic,
sizes, topic, PHYSICALOFFSET, body CRC; no second parser) and stops at the first bad
record. It checks the ConsumeQueues in the same pass, from the records'
side, the way recovery dispatches them: a record of queue (topic, q) with
queue offset k in [min, max) must be named by unit k of that queue (same
physical offset and size; same tags code, or for the delay-level and timer
topics, which keep a delivery time there, a plausible time). Every unit
matched that way points at a record start; the units left unmatched at the
end are the bad ones (pointing elsewhere, or at a record of another queue or
offset). Memory: one byte per unit checked, for the "matched" marks.

The end of the data is the view's: published positions beside a live broker
(nothing past them is read), else what recovery would keep. Offline, bytes
past the end are reported: a torn write is normal after a crash (recovery
erases it); valid records after an invalid one are not (recovery would cut
them off), and neither is a record failing its CRC below the end.

Never writes: the view's files are O_RDONLY and mapped PROT_READ. A segment
or ConsumeQueue file that retention deletes beside a live broker while this
runs is skipped, not reported.
"""
from __future__ import annotations

import itertools
import re
import time
import zlib

import numpy as np
from shmq.broker.topics import SCHEDULE_TOPIC, TIMER_TOPIC
from shmq.core import layout as L
from shmq.core.reader import scan_out, walk
from shmq.core.commitlog import CommitLog, SegmentMissing
from shmq.core.consumequeue import ConsumeQueues
from shmq.core.records import CorruptRecord, decode
from shmq.broker.live_view import StoreView

SCAN_ROWS = 1 << 16
TAGS_KEY = np.frombuffer(L.PROPERTY_TAGS.encode(), dtype=np.uint8)
# Their ConsumeQueue tags code is a delivery time in epoch ms, not a tag hash
# (broker/delivery.py, read by broker/schedule.py); a tag hash is an int32, so
# a time is at least 2**31 (1970-01-25). Below that the message is due at once.
TIME_CODED_TOPICS = frozenset({SCHEDULE_TOPIC, TIMER_TOPIC})
DELIVERY_TIME_MIN_MS = 1 << 31
RESYNC_CANDIDATES_MAX = 10_000
_MAGIC = L.MESSAGE_MAGIC.to_bytes(4, "big")


def short_segment_note(size: int, segment_bytes, last: bool) -> str:
    """What the inspector says of a segment file shorter than the store's size."""
    what = "its records past the cut are truncated" if last else \
        "the records past its last whole one are lost and reported"
    return (f"short: {size} bytes of {segment_bytes} (cut by a crash, a copy or a full disk); "
            f"the next start repairs it: extends it with zeros, {what}")


def segment_name(start: int) -> str:
    return L.offset_to_file_name(start)


def describe_bad(buf, base: int, rel: int, hi: int, status: int) -> dict:
    """Where and what is wrong with the record the kernel stopped at."""
    phy = base + rel
    out = {"offset": phy, "segment": segment_name(base), "segment_offset": rel}
    if rel + 8 > hi:
        out["problem"] = f"records stop {hi - rel} bytes before the expected end"
        return out
    head = np.asarray(buf[rel:rel + 8]).tobytes()
    size = int.from_bytes(head[:4], "big", signed=True)
    magic = int.from_bytes(head[4:], "big")
    if status == L.SCAN_FOREIGN:
        out["problem"] = "a RocketMQ 5 record (MESSAGE_MAGIC_V2): the store was written by RocketMQ 5"
    elif size == 0:
        out["problem"] = "zeros where a record should start (the records stop here)"
    elif magic == L.BLANK_MAGIC:
        out["problem"] = (f"a BLANK record of {size} bytes that does not reach the segment end "
                          f"({buf.shape[0] - rel} bytes left)")
    elif magic == L.PAD_MAGIC:
        out["problem"] = (f"a PAD record (an append its process never finished) of {size} bytes "
                          f"that is not whole: past the end, not at its own offset, or no topic")
    else:
        out.update(_decode_problem(buf, base, rel, hi))
    return out


def _decode_problem(buf, base: int, rel: int, hi: int) -> dict:
    phy = base + rel
    try:
        m = decode(buf[:hi], rel, check_crc=False)
    except CorruptRecord as e:
        where = "the segment end" if hi == buf.shape[0] else f"the end of the data ({base + hi})"
        text = re.sub(r"^record at \d+: ", "", str(e)).replace("the buffer", where)
        return {"problem": text}
    out = {"topic": m.topic, "queue_id": m.queue_id, "queue_offset": m.queue_offset,
           "size": m.total_size}
    crc = zlib.crc32(m.body) & 0x7FFFFFFF
    if m.phy_offset != phy:
        out["problem"] = f"PHYSICALOFFSET field says {m.phy_offset}, the record is at {phy}"
    elif len(m.topic.encode()) > L.TOPIC_BYTES_MAX:
        out["problem"] = "topic longer than 127 bytes"
    elif crc != m.body_crc:
        out["problem"] = f"body CRC mismatch (stored {m.body_crc:#010x}, computed {crc:#010x})"
    else:
        out["problem"] = "invalid record"
    return out


def records_after(buf, base: int, start: int, stop: int) -> tuple[int, int]:
    """(position, count) of the first run of valid records (CRC checked)
    starting in buf[start:stop]: a record whose magic sits where it should and
    whose PHYSICALOFFSET names its own position; (-1, 0) if none."""
    out = scan_out(SCAN_ROWS)
    tried = 0
    chunk = 64 << 20
    pos = start
    while pos < stop and tried < RESYNC_CANDIDATES_MAX:
        data = np.asarray(buf[pos:min(stop, pos + chunk + 3)]).tobytes()
        i = data.find(_MAGIC)
        while i >= 0 and tried < RESYNC_CANDIDATES_MAX:
            r = pos + i - 4
            if r >= start and r + 36 <= buf.shape[0]:
                tried += 1
                if int.from_bytes(np.asarray(buf[r + 28:r + 36]).tobytes(), "big") == base + r:
                    w = walk(buf, base, r, buf.shape[0], True, out)
                    if w.records:
                        return r, w.records
            i = data.find(_MAGIC, i + 1)
        pos += chunk
    return -1, 0


# ----------------------------------------------------------- ConsumeQueues
class UnitCheck:
    """Matches scanned records with their ConsumeQueue units (see the module
    docstring); ``first_bad`` is the first mismatch in CommitLog order."""

    def __init__(self, view: StoreView, cqs: ConsumeQueues):
        self.view, self.cqs = view, cqs
        self.topics: dict[int, str] = {}
        self.seen: dict[tuple[str, int], np.ndarray] = {}
        self.first_bad: dict | None = None
        self.skipped_files = 0
        self.records_without_queue = 0     # offline: a queue recovery would create
        self.records_past_queue_end = 0    # offline: not dispatched yet (recovery does it)
        self._units: dict[tuple[str, int, int], np.ndarray | None] = {}

    def unit_file(self, topic: str, qid: int, fi: int) -> np.ndarray | None:
        key = (topic, qid, fi)
        if key not in self._units:
            try:
                cq = self.cqs.mapped(topic, qid, fi, create=False)
            except ValueError as e:          # a file of another size than the first one
                cq = None
                if self.first_bad is None:
                    self.first_bad = {"topic": topic, "queue_id": qid,
                                      "queue_offset": fi * self.cqs.units_per_file,
                                      "problem": str(e)}
            self._units[key] = None if cq is None else cq.view(L.CQ_UNIT_DTYPE)
        return self._units[key]

    def chunk(self, buf, rows: np.ndarray) -> None:
        tt = rows[:, L.S_SYSFLAG] & L.SYSFLAG_TRANSACTION_MASK
        keep = (tt != L.SYSFLAG_TRANSACTION_PREPARED) & (tt != L.SYSFLAG_TRANSACTION_ROLLBACK)
        rows = rows[keep] if not keep.all() else rows
        if not rows.shape[0]:
            return
        self._learn_topics(buf, rows)
        th, qid = rows[:, L.S_TOPIC_HASH], rows[:, L.S_QUEUE_ID]
        order = np.lexsort((qid, th))       # stable: each queue's records stay in order
        rows = rows[order]
        th, qid = th[order], qid[order]
        change = np.flatnonzero((th[1:] != th[:-1]) | (qid[1:] != qid[:-1])) + 1
        bounds = np.concatenate(([0], change, [th.shape[0]])).tolist()
        for a, b in itertools.pairwise(bounds):
            self._group((self.topics[int(th[a])], int(qid[a])), rows[a:b])

    def _learn_topics(self, buf, rows: np.ndarray) -> None:
        hashes, first = np.unique(rows[:, L.S_TOPIC_HASH], return_index=True)
        for h, i in zip(hashes.tolist(), first.tolist()):
            if h not in self.topics:
                p, n = int(rows[i, L.S_TOPIC_POS]), int(rows[i, L.S_TOPIC_LEN])
                self.topics[h] = np.asarray(buf[p:p + n]).tobytes().decode("utf-8", "replace")

    def _group(self, key: tuple[str, int], rows: np.ndarray) -> None:
        ext = self.view.queues.get(key)
        if ext is None:
            if not self.view.live:
                self.records_without_queue += rows.shape[0]
            return   # live: a queue created after the snapshot
        q = rows[:, L.S_QUEUE_OFFSET]
        if not self.view.live:
            self.records_past_queue_end += int(np.count_nonzero(q >= ext.max_offset))
        sel = (q >= ext.min_offset) & (q < ext.max_offset)
        if not sel.any():
            return
        rows, q = rows[sel], q[sel]
        seen = self.seen.get(key)
        if seen is None:
            seen = self.seen[key] = np.zeros(ext.max_offset - ext.min_offset, dtype=bool)
        upf = self.cqs.units_per_file
        fis = q // upf
        for fi in np.unique(fis).tolist():
            part = fis == fi
            units = self.unit_file(key[0], key[1], fi)
            if units is None:
                self.skipped_files += 1
                if not self.view.live and self.first_bad is None:
                    self.first_bad = {"topic": key[0], "queue_id": key[1],
                                      "queue_offset": int(q[part][0]),
                                      "problem": "its ConsumeQueue file is missing"}
                continue
            self._compare(key, rows[part], q[part], units[q[part] - fi * upf], seen)

    def _compare(self, key, rows, q, u, seen) -> None:
        where = (u["phy_offset"] == rows[:, L.S_PHY]) & (u["size"] == rows[:, L.S_SIZE])
        timed = key[0] in TIME_CODED_TOPICS
        tags = (u["tags_code"] >= DELIVERY_TIME_MIN_MS) if timed else (
            u["tags_code"] == rows[:, L.S_TAGS_CODE])
        ok = where & tags
        seen[q[ok] - self.view.queues[key].min_offset] = True
        if self.first_bad is not None or ok.all():
            return
        i = int(np.flatnonzero(~ok)[0])
        unit = f"unit {int(q[i])} of {key[0]}:{key[1]}"
        code = int(u[i]["tags_code"])
        if not where[i]:
            problem = (f"{unit} says offset {int(u[i]['phy_offset'])} size {int(u[i]['size'])}; the "
                       f"record with that queue offset is at {int(rows[i, L.S_PHY])} size "
                       f"{int(rows[i, L.S_SIZE])}")
        elif timed:
            problem = (f"{unit}: tags code {code} is not a delivery time (epoch ms), so the "
                       f"message is due at once; was this ConsumeQueue rebuilt from tag hashes?")
        else:
            problem = (f"{unit}: tags code {code}, but the record's TAGS hash to "
                       f"{int(rows[i, L.S_TAGS_CODE])} (tag filters would miss it)")
        self.first_bad = {"topic": key[0], "queue_id": key[1], "queue_offset": int(q[i]),
                          "unit": _unit_dict(u[i]), "problem": problem}

    def finish(self, cl: CommitLog, checked_from: int, checked_below: int) -> None:
        """Look for units no record matched, among those pointing into the
        CommitLog range that was checked (padding units match nothing)."""
        upf = self.cqs.units_per_file
        for key in sorted(self.view.queues):
            ext = self.view.queues[key]
            if self.first_bad is not None:
                return
            seen = self.seen.get(key)
            for fi in range(ext.min_offset // upf, -(-ext.max_offset // upf)):
                lo, hi = max(ext.min_offset, fi * upf), min(ext.max_offset, (fi + 1) * upf)
                units = self.unit_file(key[0], key[1], fi)
                if units is None or hi <= lo:
                    continue    # live: deleted by retention meanwhile (offline: reported)
                u = units[lo - fi * upf:hi - fi * upf]
                bad = ((u["phy_offset"] >= checked_from) & (u["phy_offset"] < checked_below)
                       & (u["size"] != L.CQ_PAD_SIZE))
                if seen is not None:
                    bad &= ~seen[lo - ext.min_offset:hi - ext.min_offset]
                if bad.any():
                    k = int(np.flatnonzero(bad)[0])
                    self._unmatched(cl, key, lo + k, u[k])
                    break

    def _unmatched(self, cl: CommitLog, key: tuple[str, int], off: int, u) -> None:
        phy, size = int(u["phy_offset"]), int(u["size"])
        self.first_bad = {"topic": key[0], "queue_id": key[1], "queue_offset": off,
                          "unit": _unit_dict(u),
                          "problem": f"unit {off} of {key[0]}:{key[1]} points at offset {phy} "
                                     f"size {size}: " + _what_is_at(cl, phy)}

    @property
    def units(self) -> int:
        return sum(max(0, e.max_offset - e.min_offset) for e in self.view.queues.values())


def _unit_dict(u) -> dict:
    return {"offset": int(u["phy_offset"]), "size": int(u["size"]), "tags_code": int(u["tags_code"])}


def _what_is_at(cl: CommitLog, phy: int) -> str:
    seg = cl.segment_bytes
    try:
        buf = cl.map(phy - phy % seg)
        m = decode(buf, phy % seg, check_crc=False)
    except (CorruptRecord, SegmentMissing, ValueError) as e:
        return f"no record starts there ({e!s})"
    if m.phy_offset != phy:
        return "no record starts there"
    return (f"the record there is {m.topic}:{m.queue_id} queue offset {m.queue_offset} "
            f"size {m.total_size}")


# ------------------------------------------------------------------ verify
def verify(view: StoreView) -> dict:
    """Check every record and unit of ``view``; a dict for ``--json`` whose
    ``ok`` says whether anything is wrong."""
    t0 = time.perf_counter()
    cl, cqs = view.commitlog(), view.consumequeues()
    try:
        units = UnitCheck(view, cqs)
        rep = _verify_commitlog(view, cl, units)
        bad = rep["first_bad"]
        units.finish(cl, rep.pop("_checked_from"), rep.pop("_checked_below"))
    finally:
        cl.close()
        cqs.close()
    seconds = time.perf_counter() - t0
    rep["seconds"] = round(seconds, 6)
    rep["mb_per_s"] = round(rep["bytes"] / seconds / 1e6, 1) if seconds > 0 else None
    rep["records_per_s"] = round(rep["records"] / seconds) if seconds > 0 else None
    cq = {"queues": len(view.queues), "units": units.units, "first_bad": units.first_bad,
          "skipped_files": units.skipped_files}
    if not view.live:
        cq["records_not_dispatched"] = units.records_past_queue_end
        cq["records_without_queue"] = units.records_without_queue
    return {"store": view.root, "live": view.live, "ok": bad is None and units.first_bad is None,
            "commitlog": rep, "consumequeue": cq}


def _verify_commitlog(view: StoreView, cl: CommitLog, units: UnitCheck) -> dict:
    out = scan_out(SCAN_ROWS)
    rep = {"segments": 0, "records": 0, "bytes": 0, "min_offset": view.cl_min,
           "end": view.cl_end, "first_bad": None, "skipped_segments": [],
           "_checked_from": view.cl_min, "_checked_below": view.cl_min}
    rep["first_bad"] = _segment_layout_problem(view, cl)
    if rep["first_bad"] is not None:
        return rep   # no record was checked: neither is any unit
    for s in view.segments:
        lo, hi = max(view.cl_min - s, 0), view.data_end(s)
        if hi <= lo:
            continue
        try:
            buf = cl.map(s)
        except SegmentMissing:       # live: retention deleted it after the snapshot
            rep["skipped_segments"].append(segment_name(s))
            rep["_checked_from"] = s + view.segment_bytes
            continue
        w = walk(buf, s, lo, hi, True, out, units.chunk, TAGS_KEY)
        rep["segments"] += 1
        rep["records"] += w.records
        rep["bytes"] += w.pos - lo
        rep["_checked_below"] = s + w.pos
        if w.status == L.SCAN_BLANK or (w.status == L.SCAN_END and s + w.pos == view.cl_end):
            continue
        rep["first_bad"] = describe_bad(buf, s, w.pos, hi, w.status)
        if w.status == L.SCAN_END and hi == view.segment_bytes:
            rep["first_bad"]["problem"] = ("records stop without the BLANK record that ends a full "
                                           "segment (recovery would end the CommitLog here)")
        return rep
    if not view.live:
        rep.update(past_the_end(view, cl))
        after = rep.get("valid_records_after_end")
        if after:
            end = view.cl_end
            rep["first_bad"] = {
                "offset": end, "segment": segment_name(end - end % view.segment_bytes),
                "segment_offset": end % view.segment_bytes,
                "problem": f"the data ends here ({rep['end_reason']}) but {after['records']} valid "
                           f"records follow at {after['offset']}: recovery would cut them off"}
    return rep


def _segment_layout_problem(view: StoreView, cl: CommitLog) -> dict | None:
    """Segments must be contiguous and all of one size (recovery refuses otherwise)."""
    seg = view.segment_bytes
    for a, b in zip(view.segments, view.segments[1:]):
        if b != a + seg:
            return {"offset": a + seg, "segment": segment_name(a + seg),
                    "problem": f"segment {segment_name(a + seg)} is missing between "
                               f"{segment_name(a)} and {segment_name(b)}"}
    for s in view.segments:
        try:
            size = view.files.file_size(cl.path(s))
        except FileNotFoundError:
            continue                 # live: deleted by retention meanwhile
        if size < seg:               # cut short: the next start repairs it (with what it lost)
            return {"offset": s, "segment": segment_name(s),
                    "problem": f"segment {segment_name(s)}: "
                               + short_segment_note(size, seg, cl.at_or_past_head(view.segments, s))}
        if size != seg:
            return {"offset": s, "segment": segment_name(s),
                    "problem": f"segment {segment_name(s)} has {size} bytes, the first one {seg}"}
    return None


def past_the_end(view: StoreView, cl: CommitLog) -> dict:
    """Offline: what lies after the end of the data, in its segment and any
    later one (a torn write, or records recovery would cut off). Found as
    recovery finds it (``CommitLog.last_nonzero``: only what the file system
    says may hold data is read): a scan of the whole mapping read the
    preallocated zeros of the rest of a 1 GiB segment into the page cache,
    where they count as data, and the next start read them all again."""
    seg = view.segment_bytes
    end = view.cl_end
    out = {"bytes_after_end": 0, "end_reason": "zeros follow (the end of the written data)"}
    for s in view.segments:
        if s + seg <= end:
            continue
        try:
            buf = cl.map(s)
        except (SegmentMissing, ValueError):
            continue
        rel = max(end - s, 0)
        last, _ = cl.last_nonzero(s + rel, s + seg)
        torn = last + 1 - (s + rel) if last >= 0 else 0
        if not torn:
            continue
        if out["bytes_after_end"] == 0:
            out["end_reason"] = describe_bad(buf, s, rel, seg, L.SCAN_CORRUPT)["problem"]
        out["bytes_after_end"] += torn
        if "valid_records_after_end" not in out:
            r, n = records_after(buf, s, rel + 1 if s + rel == end else rel, rel + torn)
            if n:
                out["valid_records_after_end"] = {"offset": s + r, "records": n}
    return out
