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
import zlib

from shmq.tools import inspect_show as show

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
    from shmq.core.jit import skip_blas_probe
    skip_blas_probe()                 # a program of shmq's own: see there
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
    from shmq.broker.live_view import NotAStore, StoreView

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
    if not args.store_dir.strip():
        raise InspectError("STORE_DIR is empty: name the broker's storePathRootDir", 2)
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
        return doc, show.verify(doc)
    if args.offset is not None:
        phy = _parse_offset(args.offset)
        if _MSG_ID.match(args.offset) and not view.cl_min <= phy < view.cl_end:
            # a client's msgId (UNIQ_KEY) has the same 32 hex digits as an offset one
            raise InspectError(f"--offset {args.offset}: as an offset msgId, offset {phy}, outside "
                               f"the CommitLog [{view.cl_min}, {view.cl_end}) (deleted by "
                               f"retention, or another broker's); if a producer printed it, it is "
                               f"its UNIQ_KEY: shmq admin queryMsgByUniqueKey -i {args.offset} -t "
                               f"TOPIC finds it")
        doc = message_at(view, phy, args.body)
        return doc, show.message(doc)
    if args.queue is not None:
        doc = queue_range(view, args.topic, args.queue, args.from_offset, count, args.body)
        return doc, show.queue_range(doc, args.verbose)
    if args.queues or args.topic:
        doc = queue_table(view, args.topic)
        return doc, show.queue_table(doc)
    doc = summary(view, _parse_bytes(args.scan_max))
    return doc, show.summary(doc)


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
        "store": view.root, "commitlog_dir": view.config.commitlog_dir,
        "live": view.live, "lock_holder_pid": holder, "abort": abort,
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
        "index_files": index_files(view.config.index_dir),
    }


def _segment_info(view, cl, s: int, budget: int) -> dict:
    from shmq.core import layout as L
    from shmq.core.commitlog import SegmentMissing
    from shmq.core.reader import record_row, scan_out, walk
    from shmq.tools.storecheck import segment_name
    from shmq.tools.storecheck import short_segment_note

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
    hi = min(hi, buf.shape[0])
    if info["size"] < view.segment_bytes:
        info["problem"] = short_segment_note(info["size"], view.segment_bytes,
                                             cl.at_or_past_head(view.segments, s))
    if hi - lo <= budget:
        # cold: read ahead in large requests, and hold one window of the
        # segments walked (newest first, up to --scan-max), not all of them
        w = walk(buf, s, lo, hi, False, scan_out(8192), cl=cl)
        info.update(records=w.records, end_offset=s + w.pos, full=w.status == L.SCAN_BLANK,
                    _walked=w.pos - lo)
        if "problem" not in info and len(view.segments) == 1 and _cut_short(buf, w.pos):
            info["problem"] = short_segment_note(info["size"], "mappedFileSizeCommitLog", True)
        # (a segment wholly past the end is the empty one made ahead of the
        # writer, not records that stop short: the summary says so)
        if w.status != L.SCAN_BLANK and s + w.pos < view.cl_end and "problem" not in info:
            info["problem"] = (f"records stop at {s + w.pos}, before the end of the data "
                               f"({view.cl_end}): see --verify")
        first, last = w.first, w.last
    else:
        first, last = record_row(buf, s, lo, hi)[0], None
    if first is not None:
        info.update(first_offset=int(first[L.S_PHY]), first_store_ts=int(first[L.S_STORE_TS]))
    if last is not None:
        info.update(last_offset=int(last[L.S_PHY]), last_store_ts=int(last[L.S_STORE_TS]))
    return info


def _cut_short(buf, pos: int) -> bool:
    """A sole segment whose size is no segment size (not a multiple of 4096),
    or whose record at ``pos`` runs past the file's end: cut short."""
    n = buf.shape[0]
    if n % 4096:
        return True
    if pos + 8 > n:
        return False
    size = int.from_bytes(buf[pos:pos + 4].tobytes(), "big", signed=True)
    return size > 0 and pos + size > n


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


