"""The store's live state: published positions and the queue table, over any buffer.

``StoreState`` lays out, in a caller-given buffer, everything the appenders,
readers and the flusher agree on. In a broker the buffer is the POSIX
shared-memory control block (``shmq.ipc.control``) and the lock a named
semaphore; in tests and tools it is private memory and a thread lock. The
store (``store.MessageStore``) talks only to this class, so it runs the same in
one process or many.

Layout (native-endian int64s; every hot counter alone on a 64-byte line so a
writer never invalidates a line another process polls)::

    line  field                 written by          meaning
       0  magic, version, queue_slots, segment_bytes, creator_pid, created_ms
       1  write_pos             publisher           CommitLog end, bytes visible
       2  flushed_pos           flush lock's holder CommitLog durable up to here (the
                                                    flusher, or a worker's group commit:
                                                    core/store.py flush_commitlog)
       3  flush_request_pos     publisher           highest end a SYNC send waits for
       4  confirm_pos,          HA service          the highest CommitLog offset a slave
          ha_slaves, ha_acks                        acked; slaves connected; acks that
                                                    moved confirm_pos (broker/ha/)
       5  claim_seq, claim_pos  claim (locked)      the next claim's sequence number
                                                    and first byte
       6  config_epoch          admin               topics changed: reload
       7  cl_min_offset,        retention           first CommitLog byte kept;
          delete_cl_seq,        admin (a worker)    deleteExpiredCommitLog and
          clean_cq_seq                              cleanExpiredCQ requests so far
                                                    (the flusher serves them)
       8  cq_flushed_pos        flusher             ConsumeQueues durable up to here
       9  last_store_ts         publisher           store timestamp of the last record
      10  flush_seq             flush lock's holder +1 per flush round
      11  queue_slots_used      claim (locked)
      12  state                 owner               0 new, 1 running, 2 stopping
      13  flushed_store_ts      flush lock's holder store timestamp at flushed_pos
      14  disk_full             flusher             0, or the disk's used fraction in
                                                    1/10000 once above
                                                    diskSpaceWarningLevelRatio: sends
                                                    are refused
      15  publish_seq           publisher           claims below this are published
      16  queue_pos             publisher           every claim ending at or below
                                                    has published its queue offsets
      17  dedup_seq,            claim (locked)      keyed appends so far; the
          dedup_entries         owner               window's length (``core.dedup``)

    "publisher": whoever publishes the claim numbered publish_seq: its owner,
    or (under the lock) a process repairing a dead owner's claim; one at a
    time by construction (``store`` module).

    then ``RING_ENTRIES`` × 128-byte claim entries (claim sequence s lives in
    entry s % RING_ENTRIES; int64 words, ``E_*`` below)::

      0 seq     the claim sequence number (written at claim)
      1 state   CLAIMED, then DONE once its bytes and units are all written
      2 start   its first byte: the old claim end (a BLANK goes there on a roll)
      3 phy     its first record (start, or the next segment's first byte)
      4 end     just past its last record
      5 slot    queue slot
      6 q0      its first queue offset
      7 q_end   just past its last queue offset
      8 pid     the owner (0: given up, anyone may repair or publish it)
      9 ticks   the owner's start time (clock ticks since boot: pid reuse)
     10 ts      store timestamp of its records
     11 claimed_ms  wall-clock ms when it was claimed (``MessageStore.busy_ms``)

    then ``queue_slots`` × 320-byte queue slots (``QUEUE_DTYPE``), one line
    per writer, as in the header: the claimant (under the lock), the
    publisher and the flusher each write their own line, so the process
    that claims the next offsets does not invalidate the line every reader
    of the queue polls::

      0 state i4 (0 free, 1 used) | 4 queue_id i4 | 8 topic_len i4
     16 next_offset i8   (max offset: published; readers stop here; publisher)
     24 min_offset i8    (first queue offset still stored; retention, rare)
     64 claim_next i8    (next queue offset to hand out; claim, locked)
    128 cq_flushed i8    (queue offsets below are durable; flusher)
    192 topic u1[128]    (written once, before state)

    then, when ``dedup_entries`` N > 0, the duplicate-send window
    (``core.dedup``): 2N bucket heads, then N × 3-word entries.

Hot paths read and write these through ``words``, one flat int64 memoryview
of the whole block (``words[I_WRITE_POS]``: a Python int in ~25 ns, where a
numpy scalar costs ~80), at the ``I_*``, ``E_*`` and ``Q_*`` indexes.

Visibility rule (x86-64 TSO; an aarch64 port needs release/acquire fences):
an appender writes record bytes, then ConsumeQueue units; the publisher then
writes ``write_pos``, then the queue's ``next_offset``, then ``queue_pos``,
then ``publish_seq``. A reader that loads ``next_offset`` and then reads units
and records below it sees complete data. Slots are filled in the same order:
fields first, ``state`` last.
"""
from __future__ import annotations

