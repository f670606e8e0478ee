"""``shmq store inspect``: a read-only look into a store directory.

Summary, per-queue table, one record by CommitLog offset, a queue's records
through its ConsumeQueue, and ``--verify`` (in ``storecheck``); each mode
builds one dict, printed as JSON with ``--json`` or rendered as text, so the
two never disagree. ``USAGE`` below is what ``--help`` shows.

It reads through ``StoreView`` only: files O_RDONLY, mappings PROT_READ, no
lock taken (the lock holder is looked up in /proc/locks), so it never writes
a byte and is safe beside a running broker. With a broker running it reads
up to the positions the broker has published (every record and unit below
them is complete); without one, up to where recovery would end the data,
and it reports what lies past that (a torn write after a crash) without
counting it as an error. Errors users can cause (not a store, an offset
that is no record, an unknown topic) end as ``InspectError``: one line on
stderr and an exit code, never a traceback.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import zlib

import numpy as np

_MODES = "summary, --queues, --offset, -t/-q range, --verify"
USAGE = """\
  shmq store inspect [STORE_DIR]                     summary (STORE_DIR: default ~/store)
  shmq store inspect [STORE_DIR] --queues [-t T]     per topic/queue offsets, counts, times
  shmq store inspect [STORE_DIR] --offset PHY|MSGID  every field of the record at an offset
  shmq store inspect [STORE_DIR] -t T -q Q [--from N] [--count M] [-v]
                                                     a queue's records, through its ConsumeQueue
  shmq store inspect [STORE_DIR] --verify            check every record (structure, body CRC)
                                                     and every ConsumeQueue unit

Read-only: safe beside a running broker, whose published positions bound
what is read. Without a broker, the data ends where the next start's
recovery would end it; bytes past that (a torn write) are reported, not
counted as an error.

--json prints one JSON document (times in epoch ms) in every mode.
Exit codes: 0 done (--verify: nothing wrong); 1 a bad offset, an unknown
topic or queue, or (--verify) a bad record or unit; 2 a usage error or no
store. Errors are one line on stderr.
"""


def add_parser(subparsers) -> None:
    store = subparsers.add_parser("store", help="look into a store directory (read-only)")
    sub = store.add_subparsers(dest="store_command", required=True)
    p = sub.add_parser("inspect", help="segments, queues, records, CRC verification (read-only)",
                       description=USAGE,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("store_dir", nargs="?", default="~/store", metavar="STORE_DIR",
                   help="the broker's storePathRootDir (default ~/store)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--queues", action="store_true",
                      help="per topic/queue: min, max, count, first and last store time")
    mode.add_argument("--offset", metavar="PHY|MSGID",
                      help="decode the record at a CommitLog offset (or an offset message id)")
    mode.add_argument("--verify", action="store_true",
                      help="check every record (CRC, structure) and ConsumeQueue unit")
    p.add_argument("-t", "--topic", help="with --queues: only this topic; with -q: the queue's topic")
    p.add_argument("-q", "--queue", type=int, metavar="QID", help="decode records of this queue")
    p.add_argument("--from", dest="from_offset", type=int, metavar="N",
                   help="first queue offset to decode (default: the queue's min)")
    p.add_argument("--count", type=int, metavar="M",
                   help="records to decode from the queue (default 20)")
    p.add_argument("--body", type=int, default=96, metavar="BYTES",
                   help="body bytes to show per record (default 96; -1: all)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="queue range: every field of each record instead of one line")
    p.add_argument("--scan-max", default="1G", metavar="BYTES",
                   help="summary: record bytes to walk, newest segments first, for record counts "
                        "and last store times (default 1G; 0: none; suffixes K M G)")
    p.add_argument("--json", action="store_true", help="one JSON document instead of tables")
    p.set_defaults(func=run)


class InspectError(Exception):
    """A problem to report on one line of stderr, with an exit code."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def run(args) -> int:
    try:
        doc, text = _dispatch(args)
    except InspectError as e:
        print(f"shmq store inspect: {e}", file=sys.stderr)
        return e.code
    try:
        print(json.dumps(doc, indent=2) if args.json else text, flush=True)
    except BrokenPipeError:        # `... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    if args.verify:
        return 0 if doc["ok"] else 1
    return 0


