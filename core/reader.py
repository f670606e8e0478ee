"""Reading records back: a queue range or a CommitLog range → records.

Every reader of the store goes through here: the broker's pull (through
``MessageStore.get_message`` and ``MessageStore.pull_body``), the Spark
source, the inspector and the verifier. What it owns:

- **A queue range → positions** (``get_message``): RocketMQ's
  ``DefaultMessageStore.getMessage``. Up to ``max_msgs`` units from a queue
  offset whose tags code passes the filter, within ``max_bytes``, found by
  the ``cq_scan`` kernel into two int64 arrays, with their total bytes: no
  Python object per record (the pull is a hot path). The caller gives the queue's extent: the
  ``StoreState`` published positions in a broker, a ``StoreView``'s snapshot
  offline.
- **Positions → a pull body** (``body_pieces``): the records as few pieces
  as possible (adjacent records joined): a ``FileRange`` of the segment
  file (sendfile) for a big run, a slice of the mapping for a small one.
  All segment arithmetic of a read is here, never in the broker. Records
  read from disk are checked first (``records_valid``: run by run in the
  scan kernel, with the body CRC).
- **A queue range → records** (``unit_chunks``, ``unit_records``): every
  unit of [start, end), file by file (a missing file said, not raised), and
  the records the real units point at, segment by segment, described by the
  ``records_at`` kernel in ``scan_records`` rows, each checked to be its
  unit's record (size, queue id, queue offset). A record that is not its
  unit's is handed on alone, so a reader can skip or report it and go on.
- **Read-ahead for a reader far behind** (``read_ahead``): the CommitLog
  runs that a queue's next units point at, and those units, handed to the
  kernel to read in the background in large requests (posix_fadvise /
  MADV_WILLNEED), so a cold catch-up read is not a fault per page, and it
  brings in the runs of its own queue, not every queue's bytes between them.
- **A CommitLog range → records** (``walk``, ``record_row``): the scan
  kernel over a segment, in chunks of rows; the record at one position.
  (Bytes past an end are recovery's to look for, through the file
  system's extents: ``CommitLog.last_nonzero``.)

It never writes, never decides where the data ends (``StoreState`` or
``view.StoreView`` do) and never takes a lock. Scan rows and statuses are
``layout``'s scan vocabulary (``S_*``, ``SCAN_*``).
"""
from __future__ import annotations

import enum
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from . import _kernels as K
from . import jit
from .commitlog import CommitLog, SegmentMissing
from .consumequeue import ConsumeQueues
from .layout import CQ_UNIT_BYTES
from .records import rows_at

WALK_WINDOW_BYTES = 32 << 20   # a cold walk reads this far ahead and holds about this much
CQ_SCAN_BYTES_MIN = 16000  # DefaultMessageStore: max(16000, maxMsgNums * 20) bytes of CQ per read
_NO_KEY = jit.readonly(np.zeros(0, dtype=np.uint8))
_EMPTY = np.zeros(0, dtype=np.int64)
_NO_ROWS = np.zeros((0, K.N_SCAN), dtype=np.int64)


class GetMessageStatus(enum.Enum):
    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"


class GetResult:
    """What ``get_message`` found. A plain class with slots, read-only by
    convention: one is built per pull, and this costs a quarter of a frozen
    dataclass's construction (~0.3 µs against 1.2)."""
    __slots__ = ("status", "next_offset", "min_offset", "max_offset", "phys", "sizes", "nbytes")

    def __init__(self, status: GetMessageStatus, next_offset: int, min_offset: int,
                 max_offset: int, phys: np.ndarray, sizes: np.ndarray, nbytes: int = -1):
        self.status = status
        self.next_offset = next_offset
        self.min_offset = min_offset
        self.max_offset = max_offset
        self.phys = phys           # CommitLog offsets of the records found
        self.sizes = sizes
        self.nbytes = nbytes       # the sum of ``sizes`` when the scan gave it, else -1

    @property
    def count(self) -> int:
        return int(self.phys.shape[0])

    def __repr__(self) -> str:
        return (f"GetResult({self.status.name}, next_offset={self.next_offset}, "
                f"min_offset={self.min_offset}, max_offset={self.max_offset}, "
                f"count={self.count})")


