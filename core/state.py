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
       1  write_pos             append (locked)     CommitLog end, bytes visible
       2  flushed_pos           flusher             CommitLog durable up to here
       3  flush_request_pos     append (locked)     highest end a SYNC send waits for
       4  confirm_pos           (replication)       reserved
       5  reserve_start, _end,  append (locked)     the append in flight: its bytes,
          _slot, _qnext                             queue slot and next queue offset
       6  config_epoch          admin               topics changed: reload
       7  cl_min_offset         retention           first CommitLog byte kept
       8  cq_flushed_pos        flusher             ConsumeQueues durable up to here
       9  last_store_ts         append (locked)     store timestamp of the last record
      10  flush_seq             flusher             +1 per flush
      11  queue_slots_used      append (locked)
      12  state                 owner               0 new, 1 running, 2 stopping
      13  flushed_store_ts      flusher             store timestamp at flushed_pos
      14  disk_full             flusher             0, or the disk's used fraction in
                                                    1/10000 once above
                                                    diskSpaceWarningLevelRatio: sends
                                                    are refused

    then ``queue_slots`` × 192-byte queue slots (``QUEUE_DTYPE``)::

      0 state i4 (0 free, 1 used) | 4 queue_id i4 | 8 topic_len i4
     16 next_offset i8   (max offset: next queue offset to hand out)
     24 min_offset i8    (first queue offset still stored)
     32 cq_flushed i8    (queue offsets below are durable; flusher)
     64 topic u1[128]

Visibility rule (x86-64 TSO; an aarch64 port needs release/acquire fences):
an appender writes record bytes, then ConsumeQueue units, then ``write_pos``,
then each queue's ``next_offset``. A reader that loads ``next_offset`` and then
reads units and records below it sees complete data. Slots are filled in the
same order: fields first, ``state`` last.
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
VERSION = 2   # 2: disk_full
LINE = 64

_HEADER_FIELDS = [
    "write_pos", "flushed_pos", "flush_request_pos", "confirm_pos", "reserve_start",
    "config_epoch", "cl_min_offset", "cq_flushed_pos", "last_store_ts", "flush_seq", "queue_slots_used", "state", "flushed_store_ts",
    "disk_full",
]
_names = ["magic", "version", "queue_slots", "segment_bytes", "creator_pid", "created_ms"]
_offsets = [0, 8, 16, 24, 32, 40]
for _i, _f in enumerate(_HEADER_FIELDS, start=1):
    _names.append(_f)
    _offsets.append(_i * LINE)
    if _f == "reserve_start":  # the lock holder's in-flight append, one line
        _names += ["reserve_end", "reserve_slot", "reserve_qnext"]
        _offsets += [_i * LINE + 8, _i * LINE + 16, _i * LINE + 24]
HEADER_BYTES = (len(_HEADER_FIELDS) + 1) * LINE
HEADER_DTYPE = np.dtype({"names": _names, "formats": [np.int64] * len(_names),
                         "offsets": _offsets, "itemsize": HEADER_BYTES})

TOPIC_BYTES_MAX = 127
QUEUE_DTYPE = np.dtype({
    "names": ["state", "queue_id", "topic_len", "next_offset", "min_offset", "cq_flushed",
              "topic"],
    "formats": [np.int32, np.int32, np.int32, np.int64, np.int64, np.int64, (np.uint8, 128)],
    "offsets": [0, 4, 8, 16, 24, 32, 64],
    "itemsize": 192,
})

STATE_NEW, STATE_RUNNING, STATE_STOPPING = 0, 1, 2


class StoreFullError(RuntimeError):
    """The queue table has no free slot (raise maxQueueSlots)."""


class ThreadLock:
    """The append lock of a single-process store."""

    def __init__(self):
        self._lock = threading.Lock()

    def acquire(self) -> None:
        self._lock.acquire()

    def release(self) -> None:
        self._lock.release()


def state_bytes(queue_slots: int) -> int:
    return HEADER_BYTES + queue_slots * QUEUE_DTYPE.itemsize


def _slot_hash(topic: bytes, queue_id: int) -> int:
    return zlib.crc32(topic, queue_id & 0xFFFFFFFF)


class StoreState:
    """Typed access to the state in ``buf``; the append lock is ``lock``."""

    def __init__(self, buf, lock, queue_slots: int, offset: int = 0):
        self._buf = buf
        self.lock_impl = lock
        self.header = np.ndarray((1,), HEADER_DTYPE, buf, offset)
        self.queues = np.ndarray((queue_slots,), QUEUE_DTYPE, buf, offset + HEADER_BYTES)
        self.queue_slots = queue_slots
        # One-element views: ``v[0]`` reads and writes the shared int64 directly.
        self._v = {name: self.header[name] for name in HEADER_DTYPE.names}
        self.queue_next = self.queues["next_offset"]
        self.queue_min = self.queues["min_offset"]
        self.queue_cq_flushed = self.queues["cq_flushed"]
        self._slot_cache: dict[tuple[str, int], int] = {}
        self._used: np.ndarray | None = None

    # ------------------------------------------------------------- creation
    @classmethod
    def over(cls, buf, lock) -> "StoreState | None":
        """The state an owner laid out in ``buf``, sized from its own header
        (never from a caller's config), or None if it is not laid out yet."""
        header = np.ndarray((1,), HEADER_DTYPE, buf, 0)
        if int(header["magic"][0]) != MAGIC or int(header["version"][0]) != VERSION:
            return None
        return cls(buf, lock, int(header["queue_slots"][0]))

    @classmethod
    def create_local(cls, queue_slots: int, segment_bytes: int) -> "StoreState":
        buf = bytearray(state_bytes(queue_slots))
        st = cls(buf, ThreadLock(), queue_slots)
        st.initialize(segment_bytes)
        return st

    def initialize(self, segment_bytes: int) -> None:
        h = self.header[0]
        h["version"] = VERSION
        h["queue_slots"] = self.queue_slots
        h["segment_bytes"] = segment_bytes
        h["creator_pid"] = os.getpid()
        h["created_ms"] = int(time.time() * 1000)
        self.header["magic"] = MAGIC  # last: the block is complete

    def is_initialized(self) -> bool:
        return int(self._v["magic"][0]) == MAGIC and int(self._v["version"][0]) == VERSION

    # ------------------------------------------------------ header counters
    def get(self, name: str) -> int:
        return int(self._v[name][0])

    def set(self, name: str, value: int) -> None:
        self._v[name][0] = value

    @property
    def write_pos(self) -> int:
        return int(self._v["write_pos"][0])

    @property
    def flushed_pos(self) -> int:
        return int(self._v["flushed_pos"][0])

    # ---------------------------------------------------------------- lock
    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the append lock. A cross-process lock records its holder, so
        that a holder's death is found and its reservation undone
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
        slot, found = self._probe(topic.encode(), queue_id)
        if found:
            self._slot_cache[key] = slot
            return slot
        return -1

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