def _dispatch(args) -> tuple[dict, str]:
    from shmq.tools.storeview import NotAStore, StoreView

    if args.queue is not None and not args.topic:
        raise InspectError("-q needs -t TOPIC", 2)
    if args.queue is None and (args.from_offset is not None or args.count is not None):
        raise InspectError("--from and --count go with -t TOPIC -q QID", 2)
    if (args.topic or args.queue is not None) and (args.offset is not None or args.verify):
        raise InspectError(f"-t/-q do not go with --offset or --verify; one mode of: {_MODES}", 2)
    if args.queue is not None and args.queues:
        raise InspectError("-q decodes a queue's records, --queues lists queues: choose one", 2)
    count = 20 if args.count is None else args.count
    if count <= 0:
        raise InspectError("--count must be positive", 2)
    root = os.path.abspath(os.path.expanduser(args.store_dir))
    try:
        view = StoreView.open(root)
    except NotAStore as e:
        raise InspectError(str(e), 2) from None
    except (OSError, ValueError) as e:
        raise InspectError(f"{root}: cannot read the store: {e}", 2) from None
    if args.verify:
        from shmq.tools.storecheck import verify
        doc = verify(view)
        return doc, _render_verify(doc)
    if args.offset is not None:
        doc = message_at(view, _parse_offset(args.offset), args.body)
        return doc, _render_message(doc)
    if args.queue is not None:
        doc = queue_range(view, args.topic, args.queue, args.from_offset, count, args.body)
        return doc, _render_range(doc, args.verbose)
    if args.queues or args.topic:
        doc = queue_table(view, args.topic)
        return doc, _render_queue_table(doc)
    doc = summary(view, _parse_bytes(args.scan_max))
    return doc, _render_summary(doc)


# ------------------------------------------------------------------ summary
def summary(view, scan_max: int) -> dict:
    """Everything about the store that is cheap to find; per-segment record
    counts within ``scan_max`` bytes of record walking, newest first."""
    from shmq.core.checkpoint import Checkpoint, abort_path
    from shmq.tools.storecheck import past_the_end

    cl = view.commitlog()
    try:
        segments = []
        for s in reversed(view.segments):
            info = _segment_info(view, cl, s, scan_max)
            scan_max -= info.pop("_walked")
            segments.append(info)
        segments.reverse()
        tail = past_the_end(view, cl) if not view.live and view.segments else {}
    finally:
        cl.close()
    ckpt = Checkpoint.load(view.files, view.root)
    abort = os.path.exists(abort_path(view.root))
    holder = lock_holder(view.root)
    return {
        "store": view.root, "live": view.live, "lock_holder_pid": holder, "abort": abort,
        "unclean_shutdown": abort and not view.live and holder is None,
        "segment_bytes": view.segment_bytes, "min_offset": view.cl_min, "max_offset": view.cl_end,
        "segments": segments,
        "bytes_after_end": tail.get("bytes_after_end", 0),
        "end_reason": tail.get("end_reason"),
        "checkpoint": None if ckpt is None else {
            "physic_msg_timestamp": ckpt.physic_ts, "logics_msg_timestamp": ckpt.logics_ts,
            "index_msg_timestamp": ckpt.index_ts, "commitlog_flushed": ckpt.cl_flushed,
            "consumequeue_flushed": ckpt.cq_flushed},
        "queues": [_queue_row(e) for _, e in sorted(view.queues.items())],
        "index_files": index_files(view.root),
    }


def _segment_info(view, cl, s: int, budget: int) -> dict:
    from shmq.core import _kernels as K
    from shmq.core.commitlog import SegmentMissing
    from shmq.tools.storecheck import segment_name, walk

    info = {"file": segment_name(s), "start": s, "size": None, "first_offset": None,
            "last_offset": None, "end_offset": None, "records": None, "full": None,
            "first_store_ts": None, "last_store_ts": None, "_walked": 0}
    lo, hi = max(view.cl_min - s, 0), view.data_end(s)
    try:
        info["size"] = view.files.file_size(cl.path(s))
        buf = cl.map(s)
    except (SegmentMissing, FileNotFoundError):
        info["problem"] = "deleted (retention) since the snapshot"
        return info
    except ValueError as e:
        info["problem"] = str(e)
        return info
    if hi - lo <= budget:
        w = walk(buf, s, lo, hi, False, np.empty((8192, K.N_SCAN), np.int64))
        info.update(records=w.records, end_offset=s + w.pos, full=w.status == K.SCAN_BLANK,
                    _walked=w.pos - lo)
        first, last = w.first, w.last
    else:
        first, last = _record_row(buf, s, lo, hi), None
    if first is not None:
        info.update(first_offset=int(first[K.S_PHY]), first_store_ts=int(first[K.S_STORE_TS]))
    if last is not None:
        info.update(last_offset=int(last[K.S_PHY]), last_store_ts=int(last[K.S_STORE_TS]))
    return info