import os
import threading
import time
import zlib
from contextlib import contextmanager
from typing import Iterator

import numpy as np

MAGIC = 0x73686D7173746174  # "shmqstat"
VERSION = 6   # 2: disk_full; 3: claims (claim, write, publish); 4: the dedup window;
#               5: claimed_ms in claim entries; 6: a queue slot's writers on their own lines
LINE = 64

_HEADER_FIELDS = [
    "write_pos", "flushed_pos", "flush_request_pos", "confirm_pos", "claim_seq",
    "config_epoch", "cl_min_offset", "cq_flushed_pos", "last_store_ts", "flush_seq", "queue_slots_used", "state", "flushed_store_ts",
    "disk_full", "publish_seq", "queue_pos", "dedup_seq",
]
_names = ["magic", "version", "queue_slots", "segment_bytes", "creator_pid", "created_ms"]
_offsets = [0, 8, 16, 24, 32, 40]
for _i, _f in enumerate(_HEADER_FIELDS, start=1):
    _names.append(_f)
    _offsets.append(_i * LINE)
    if _f == "claim_seq":  # written together, under the lock
        _names.append("claim_pos")
        _offsets.append(_i * LINE + 8)
    if _f == "confirm_pos":  # written together, by the HA service
        _names += ["ha_slaves", "ha_acks"]
        _offsets += [_i * LINE + 8, _i * LINE + 16]
    if _f == "cl_min_offset":  # requests to retention, rare (broker/handlers/admin.py)
        _names += ["delete_cl_seq", "clean_cq_seq"]
        _offsets += [_i * LINE + 8, _i * LINE + 16]
    if _f == "dedup_seq":  # the window's length, set once by the owner
        _names.append("dedup_entries")
        _offsets.append(_i * LINE + 8)
HEADER_BYTES = (len(_HEADER_FIELDS) + 1) * LINE
HEADER_DTYPE = np.dtype({"names": _names, "formats": [np.int64] * len(_names),
                         "offsets": _offsets, "itemsize": HEADER_BYTES})