def index_files(d: str) -> list[dict]:
    """Header of each IndexFile (``<storePathIndex>/<yyyyMMddHHmmssSSS>``)."""
    import numpy as np
    from shmq.core.index import HEADER_DTYPE, NAME_DIGITS

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
    from shmq.core import layout as L
    from shmq.core.commitlog import SegmentMissing
    from shmq.core.reader import record_row

    try:
        u = cqs.unit(topic, qid, off)
        if u is None or u[1] <= 0 or u[1] == L.CQ_PAD_SIZE:
            return None
        phy, size, _ = u
        seg = phy - phy % cl.segment_bytes
        row = record_row(cl.map(seg), seg, phy - seg, min(phy - seg + size, cl.segment_bytes))[0]
    except (SegmentMissing, ValueError):     # deleted meanwhile, or a file of the wrong size
        return None
    return int(row[L.S_STORE_TS]) if row is not None else None


def queue_range(view, topic: str, qid: int, start: int | None, count: int, body_n: int) -> dict:
    """Records ``start`` .. ``start + count - 1`` of a queue, read through its
    units (``core.reader.unit_chunks``), each record as ``--offset`` shows it."""
    from shmq.core import layout as L
    from shmq.core.reader import unit_chunks

    e = _extent(view, topic, qid)
    start = e.min_offset if start is None else start
    if not e.min_offset <= start <= e.max_offset:
        raise InspectError(f"{topic}:{qid} holds queue offsets [{e.min_offset}, {e.max_offset}): "
                           f"--from {start} is outside")
    stop = min(start + count, e.max_offset)
    cl, cqs = view.commitlog(), view.consumequeues()
    msgs = []
    try:
        chunks = unit_chunks(cqs, topic, qid, start, stop, stop - start)
        while True:
            try:
                off, units, _ = next(chunks)
            except StopIteration:
                break
            except ValueError as e:          # a ConsumeQueue file of another size
                raise InspectError(str(e)) from None
            if units is None:
                raise InspectError(f"{topic}:{qid}: the ConsumeQueue file of offset {off} is gone "
                                   f"(deleted by retention?)")
            for u in units:
                phy, size = int(u["phy_offset"]), int(u["size"])
                if size == L.CQ_PAD_SIZE:
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
    from shmq.core import layout as L
    from shmq.core.commitlog import SegmentMissing
    from shmq.core.reader import record_row
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
    except ValueError as e:                  # a segment of another size than the first
        raise InspectError(str(e)) from None
    row, status = record_row(buf, seg, rel, hi)
    if row is not None:
        return _fields(decode(buf[:hi], rel, check_crc=False), segment_name(seg), body_n)
    if status == L.SCAN_BLANK:
        raise InspectError(f"offset {phy} is the BLANK record that ends segment {segment_name(seg)}; "
                           f"the next record is at {seg + view.segment_bytes}")
    inside = _record_containing(view, buf, seg, rel, hi)
    if inside is not None:
        start, size = inside
        raise InspectError(f"no record starts at {phy}: it is inside the record at {start} "
                           f"({size} bytes; --offset {start})")
    raise InspectError(f"no record starts at {phy}: {describe_bad(buf, seg, rel, hi, status)['problem']}")


def _record_containing(view, buf, seg: int, rel: int, hi: int) -> tuple[int, int] | None:
    import numpy as np
    from shmq.core import layout as L
    from shmq.core.reader import scan_out, walk

    found = []

    def look(_, rows):
        i = np.flatnonzero((rows[:, L.S_PHY] <= seg + rel)
                           & (seg + rel < rows[:, L.S_PHY] + rows[:, L.S_SIZE]))
        if i.shape[0]:
            found.append((int(rows[i[0], L.S_PHY]), int(rows[i[0], L.S_SIZE])))

    walk(buf, seg, max(view.cl_min - seg, 0), hi, False, scan_out(8192), look)
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