def _record_row(buf, base: int, rel: int, hi: int):
    """The scan row of the record at ``rel`` (structure checked, not the
    CRC), or None if no valid record starts there."""
    from shmq.core import _kernels as K
    from shmq.tools.storecheck import NO_TAGS

    out = np.empty((1, K.N_SCAN), np.int64)
    n, _, _ = K.scan_records(buf, rel, hi, base, False, K.CRC_TABLES, NO_TAGS, out)
    return out[0] if n else None


def _queue_row(e) -> dict:
    return {"topic": e.topic, "queue_id": e.queue_id, "min_offset": e.min_offset,
            "max_offset": e.max_offset, "count": max(0, e.max_offset - e.min_offset)}


def lock_holder(root: str) -> int | None:
    """Pid holding the store's lock file (a broker, or a tool with the store
    open), from /proc/locks: looking takes no lock."""
    try:
        st = os.stat(os.path.join(root, "lock"))
        with open("/proc/locks") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    want = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    for line in lines:
        parts = line.split()
        if len(parts) > 5 and parts[1] in ("FLOCK", "POSIX") and parts[4].isdigit():
            dev = parts[5].split(":")
            if len(dev) == 3 and (int(dev[0], 16), int(dev[1], 16), int(dev[2])) == want:
                return int(parts[4])
    return None