# Word indexes (int64) of the hot header fields in ``StoreState.words``.
_W = {name: off // 8 for name, off in zip(_names, _offsets)}
I_WRITE_POS = _W["write_pos"]
I_FLUSHED_POS = _W["flushed_pos"]
I_FLUSH_REQUEST_POS = _W["flush_request_pos"]
I_CLAIM_SEQ = _W["claim_seq"]
I_CLAIM_POS = _W["claim_pos"]
I_LAST_STORE_TS = _W["last_store_ts"]
I_CL_MIN_OFFSET = _W["cl_min_offset"]
I_PUBLISH_SEQ = _W["publish_seq"]
I_QUEUE_POS = _W["queue_pos"]
I_DEDUP_SEQ = _W["dedup_seq"]
I_STATE = _W["state"]

# The claim ring.
RING_ENTRIES = 256            # claims in flight at most; a claimant waits when it is full
ENTRY_WORDS = 16              # 128 bytes: two lines
RING_BYTES = RING_ENTRIES * ENTRY_WORDS * 8
RING_BASE = HEADER_BYTES // 8
E_SEQ, E_STATE, E_START, E_PHY, E_END, E_SLOT, E_Q0, E_QEND, E_PID, E_TICKS, E_TS, E_CLAIMED_MS = \
    range(12)
CLAIMED, DONE = 1, 2

TOPIC_BYTES_MAX = 127
QUEUE_DTYPE = np.dtype({
    "names": ["state", "queue_id", "topic_len", "next_offset", "min_offset", "cq_flushed",
              "claim_next", "topic"],
    "formats": [np.int32, np.int32, np.int32, np.int64, np.int64, np.int64, np.int64,
                (np.uint8, 128)],
    "offsets": [0, 4, 8, 16, 24, 128, 64, 192],
    "itemsize": 320,
})
QUEUE_BASE = (HEADER_BYTES + RING_BYTES) // 8   # word index of queue slot 0
Q_WORDS = QUEUE_DTYPE.itemsize // 8
Q_NEXT = 2                                      # next_offset, words into a slot
Q_MIN = 3                                       # min_offset
Q_CLAIM = 8                                     # claim_next
assert QUEUE_DTYPE.fields["next_offset"][1] == Q_NEXT * 8 \
    and QUEUE_DTYPE.fields["min_offset"][1] == Q_MIN * 8 \
    and QUEUE_DTYPE.fields["claim_next"][1] == Q_CLAIM * 8, "Q_* word indexes vs QUEUE_DTYPE"
assert len({QUEUE_DTYPE.fields[f][1] // LINE for f in ("next_offset", "claim_next", "cq_flushed")}) \
    == 3 and QUEUE_DTYPE.itemsize % LINE == 0, "a queue slot's three writers share a line"


def _check_layouts() -> None:
    """The layouts drawn in the module doc, checked against what they are
    built from (import time: a wrong edit fails at once, not in a crash)."""
    spans = sorted((off, off + dt.itemsize, name) for name, (dt, off) in QUEUE_DTYPE.fields.items())
    for (_, end, a), (start, _, b) in zip(spans, spans[1:]):
        assert end <= start, f"QUEUE_DTYPE: {a} overlaps {b}"
    assert spans[-1][1] <= QUEUE_DTYPE.itemsize, "QUEUE_DTYPE: a field past the slot"
    assert QUEUE_DTYPE.fields["topic"][0].itemsize >= TOPIC_BYTES_MAX, "a slot's topic is too short"
    assert E_CLAIMED_MS < ENTRY_WORDS, "claim entry: a field past its words"
    lines = {name: off // LINE for name, off in zip(_names, _offsets)}
    assert len({lines["claim_seq"], lines["publish_seq"], lines["write_pos"],
                lines["flushed_pos"]}) == 4, "claim, publish, write and flush positions share a line"


_check_layouts()

STATE_NEW, STATE_RUNNING, STATE_STOPPING = 0, 1, 2


# a mask of queues, a publish's or a waiting pull's (``ipc.control`` wait_mask):
# bit slot % QUEUE_BITS for a queue slot of the table, NEW_QUEUE for a queue
# with no slot yet (a publish that made one sets it too); -1: any
QUEUE_BITS = 62
NEW_QUEUE = 1 << QUEUE_BITS


def queue_bit(queue_slot: int) -> int:
    return 1 << queue_slot % QUEUE_BITS if queue_slot >= 0 else NEW_QUEUE


def queues_mask(state: "StoreState", queues) -> int:
    """The wait_mask of pulls waiting on ``queues``, (topic, queue id) pairs."""
    mask = 0
    for topic, qid in queues:
        mask |= queue_bit(state.queue_slot(topic, qid))
    return mask


class StoreFullError(RuntimeError):
    """The queue table has no free slot (raise maxQueueSlots)."""


class StoreStopping(RuntimeError):
    """The owner is closing the store: no new claim is taken (a process
    appending beside the broker's workers, client/direct.py, then stops)."""


class ThreadLock:
    """The append lock of a single-process store."""

    def __init__(self):
        self._lock = threading.Lock()

    def acquire(self) -> None:
        self._lock.acquire()

    def release(self) -> None:
        self._lock.release()


def state_bytes(queue_slots: int, dedup_entries: int = 0) -> int:
    return (HEADER_BYTES + RING_BYTES + queue_slots * QUEUE_DTYPE.itemsize
            + dedup_entries * DEDUP_WORDS_PER_ENTRY * 8)


DEDUP_WORDS_PER_ENTRY = 5   # two bucket heads and a 3-word entry (core.dedup)


def start_ticks(pid: int) -> int:
    """Start time of ``pid`` in clock ticks since boot; -1 if it is gone or a
    zombie. (``ipc.control`` reads the same field; core imports no ipc.)"""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return -1
    fields = stat[stat.rindex(b")") + 2:].split()
    if fields[0] in (b"Z", b"X"):
        return -1
    return int(fields[19])


def owner_alive(pid: int, ticks: int) -> bool:
    """Is the owner of a claim still running (pid 0: it gave its claim up)?"""
    return pid > 0 and start_ticks(pid) == ticks


_me: tuple[int, int] | None = None


def me() -> tuple[int, int]:
    """(pid, start ticks) of this process, as claims record their owner."""
    global _me
    if _me is None:
        pid = os.getpid()
        _me = (pid, start_ticks(pid))
    return _me


def _forget_me() -> None:
    global _me
    _me = None


os.register_at_fork(after_in_child=_forget_me)


# the queues remembered as having no slot (``queue_slot``), at most
SLOT_MISSING_KEPT = 4096
_I_SLOTS_USED = _W["queue_slots_used"]


def _slot_hash(topic: bytes, queue_id: int) -> int:
    return zlib.crc32(topic, queue_id & 0xFFFFFFFF)


class StoreState:
    """Typed access to the state in ``buf``; the append lock is ``lock``."""

    def __init__(self, buf, lock, queue_slots: int, offset: int = 0, dedup_entries: int = 0):
        self._buf = buf
        self.lock_impl = lock
        self.header = np.ndarray((1,), HEADER_DTYPE, buf, offset)
        self.ring = np.ndarray((RING_ENTRIES, ENTRY_WORDS), np.int64, buf, offset + HEADER_BYTES)
        self.queues = np.ndarray((queue_slots,), QUEUE_DTYPE, buf,
                                 offset + HEADER_BYTES + RING_BYTES)
        self.queue_slots = queue_slots
        # The whole block as int64 words (the hot paths' way in: see the module doc).
        self.dedup_entries = dedup_entries
        self.nbytes = state_bytes(queue_slots, dedup_entries)
        self.words = memoryview(buf).cast("B")[offset:offset + self.nbytes].cast("q")
        # word indexes of the dedup window's bucket heads and entries
        self.dedup_heads = (HEADER_BYTES + RING_BYTES + queue_slots * QUEUE_DTYPE.itemsize) // 8
        self.dedup_ents = self.dedup_heads + 2 * dedup_entries
        # One-element views: ``v[0]`` reads and writes the shared int64 directly.
        self._v = {name: self.header[name] for name in HEADER_DTYPE.names}
        self.queue_next = self.queues["next_offset"]
        self.queue_min = self.queues["min_offset"]
        self.queue_cq_flushed = self.queues["cq_flushed"]
        self.queue_claim = self.queues["claim_next"]
        self._slot_cache: dict[tuple[str, int], int] = {}
        # (topic, queue id) → queue_slots_used when it was found to have no slot
        self._slot_missing: dict[tuple[str, int], int] = {}
        self._used: np.ndarray | None = None

    # ------------------------------------------------------------- creation
    @classmethod
    def over(cls, buf, lock) -> "StoreState | None":
        """The state an owner laid out in ``buf``, sized from its own header
        (never from a caller's config), or None if it is not laid out yet."""
        header = np.ndarray((1,), HEADER_DTYPE, buf, 0)
        if int(header["magic"][0]) != MAGIC or int(header["version"][0]) != VERSION:
            return None
        return cls(buf, lock, int(header["queue_slots"][0]),
                   dedup_entries=int(header["dedup_entries"][0]))

    @classmethod
    def create_local(cls, queue_slots: int, segment_bytes: int,
                     dedup_entries: int = 0) -> "StoreState":
        buf = bytearray(state_bytes(queue_slots, dedup_entries))
        st = cls(buf, ThreadLock(), queue_slots, dedup_entries=dedup_entries)
        st.initialize(segment_bytes)
        return st

    def initialize(self, segment_bytes: int) -> None:
        h = self.header[0]
        h["version"] = VERSION
        h["queue_slots"] = self.queue_slots
        h["segment_bytes"] = segment_bytes
        h["dedup_entries"] = self.dedup_entries
        h["creator_pid"] = os.getpid()
        h["created_ms"] = int(time.time() * 1000)
        self.header["magic"] = MAGIC  # last: the block is complete

    def is_initialized(self) -> bool:
        return int(self._v["magic"][0]) == MAGIC and int(self._v["version"][0]) == VERSION

    # ------------------------------------------------------ header counters
    def get(self, name: str) -> int:
        return self.words[_W[name]]         # a Python int, as ``int(self._v[name][0])``, 4× faster

    def set(self, name: str, value: int) -> None:
        self._v[name][0] = value

    @property
    def write_pos(self) -> int:
        return self.words[I_WRITE_POS]

    @property
    def flushed_pos(self) -> int:
        return self.words[I_FLUSHED_POS]

    # ---------------------------------------------------------------- lock
    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the append lock. A cross-process lock records its holder, so
        that a holder's death is found and its claims repaired
        (``MessageStore.repair_after_death``)."""
        self.lock_impl.acquire()
        try:
            yield
        finally:
            self.lock_impl.release()

    # ---------------------------------------------------------- queue table
    def queue_slot(self, topic: str, queue_id: int) -> int:
        """Slot of (topic, queue_id), or -1. Lock-free: slots are published
        with their ``state`` written last and are never moved."""
        key = (topic, queue_id)
        slot = self._slot_cache.get(key)
        if slot is not None:
            return slot
        # A queue with no slot (a consumer's retry queue, waited on and looked
        # at every wake-up) is probed again only once a slot was made since:
        # the count is read before the probe, and a slot's state is written
        # before the count moves.
        used = self.words[_I_SLOTS_USED]
        if self._slot_missing.get(key) == used:
            return -1
        slot, found = self._probe(topic.encode(), queue_id)
        if found:
            self._slot_cache[key] = slot
            return slot
        if len(self._slot_missing) >= SLOT_MISSING_KEPT:
            self._slot_missing.clear()
        self._slot_missing[key] = used
        return -1

    def next_offset_word(self, topic: str, queue_id: int) -> int:
        """Index into ``words`` of (topic, queue_id)'s next offset (its max
        offset: ``words[i]``, a Python int in ~30 ns), or -1 while the queue
        has no slot (then its max offset is 0)."""
        slot = self.queue_slot(topic, queue_id)
        return QUEUE_BASE + slot * Q_WORDS + Q_NEXT if slot >= 0 else -1

    def queue_slot_create(self, topic: str, queue_id: int) -> int:
        """Slot of (topic, queue_id), created if absent. Call with the lock held."""
        slot = self.queue_slot(topic, queue_id)
        if slot >= 0:
            return slot
        tb = topic.encode()
        if not 0 < len(tb) <= TOPIC_BYTES_MAX:
            raise ValueError(f"topic {topic!r}: must be 1..{TOPIC_BYTES_MAX} bytes")
        slot, found = self._probe(tb, queue_id)
        if not found:
            if slot < 0:
                raise StoreFullError(f"all {self.queue_slots} queue slots are used "
                                     f"(maxQueueSlots); cannot add {topic}:{queue_id}")
            q = self.queues[slot]
            q["topic"][:len(tb)] = np.frombuffer(tb, np.uint8)
            q["topic_len"] = len(tb)
            q["queue_id"] = queue_id
            q["next_offset"] = 0
            q["min_offset"] = 0
            q["cq_flushed"] = 0
            q["claim_next"] = 0
            self.queues["state"][slot] = 1
            self._v["queue_slots_used"][0] += 1
        self._slot_cache[(topic, queue_id)] = slot
        return slot

    def _probe(self, tb: bytes, queue_id: int) -> tuple[int, bool]:
        n = self.queue_slots
        i = _slot_hash(tb, queue_id) % n
        states = self.queues["state"]
        for _ in range(n):
            if states[i] == 0:
                return i, False
            q = self.queues[i]
            if (q["queue_id"] == queue_id and q["topic_len"] == len(tb)
                    and q["topic"][:len(tb)].tobytes() == tb):
                return i, True
            i = (i + 1) % n
        return -1, False

    def used_slots(self) -> np.ndarray:
        """Indexes of the used slots; rescanned only when the count changes."""
        n = int(self._v["queue_slots_used"][0])
        if self._used is None or self._used.shape[0] != n:
            self._used = np.flatnonzero(self.queues["state"] == 1)
        return self._used

    def slot_key(self, slot: int) -> tuple[str, int]:
        q = self.queues[slot]
        return q["topic"][:int(q["topic_len"])].tobytes().decode(), int(q["queue_id"])

    def iter_queues(self) -> Iterator[tuple[int, str, int]]:
        for slot in self.used_slots():
            topic, qid = self.slot_key(int(slot))
            yield int(slot), topic, qid
