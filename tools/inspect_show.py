"""Text for ``shmq store inspect``: each function renders one mode's dict.

The dicts are what ``--json`` prints (``inspect``); this module only lays
them out for a terminal (tables, local times, sizes in KiB/MiB), so the two
outputs never disagree. It reads nothing and decides nothing.
"""
from __future__ import annotations

import os
import time


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
    if not rows:
        return []
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


def summary(doc: dict) -> str:
    segs = doc["segments"]
    data = doc["max_offset"] - doc["min_offset"]
    lines = [f"store       {doc['store']}"]
    if doc["commitlog_dir"] != os.path.join(doc["store"], "commitlog"):
        lines.append(f"CommitLog   in {doc['commitlog_dir']} (storePathCommitLog)")
    lines += [f"state       {_state(doc)}",
              (f"CommitLog   offsets {doc['min_offset']} .. {doc['max_offset']} ({_size(data)} of "
               f"records), {_n(len(segs), 'segment')} of {_size(doc['segment_bytes'])}")]
    lines += _table(["segment", "size", "first", "last", "end", "records", "first store time",
                     "last store time"],
                    [[s["file"], _size(s["size"]), s["first_offset"], s["last_offset"],
                      s["end_offset"], s["records"], _ts(s["first_store_ts"]),
                      _ts(s["last_store_ts"])] for s in segs])
    lines += [f"  {s['file']}: {s['problem']}" for s in segs if s.get("problem")]
    lines += [f"  {s['file']}: empty, made ahead for the records to come (preallocated)"
              for s in segs if s["start"] >= doc["max_offset"] and s["records"] == 0
              and not s.get("problem")]
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


def queue_table(doc: dict) -> str:
    return "\n".join(_table(["topic", "queue", "min", "max", "count", "first store time",
                             "last store time"],
                            [[q["topic"], q["queue_id"], q["min_offset"], q["max_offset"],
                              q["count"], _ts(q["first_store_ts"]), _ts(q["last_store_ts"])]
                             for q in doc["queues"]], indent=""))


def _body_text(m: dict) -> str:
    """The body preview as one line: escaped UTF-8, or hex; "…" if cut."""
    text = repr(m["body"])[1:-1] if m["body_encoding"] == "utf-8" else "hex " + m["body"]
    return text + ("…" if m["body_truncated"] else "")


def message(m: dict) -> str:
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


def queue_range(doc: dict, verbose: bool) -> str:
    head = (f"{doc['topic']}:{doc['queue_id']}  queue offsets [{doc['min_offset']}, "
            f"{doc['max_offset']}), from {doc['from']}: {len(doc['messages'])} records")
    if verbose:
        blocks = [message(m) if "msg_id" in m else
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


def verify(doc: dict) -> str:
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
        lines.append("              below the checkpoint's flushed position the next start "
                     "quarantines it (<store>/quarantine/) and keeps every record after it; "
                     "past it, it is a torn write and the log ends there")
    if q["first_bad"] is not None:
        lines.append(f"BAD UNIT      {q['first_bad']['problem']}")
    lines.append("OK" if doc["ok"] else "FAILED")
    return "\n".join(lines)