def index_files(root: str) -> list[dict]:
    """Header of each IndexFile (``index/<yyyyMMddHHmmssSSS>``)."""
    from shmq.core.index import HEADER_DTYPE, INDEX_DIR, NAME_DIGITS

    d = os.path.join(root, INDEX_DIR)
    out = []
    for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        if len(name) != NAME_DIGITS or not name.isdigit():
            continue
        try:
            fd = os.open(os.path.join(d, name), os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            raw, size = os.pread(fd, HEADER_DTYPE.itemsize, 0), os.fstat(fd).st_size
        finally:
            os.close(fd)
        if len(raw) < HEADER_DTYPE.itemsize:
            continue
        h = np.frombuffer(raw, HEADER_DTYPE)[0]
        out.append({"file": name, "size": size, "entries": max(0, int(h["index_count"]) - 1),
                    "begin_store_ts": int(h["begin_ts"]), "end_store_ts": int(h["end_ts"]),
                    "begin_offset": int(h["begin_phy"]), "end_offset": int(h["end_phy"])})
    return out


# ------------------------------------------------------------------- queues
def _extent(view, topic: str, qid: int | None = None):
    queues = sorted(q for t, q in view.queues if t == topic)
    if not queues:
        names = sorted({t for t, _ in view.queues})
        some = ", ".join(names[:12]) + (", …" if len(names) > 12 else "")
        raise InspectError(f"no topic {topic!r} in the store (topics: {some or 'none'})")
    if qid is not None and (topic, qid) not in view.queues:
        raise InspectError(f"topic {topic!r} has no queue {qid} (queues: "
                           f"{', '.join(map(str, queues))})")
    return view.queues.get((topic, qid))


def queue_table(view, topic: str | None) -> dict:
    """Per topic/queue extents, with the store times of their first and last records."""
    if topic:
        _extent(view, topic)
    cl, cqs = view.commitlog(), view.consumequeues()
    rows = []
    try:
        for (t, q), e in sorted(view.queues.items()):
            if topic and t != topic:
                continue
            row = _queue_row(e)
            row["first_store_ts"] = _store_ts(cl, cqs, t, q, e.min_offset) if row["count"] else None
            row["last_store_ts"] = _store_ts(cl, cqs, t, q, e.max_offset - 1) if row["count"] else None
            rows.append(row)
    finally:
        cl.close()
        cqs.close()
    return {"store": view.root, "live": view.live, "queues": rows}


def _store_ts(cl, cqs, topic: str, qid: int, off: int) -> int | None:
    from shmq.core import _kernels as K
    from shmq.core.commitlog import SegmentMissing

    u = cqs.unit(topic, qid, off)
    if u is None or u[1] <= 0 or u[1] == K.CQ_PAD_SIZE:
        return None
    phy, size, _ = u
    seg = phy - phy % cl.segment_bytes
    try:
        row = _record_row(cl.map(seg), seg, phy - seg, min(phy - seg + size, cl.segment_bytes))
    except (SegmentMissing, ValueError):
        return None
    return int(row[K.S_STORE_TS]) if row is not None else None


def queue_range(view, topic: str, qid: int, start: int | None, count: int, body_n: int) -> dict:
    """Records ``start`` .. ``start + count - 1`` of a queue, read through its units."""
    from shmq.core import _kernels as K

    e = _extent(view, topic, qid)
    start = e.min_offset if start is None else start
    if not e.min_offset <= start <= e.max_offset:
        raise InspectError(f"{topic}:{qid} holds queue offsets [{e.min_offset}, {e.max_offset}): "
                           f"--from {start} is outside")
    stop = min(start + count, e.max_offset)
    cl, cqs = view.commitlog(), view.consumequeues()
    msgs = []
    try:
        off = start
        while off < stop:
            units = cqs.units(topic, qid, off, stop - off)
            if units is None:
                raise InspectError(f"{topic}:{qid}: the ConsumeQueue file of offset {off} is gone "
                                   f"(deleted by retention?)")
            for u in units:
                phy, size = int(u["phy_offset"]), int(u["size"])
                if size == K.CQ_PAD_SIZE:
                    msgs.append({"queue_offset": off, "padding": True})
                else:
                    msgs.append(_unit_message(view, cl, topic, qid, off, phy, size, body_n))
                    msgs[-1]["tags_code"] = int(u["tags_code"])
                off += 1
    finally:
        cl.close()
        cqs.close()
    return {"store": view.root, "live": view.live, "topic": topic, "queue_id": qid,
            "min_offset": e.min_offset, "max_offset": e.max_offset, "from": start,
            "messages": msgs}


def _unit_message(view, cl, topic, qid, off, phy, size, body_n) -> dict:
    try:
        m = _message_dict(view, cl, phy, body_n)
    except InspectError as e:
        return {"queue_offset": off, "offset": phy, "size": size, "problem": str(e)}
    want = {"size": size, "topic": topic, "queue_id": qid, "queue_offset": off}
    wrong = [f"{k} {m[k]} (unit: {v})" for k, v in want.items() if m[k] != v]
    if wrong:
        m["problem"] = "the record does not match its unit: " + ", ".join(wrong)
    return m


# ----------------------------------------------------------------- messages
def message_at(view, phy: int, body_n: int) -> dict:
    cl = view.commitlog()
    try:
        doc = _message_dict(view, cl, phy, body_n)
    finally:
        cl.close()
    doc["store"], doc["live"] = view.root, view.live
    return doc


def _message_dict(view, cl, phy: int, body_n: int) -> dict:
    from shmq.core import _kernels as K
    from shmq.core.commitlog import SegmentMissing
    from shmq.core.records import decode
    from shmq.tools.storecheck import describe_bad, segment_name

    if not view.cl_min <= phy < view.cl_end:
        raise InspectError(f"offset {phy} is outside the CommitLog, which holds "
                           f"[{view.cl_min}, {view.cl_end})")
    seg = phy - phy % view.segment_bytes
    rel, hi = phy - seg, view.data_end(seg)
    try:
        buf = cl.map(seg)
    except SegmentMissing:
        raise InspectError(f"segment {segment_name(seg)} of offset {phy} is gone "
                           f"(deleted by retention)") from None
    out = np.empty((1, K.N_SCAN), np.int64)
    n, _, status = K.scan_records(buf, rel, hi, seg, False, K.CRC_TABLES, np.zeros(0, np.uint8), out)
    if n:
        return _fields(decode(buf[:hi], rel, check_crc=False), segment_name(seg), body_n)
    if status == K.SCAN_BLANK:
        raise InspectError(f"offset {phy} is the BLANK record that ends segment {segment_name(seg)}; "
                           f"the next record is at {seg + view.segment_bytes}")
    inside = _record_containing(view, buf, seg, rel, hi)
    if inside is not None:
        start, size = inside
        raise InspectError(f"no record starts at {phy}: it is inside the record at {start} "
                           f"({size} bytes; --offset {start})")
    raise InspectError(f"no record starts at {phy}: {describe_bad(buf, seg, rel, hi, status)['problem']}")


def _record_containing(view, buf, seg: int, rel: int, hi: int) -> tuple[int, int] | None:
    from shmq.core import _kernels as K
    from shmq.tools.storecheck import walk

    found = []

    def look(_, rows):
        i = np.flatnonzero((rows[:, K.S_PHY] <= seg + rel)
                           & (seg + rel < rows[:, K.S_PHY] + rows[:, K.S_SIZE]))
        if i.shape[0]:
            found.append((int(rows[i[0], K.S_PHY]), int(rows[i[0], K.S_SIZE])))

    walk(buf, seg, max(view.cl_min - seg, 0), hi, False, np.empty((8192, K.N_SCAN), np.int64), look)
    return found[0] if found else None


_SYSFLAG_NAMES = ((0x1, "COMPRESSED"), (0x2, "MULTI_TAGS"), (0x10, "BORNHOST_V6"),
                  (0x20, "STOREHOST_V6"))
_TRANSACTION = {0x4: "TRANSACTION_PREPARED", 0x8: "TRANSACTION_COMMIT", 0xC: "TRANSACTION_ROLLBACK"}


def _fields(m, segment: str, body_n: int) -> dict:
    names = [n for bit, n in _SYSFLAG_NAMES if m.sysflag & bit]
    if m.sysflag & 0xC:
        names.append(_TRANSACTION[m.sysflag & 0xC])
    props = m.properties
    shown = m.body if body_n < 0 else m.body[:body_n]
    try:
        body, encoding = shown.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        body, encoding = shown.hex(), "hex"
    return {
        "offset": m.phy_offset, "segment": segment, "size": m.total_size, "topic": m.topic,
        "queue_id": m.queue_id, "queue_offset": m.queue_offset, "sysflag": m.sysflag,
        "sysflag_names": names, "flag": m.flag, "born_timestamp": m.born_timestamp,
        "born_host": _host(m.born_host), "store_timestamp": m.store_timestamp,
        "store_host": _host(m.store_host), "reconsume_times": m.reconsume_times,
        "prepared_offset": m.prepared_offset, "tags": m.tags, "keys": m.keys,
        "properties": props, "msg_id": m.offset_msg_id(), "uniq_key": props.get("UNIQ_KEY"),
        "body_crc": m.body_crc, "body_crc_ok": (zlib.crc32(m.body) & 0x7FFFFFFF) == m.body_crc,
        "body_bytes": len(m.body), "body": body, "body_encoding": encoding,
        "body_truncated": len(shown) < len(m.body)}


def _host(h: tuple[str, int]) -> str:
    return f"[{h[0]}]:{h[1]}" if ":" in h[0] else f"{h[0]}:{h[1]}"


# ---------------------------------------------------------------- arguments
_MSG_ID = re.compile(r"^[0-9A-Fa-f]{32}$|^[0-9A-Fa-f]{56}$")


def _parse_offset(text: str) -> int:
    """A CommitLog offset (decimal or 0x hex), or an offset message id
    (store host + port + offset, 32 or 56 hex digits: its last 16)."""
    if _MSG_ID.match(text):
        return int(text[-16:], 16)
    try:
        value = int(text, 0)
    except ValueError:
        raise InspectError(f"--offset {text!r}: not an offset nor an offset message id", 2) from None
    if value < 0:
        raise InspectError(f"--offset {value}: negative", 2)
    return value


def _parse_bytes(text: str) -> int:
    m = re.fullmatch(r"(\d+)([KMG]?)i?B?", text.strip(), re.IGNORECASE)
    if not m:
        raise InspectError(f"--scan-max {text!r}: expected a size such as 0, 512M, 4G", 2)
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2).upper()]