# ------------------------------------------------------ queue range → positions
def get_message(cqs: ConsumeQueues, topic: str, queue_id: int, offset: int, mn: int, mx: int,
                cl_min: Callable[[], int], max_msgs: int, tag_codes: np.ndarray,
                max_bytes: int) -> GetResult:
    """Up to ``max_msgs`` records of a queue whose units [``mn``, ``mx``)
    are readable, from ``offset``, whose tags code is in the sorted
    ``tag_codes`` (empty: all), within ``max_bytes`` (the first always);
    records below ``cl_min()`` (deleted: asked after the scan, as retention
    may have moved it meanwhile) are left out. The statuses are RocketMQ's;
    ``next_offset`` is where the next read starts."""
    S = GetMessageStatus      # (no closure for the answers: one allocation less per pull)
    if mx == 0:
        return GetResult(S.NO_MESSAGE_IN_QUEUE, 0, mn, mx, _EMPTY, _EMPTY)
    if offset < mn:
        return GetResult(S.OFFSET_TOO_SMALL, mn, mn, mx, _EMPTY, _EMPTY)
    if offset == mx:
        return GetResult(S.OFFSET_OVERFLOW_ONE, offset, mn, mx, _EMPTY, _EMPTY)
    if offset > mx:
        return GetResult(S.OFFSET_OVERFLOW_BADLY, mn if mn == 0 else mx, mn, mx, _EMPTY, _EMPTY)
    units = min(mx - offset, max(CQ_SCAN_BYTES_MIN, max_msgs * CQ_UNIT_BYTES) // CQ_UNIT_BYTES)
    n = min(max_msgs, units)
    out_phy = np.empty(n, np.int64)         # dtype by position: half the call's cost (~0.15 µs)
    out_size = np.empty(n, np.int64)
    r = cqs.scan(topic, queue_id, offset, units, tag_codes, max_msgs, max_bytes, out_phy, out_size)
    if r is None:
        upf = cqs.units_per_file
        return GetResult(S.OFFSET_FOUND_NULL, (offset // upf + 1) * upf, mn, mx, _EMPTY, _EMPTY)
    found, scanned, status, nbytes = r
    if status == K.CQ_BAD:
        raise AssertionError(f"{topic}:{queue_id} unit {offset + scanned} below the "
                             f"readable max {mx} is not a position")
    if not found:
        return GetResult(S.NO_MATCHED_MESSAGE, offset + scanned, mn, mx, _EMPTY, _EMPTY)
    if found < n:
        out_phy, out_size = out_phy[:found], out_size[:found]
    low = cl_min()
    if out_phy[0] < low:
        keep = out_phy >= low
        out_phy, out_size = out_phy[keep], out_size[keep]
        if not out_phy.shape[0]:
            return GetResult(S.MESSAGE_WAS_REMOVING, offset + scanned, mn, mx, _EMPTY, _EMPTY)
        nbytes = -1
    return GetResult(S.FOUND, offset + scanned, mn, mx, out_phy, out_size, nbytes)


# ------------------------------------------------------- positions → pull body
def read_ahead(cl: CommitLog, cqs: ConsumeQueues, topic: str, queue_id: int, offset: int,
               units: int, gap_max: int, runs_max: int = 32) -> int:
    """Ask the kernel to read, in the background, queue units [offset,
    offset + ``units``) (within one ConsumeQueue file) and the CommitLog
    ranges they point at: runs of records closer than ``gap_max`` bytes are
    one request, at most ``runs_max`` requests. Returns the queue offset it
    covered up to (``offset`` when the file is missing). Array work only,
    no Python step per record: for a pull far behind the write position."""
    cqs.will_need(topic, queue_id, offset, units)
    u = cqs.units(topic, queue_id, offset, units)
    if u is None or not u.shape[0]:
        return offset
    phy = u["phy_offset"].astype(np.int64)
    size = u["size"].astype(np.int64)
    real = (size > 0) & (size != K.CQ_PAD_SIZE)
    phy, end = phy[real], phy[real] + size[real]
    if phy.shape[0]:
        cut = np.flatnonzero(phy[1:] - end[:-1] > gap_max) + 1
        lo = np.concatenate(([0], cut))[:runs_max]
        hi = np.concatenate((cut, [phy.shape[0]]))[:runs_max]
        for a, b in zip(phy[lo].tolist(), end[hi - 1].tolist()):
            cl.will_need(a, b, alone=True)
    return offset + u.shape[0]


def body_pieces(cl: CommitLog, phys: np.ndarray, sizes: np.ndarray,
                sendfile_min: int, nbytes: int = -1) -> tuple[list, int]:
    """The records at ``phys``/``sizes`` (published, each inside one
    segment, in CommitLog order) as reply pieces, and their bytes: adjacent
    records joined into one run, a run of ``sendfile_min`` bytes or more as
    a ``FileRange`` of its segment file, a smaller one as a slice of the
    mapping (the reactor sends the slices in one sendmsg). One piece for the
    common pull, whose records lie back to back: told from their first and
    last position and ``nbytes`` (their total, ``GetResult.nbytes``, when
    known) without a Python object per record."""
    n = phys.shape[0]
    if n and nbytes >= 0:
        first = int(phys[0])
        if int(phys[n - 1]) + int(sizes[n - 1]) - first == nbytes:
            return [_piece(cl, first, nbytes, sendfile_min)], nbytes
    p, s = phys.tolist(), sizes.tolist()
    total = sum(s)
    if n and p[-1] + s[-1] - p[0] == total:   # back to back in one segment (the common pull)
        return [_piece(cl, p[0], total, sendfile_min)], total
    parts = []
    i = 0
    while i < n:
        start = p[i]
        end = start + s[i]
        i += 1
        while i < n and p[i] == end:
            end += s[i]
            i += 1
        parts.append(_piece(cl, start, end - start, sendfile_min))
    return parts, total


def records_valid(cl: CommitLog, phys: np.ndarray, sizes: np.ndarray) -> bool:
    """Whether every record at ``phys``/``sizes`` (published) passes the
    check recovery makes (``scan_records`` with the body CRC) and is
    exactly its unit's record: records back to back in one segment are one
    kernel call (a pull's usually all are), so a pull reading from disk
    checks them without a Python step per record. False says only that
    one does not: the caller finds which, and why, record by record.

    Small arrays, so Python lists and no numpy expression: a pull of 32
    records spent 15 µs in numpy's calls around a 2.9 µs kernel."""
    n = phys.shape[0]
    if not n:
        return True
    seg = cl.segment_bytes
    p, s = phys.tolist(), sizes.tolist()
    first, end = p[0], p[-1] + s[-1]
    if end - first == sum(s) and first // seg == (end - 1) // seg:
        edges = [0, n]     # one run (the scan's positions prove each unit's boundaries)
    else:
        edges = [0, *(i for i in range(1, n)
                      if p[i] != p[i - 1] + s[i - 1] or p[i] // seg != p[i - 1] // seg), n]
    out = np.empty((n, K.N_SCAN), dtype=np.int64)
    for a, z in zip(edges, edges[1:]):
        base = p[a] - p[a] % seg
        lo, hi = p[a] - base, p[z - 1] + s[z - 1] - base
        k, pos, _ = K.scan_records(cl.map(base), lo, hi, base, True, K.CRC_TABLES, _NO_KEY, out)
        if k != z - a or pos != hi or out[:k, K.S_PHY].tolist() != p[a:z]:
            return False
    return True


def _piece(cl: CommitLog, start: int, n: int, sendfile_min: int):
    """``n`` CommitLog bytes from ``start`` (inside one segment) as a reply piece."""
    if n >= sendfile_min:
        return cl.file_range(start, n)
    return memoryview(cl.view(start, n))


# ------------------------------------------------------- queue range → records
def unit_chunks(cqs: ConsumeQueues, topic: str, queue_id: int, start: int, end: int,
                max_units: int) -> Iterator[tuple[int, np.ndarray | None, int]]:
    """The units of queue offsets [start, end), in chunks of at most
    ``max_units`` within one file: (first offset, a ``CQ_UNIT_DTYPE`` copy,
    count), or (first offset, None, count) for the offsets whose file is
    missing (deleted by retention, or never written), up to that file's end."""
    upf = cqs.units_per_file
    off = start
    while off < end:
        units = cqs.units(topic, queue_id, off, min(end - off, max_units))
        if units is None:
            n = min((off // upf + 1) * upf, end) - off
            yield off, None, n
        else:
            n = units.shape[0]
            yield off, units, n
        off += n


@dataclass(frozen=True, slots=True)
class RecordRun:
    """Records of consecutive real units of one queue that all lie in one
    segment. ``rows`` (``scan_records`` rows, over ``buf``) describe the
    valid ones, in queue order, ``qoffs`` their queue offsets. Then, when
    ``bad`` is set, one unit that does not point at its record: queue
    offset ``bad_qoff``, CommitLog ``bad_phy``. ``buf`` None: the segment
    is gone, and ``qoffs`` are the queue offsets that pointed into it."""
    base: int
    buf: np.ndarray | None
    rows: np.ndarray
    qoffs: np.ndarray
    bad: bool = False
    bad_qoff: int = -1
    bad_phy: int = -1


def unit_records(cl: CommitLog, queue_id: int, first: int, units: np.ndarray) -> Iterator[RecordRun]:
    """The records the units ``units`` (queue offsets from ``first``) point
    at, as ``RecordRun``s: padding units left out, one ``records_at`` call
    per segment, each record checked to be its unit's (a valid record of
    the unit's size, with the queue's id and the unit's queue offset)."""
    phys = units["phy_offset"].astype(np.int64)
    sizes = units["size"].astype(np.int64)
    real = sizes != K.CQ_PAD_SIZE
    qoffs = np.arange(first, first + units.shape[0], dtype=np.int64)[real]
    phys, sizes = phys[real], sizes[real]
    if not phys.shape[0]:
        return                 # padding alone
    seg = cl.segment_bytes
    bases = phys - phys % seg
    cuts = np.flatnonzero(np.diff(bases)) + 1
    for a, b in zip(np.r_[0, cuts].tolist(), np.r_[cuts, phys.shape[0]].tolist()):
        base = int(bases[a])
        try:
            buf = cl.map(base)
        except (SegmentMissing, FileNotFoundError):
            yield RecordRun(base, None, _NO_ROWS, qoffs[a:b])
            continue
        while a < b:           # a record that is not its unit's is handed on alone
            rows = rows_at(buf, base, phys[a:b], sizes[a:b])
            n = rows.shape[0]
            ok = (rows[:, K.S_QUEUE_ID] == queue_id) & (rows[:, K.S_QUEUE_OFFSET] == qoffs[a:a + n])
            good = n if ok.all() else int(np.argmin(ok))
            if a + good < b:
                yield RecordRun(base, buf, rows[:good], qoffs[a:a + good], True,
                                int(qoffs[a + good]), int(phys[a + good]))
            else:
                yield RecordRun(base, buf, rows[:good], qoffs[a:a + good])
            a += good + 1


# ---------------------------------------------------- CommitLog range → records
@dataclass
class Walk:
    """What one scan of a segment's records found."""
    records: int
    pos: int                       # where the scan stopped, in the segment
    status: int                    # SCAN_*
    first: np.ndarray | None       # scan row of the first record
    last: np.ndarray | None        # scan row of the last record


def scan_out(rows: int) -> np.ndarray:
    """An output for ``walk`` of ``rows`` scan rows (reused across walks)."""
    return np.empty((rows, K.N_SCAN), dtype=np.int64)


def walk(buf: np.ndarray, base: int, lo: int, hi: int, check_crc: bool, out: np.ndarray,
         on_rows: Callable[[np.ndarray, np.ndarray], None] | None = None,
         tags_key: np.ndarray = _NO_KEY, cl: CommitLog | None = None) -> Walk:
    """Scan the records of segment ``buf`` (CommitLog offset ``base``) from
    ``lo`` to ``hi`` (``check_crc``: the body CRC too, as recovery does),
    handing each chunk of rows to ``on_rows(buf, rows)``; ``tags_key``
    (the TAGS property name as bytes) fills the rows' tags codes. With the
    ``cl`` the segment is mapped from, a cold walk: it reads WALK_WINDOW_BYTES
    ahead of itself in large requests and gives back each window it is done
    with (``CommitLog.will_need``, ``drop``), so a walk over a 1 GiB segment
    holds one window of it in the process's RSS; never past ``hi`` nor what
    the file system says holds data (the preallocated zeros past the end,
    read ahead, would be cached and so become data for the next start)."""
    pos, total, first, last = lo, 0, None, None
    held = lo
    while True:
        if cl is not None:
            cl.will_need(base + pos, base + min(hi, pos + WALK_WINDOW_BYTES),  # no zeros past
                         data_only=True)              # the end: cached, they would become data
            if pos - held >= WALK_WINDOW_BYTES:
                cl.drop(base + held, base + pos)
                held = pos
        n, pos, status = K.scan_records(buf, pos, hi, base, check_crc, K.CRC_TABLES, tags_key, out)
        if n:
            if first is None:
                first = out[0].copy()
            last = out[n - 1].copy()
            total += n
            if on_rows is not None:
                on_rows(buf, out[:n])
        if status != K.SCAN_FULL:
            if cl is not None:
                cl.drop(base + held, base + pos)
            return Walk(total, int(pos), int(status), first, last)


def record_row(buf: np.ndarray, base: int, rel: int, hi: int) -> tuple[np.ndarray | None, int]:
    """(scan row, status) of the record at ``rel`` of segment ``buf`` (at
    CommitLog offset ``base``), looking no further than ``hi``: the row
    (structure checked, not the CRC) or None if no valid record starts there."""
    out = np.empty((1, K.N_SCAN), np.int64)
    n, _, status = K.scan_records(buf, rel, hi, base, False, K.CRC_TABLES, _NO_KEY, out)
    return (out[0] if n else None), int(status)


def warm_up_get_message() -> None:
    """Load (or compile) ``get_message``'s scan kernel for a process that
    reads a store through a writable mapping with read-only tag codes (a
    client reading beside the broker, client/direct.py): the broker's own
    processes load theirs by unit (``core/jit.py``) and freeze them."""
    codes = np.zeros(1, np.int64)
    codes.flags.writeable = False
    out = np.zeros(2, np.int64)
    K.cq_scan(np.zeros(40, np.uint8), 0, 1, codes, 1, 1 << 20, out, out)