# -------------------------------------------------------------- rendering
def _ts(ms: int | None) -> str:
    if not ms or ms <= 0:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms // 1000)) + f".{ms % 1000:03d}"


def _n(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} B"


def _table(header: list[str], rows: list[list], indent: str = "  ") -> list[str]:
    cells = [header] + [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return [indent + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]


def _state(doc: dict) -> str:
    if doc["live"]:
        pid = f" (pid {doc['lock_holder_pid']})" if doc["lock_holder_pid"] else ""
        return f"live: a broker{pid} owns the store; read up to the positions it has published"
    if doc["lock_holder_pid"]:
        return (f"in use by pid {doc['lock_holder_pid']}, which publishes no positions: "
                f"read as recovery would find it, while it may be writing")
    if doc["unclean_shutdown"]:
        return "offline, unclean shutdown (abort present): the next start runs abnormal recovery"
    return "offline, clean shutdown" if doc["checkpoint"] else "offline"


_SUMMARY_QUEUES_MAX = 40


def _render_summary(doc: dict) -> str:
    segs = doc["segments"]
    data = doc["max_offset"] - doc["min_offset"]
    lines = [f"store       {doc['store']}", f"state       {_state(doc)}",
             (f"CommitLog   offsets {doc['min_offset']} .. {doc['max_offset']} ({_size(data)} of "
             f"records), {_n(len(segs), 'segment')} of {_size(doc['segment_bytes'])}")]
    lines += _table(["segment", "size", "first", "last", "end", "records", "first store time",
                     "last store time"],
                    [[s["file"], _size(s["size"]), s["first_offset"], s["last_offset"],
                      s["end_offset"], s["records"], _ts(s["first_store_ts"]),
                      _ts(s["last_store_ts"])] for s in segs])
    lines += [f"  {s['file']}: {s['problem']}" for s in segs if s.get("problem")]
    if any(s["records"] is None and not s.get("problem") for s in segs):
        lines.append("  (-: not walked; raise --scan-max to count older segments)")
    if doc["bytes_after_end"]:
        lines.append(f"  past the end: {doc['bytes_after_end']} nonzero bytes ({doc['end_reason']}); "
                     f"a torn write, which the next start erases (--verify tells more)")
    c = doc["checkpoint"]
    lines.append("checkpoint  " + ("none" if c is None else
                 f"physicMsg {_ts(c['physic_msg_timestamp'])}, logicsMsg "
                 f"{_ts(c['logics_msg_timestamp'])}, indexMsg {_ts(c['index_msg_timestamp'])}; "
                 f"flushed: CommitLog {c['commitlog_flushed']}, ConsumeQueues "
                 f"{c['consumequeue_flushed']}"))
    lines.append(f"abort       {'present' if doc['abort'] else 'absent'}")
    qs = doc["queues"]
    topics = {q["topic"] for q in qs}
    lines.append(f"queues      {_n(len(topics), 'topic')}, {_n(len(qs), 'queue')}, "
                 f"{_n(sum(q['count'] for q in qs), 'message')}")
    lines += _table(["topic", "queue", "min", "max", "count"],
                    [[q["topic"], q["queue_id"], q["min_offset"], q["max_offset"], q["count"]]
                     for q in qs[:_SUMMARY_QUEUES_MAX]])
    if len(qs) > _SUMMARY_QUEUES_MAX:
        lines.append(f"  … {len(qs) - _SUMMARY_QUEUES_MAX} more (--queues)")
    ix = doc["index_files"]
    lines.append(f"index       {_n(len(ix), 'file')}, {sum(f['entries'] for f in ix)} entries")
    lines += _table(["file", "entries", "first store time", "last store time", "offsets"],
                    [[f["file"], f["entries"], _ts(f["begin_store_ts"]), _ts(f["end_store_ts"]),
                      f"{f['begin_offset']} .. {f['end_offset']}"] for f in ix]) if ix else []
    return "\n".join(lines)


def _render_queue_table(doc: dict) -> str:
    return "\n".join(_table(["topic", "queue", "min", "max", "count", "first store time",
                             "last store time"],
                            [[q["topic"], q["queue_id"], q["min_offset"], q["max_offset"],
                              q["count"], _ts(q["first_store_ts"]), _ts(q["last_store_ts"])]
                             for q in doc["queues"]], indent=""))


def _body_text(m: dict) -> str:
    """The body preview as one line: escaped UTF-8, or hex; "…" if cut."""
    text = repr(m["body"])[1:-1] if m["body_encoding"] == "utf-8" else "hex " + m["body"]
    return text + ("…" if m["body_truncated"] else "")


def _render_message(m: dict) -> str:
    props = "  ".join(f"{k}={v}" for k, v in m["properties"].items())
    crc = "ok" if m["body_crc_ok"] else "MISMATCH (the body is not what was stored)"
    return "\n".join([
        f"offset        {m['offset']} (segment {m['segment']}), {m['size']} bytes",
        f"msgId         {m['msg_id']}" + (f"   UNIQ_KEY {m['uniq_key']}" if m["uniq_key"] else ""),
        f"topic         {m['topic']}   queueId {m['queue_id']}   queueOffset {m['queue_offset']}",
        (f"sysFlag       {m['sysflag']} ({' '.join(m['sysflag_names']) or '-'})   flag {m['flag']}   "
        f"reconsumeTimes {m['reconsume_times']}   preparedTransactionOffset {m['prepared_offset']}"),
        f"born          {_ts(m['born_timestamp'])} ({m['born_timestamp']}) at {m['born_host']}",
        f"stored        {_ts(m['store_timestamp'])} ({m['store_timestamp']}) at {m['store_host']}",
        f"tags          {m['tags'] or '-'}",
        f"keys          {' '.join(m['keys']) or '-'}",
        f"properties    {props or '-'}",
        f"bodyCRC       {m['body_crc']:#010x} {crc}",
        f"body          {m['body_bytes']} bytes: {_body_text(m)}"] +
        ([f"PROBLEM       {m['problem']}"] if m.get("problem") else []))


def _render_range(doc: dict, verbose: bool) -> str:
    head = (f"{doc['topic']}:{doc['queue_id']}  queue offsets [{doc['min_offset']}, "
            f"{doc['max_offset']}), from {doc['from']}: {len(doc['messages'])} records")
    if verbose:
        blocks = [_render_message(m) if "msg_id" in m else
                  f"queueOffset   {m['queue_offset']}: {m.get('problem', 'padding unit')}"
                  for m in doc["messages"]]
        return "\n\n".join([head] + blocks)
    rows = []
    for m in doc["messages"]:
        if "msg_id" not in m:
            rows.append([m["queue_offset"], m.get("offset"), m.get("size"), "-", "-", "-",
                         m.get("problem", "padding unit")])
            continue
        body = _body_text(m)
        rows.append([m["queue_offset"], m["offset"], m["size"], _ts(m["store_timestamp"]),
                     m["tags"], " ".join(m["keys"]) or None,
                     (body[:60] + f"… ({m['body_bytes']} B)" if len(body) > 60 else body)
                     + ("" if m["body_crc_ok"] else "  [CRC MISMATCH]")
                     + (f"  [{m['problem']}]" if m.get("problem") else "")])
    return "\n".join([head] + _table(["queueOffset", "offset", "size", "store time", "tags",
                                      "keys", "body"], rows))


def _render_verify(doc: dict) -> str:
    c, q = doc["commitlog"], doc["consumequeue"]
    lines = [f"store         {doc['store']} ({'live' if doc['live'] else 'offline'})",
             (f"CommitLog     {_n(c['records'], 'record')}, {_size(c['bytes'])} in "
             f"{_n(c['segments'], 'segment')}: "
             f"{c['seconds']:.3f} s, {c['mb_per_s']} MB/s, {c['records_per_s']} records/s")]
    if c["first_bad"] is None:
        where = f"data ends at {c['end']}"
        if "end_reason" in c:
            where += f": {c['end_reason']}"
        if c.get("bytes_after_end"):
            where += f"; {c['bytes_after_end']} bytes of a torn write after it (the next start erases them)"
        lines.append(f"              {where}")
    if c["skipped_segments"]:
        lines.append(f"              skipped (deleted by retention meanwhile): {', '.join(c['skipped_segments'])}")
    lines.append(f"ConsumeQueue  {_n(q['queues'], 'queue')}, {_n(q['units'], 'unit')}")
    if q.get("records_not_dispatched"):
        lines.append(f"              {q['records_not_dispatched']} records past their queue's end "
                     f"(not dispatched before a crash; the next start does it)")
    if q.get("records_without_queue"):
        lines.append(f"              {q['records_without_queue']} records of queues with no "
                     f"ConsumeQueue (the next start builds them)")
    b = c["first_bad"]
    if b is not None:
        what = f" ({b['topic']}:{b['queue_id']} queue offset {b['queue_offset']})" if "topic" in b else ""
        rel = f" + {b['segment_offset']}" if "segment_offset" in b else ""
        lines.append(f"BAD RECORD    at offset {b['offset']} (segment {b['segment']}{rel}){what}: "
                     f"{b['problem']}")
    if q["first_bad"] is not None:
        lines.append(f"BAD UNIT      {q['first_bad']['problem']}")
    lines.append("OK" if doc["ok"] else "FAILED")
    return "\n".join(lines)
