"""TimerWheel (``core/timer.py``): the timer log and its in-memory index.

The in-memory index (numba kernels) is run against a slow twin, a dict of
lists, on random operation sequences that force hash collisions, deletions
across probe runs and every kind of growth. The wheel as a whole is run
against a plain Python model of the log and of the caller's fire cursor,
with restarts (clean and kill -9 like), torn tails and releases in between:
after every restart the wheel must hand out exactly the deliveries still
owed. Fixed tests pin the byte layout, the check word and each recovery case.
"""
from __future__ import annotations

import os
import random
import shutil
import struct
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition,
                                 rule)

from shmq.core.timer import ENTRY_BYTES, TimerWheel, _SlotIndex, check_words, warm_up

MASK64 = (1 << 64) - 1
BASE_SLOT = 17_000_000_000   # ~ epoch ms / 100 today: big keys for the hash table


@pytest.fixture(scope="module", autouse=True)
def _timer_kernels_loaded():
    warm_up()


# ------------------------------------------------------------------ twins
def naive_check(cq: int, phy: int, size: int, slot: int) -> int:
    """The check word from the module docstring's description, on Python ints."""
    h = 0x54494D45524C4F47
    for v in (cq, phy, size, slot):
        h = ((h ^ (v & MASK64)) * 0x9E3779B97F4A7C15) & MASK64
        h ^= h >> 32
    return struct.unpack(">i", struct.pack(">I", h & 0xFFFFFFFF))[0]


class NaiveSlots:
    """Slow twin of ``_SlotIndex``: slot → list of (phy, size)."""

    def __init__(self):
        self.slots: dict[int, list[tuple[int, int]]] = {}

    @property
    def pending(self) -> int:
        return sum(len(v) for v in self.slots.values())

    def insert(self, phys, sizes, slots) -> None:
        for p, s, k in zip(phys, sizes, slots):
            self.slots.setdefault(int(k), []).append((int(p), int(s)))

    def entries(self, slot: int) -> list[tuple[int, int]]:
        return self.slots.get(slot, [])

    def first_slot(self) -> int | None:
        return min(self.slots, default=None)

    def release(self, below: int) -> int:
        gone = [k for k in self.slots if k < below]
        return sum(len(self.slots.pop(k)) for k in gone)


def pairs(entries: tuple[np.ndarray, np.ndarray]) -> list[tuple[int, int]]:
    phys, sizes = entries
    return list(zip(phys.tolist(), sizes.tolist()))


def disk_entries(root: str) -> dict[int, tuple[int, int, int, int, int]]:
    """Every not-all-zero entry on disk: log index → (cq, phy, size, check, slot),
    parsed with struct from the layout in the module docstring."""
    d = os.path.join(root, "timerlog")
    out = {}
    for name in sorted(os.listdir(d)):
        with open(os.path.join(d, name), "rb") as f:
            data = f.read()
        for i in range(len(data) // ENTRY_BYTES):
            chunk = data[i * ENTRY_BYTES:(i + 1) * ENTRY_BYTES]
            if any(chunk):
                out[int(name) + i] = struct.unpack(">qqiiq", chunk)
    return out


def log_files(root: str) -> list[str]:
    return sorted(os.listdir(os.path.join(root, "timerlog")))


def arrays(cqs, phys, sizes, slots):
    return tuple(np.asarray(v, dtype=np.int64) for v in (cqs, phys, sizes, slots))


def add(w: TimerWheel, cqs, slots, fire_slot: int) -> None:
    """Entries whose phy is 1000 × cq and size cq + 1, so each names its cq."""
    cqs = list(cqs)
    w.add(*arrays(cqs, [1000 * c for c in cqs], [c + 1 for c in cqs], slots), fire_slot)


def phys_of(w: TimerWheel, slot: int) -> list[int]:
    return w.slot_entries(slot)[0].tolist()


def opened(root: str, fire_slot: int = 0, fired: int = 0, file_entries: int = 4) -> TimerWheel:
    w = TimerWheel(root, file_entries=file_entries)
    w.open(fire_slot, fired)
    return w


# ------------------------------------------------------------- the format
def test_entry_layout_and_check_word(tmp_path):
    w = opened(str(tmp_path))
    w.add(*arrays([7], [123456789012], [345], [BASE_SLOT]), fire_slot=5)
    w.close()
    cq, phy, size, check, slot = disk_entries(str(tmp_path))[0]
    assert (cq, phy, size, slot) == (7, 123456789012, 345, BASE_SLOT)
    assert check == naive_check(7, 123456789012, 345, BASE_SLOT)


@given(st.lists(st.tuples(st.integers(-2**63, 2**63 - 1), st.integers(-2**63, 2**63 - 1),
                          st.integers(-2**31, 2**31 - 1), st.integers(-2**63, 2**63 - 1)),
                min_size=1, max_size=20))
@settings(max_examples=100, deadline=None)
def test_check_words_matches_twin(fields):
    got = check_words(*(np.array(c, dtype=np.int64) for c in zip(*fields)))
    assert got.tolist() == [naive_check(*f) for f in fields]


def test_check_word_rejects_a_never_written_entry():
    assert check_words([0], [0], [0], [0])[0] != 0


# ------------------------------------------------------------- the index
KEYS = st.one_of(st.integers(0, 40), st.integers(BASE_SLOT, BASE_SLOT + 40),
                 st.sampled_from([1 << 20, 2 << 20, 3 << 20, 1 << 40]))


@given(ops=st.lists(st.one_of(
    st.tuples(st.just("insert"), st.lists(KEYS, max_size=40)),
    st.tuples(st.just("release"), KEYS)), max_size=25))
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_slot_index_matches_naive_twin(ops):
    index, twin = _SlotIndex(nodes=1, buckets=2), NaiveSlots()
    seen: set[int] = set()
    serial = 0
    for op, arg in ops:
        if op == "insert":
            slots = np.array(arg, dtype=np.int64)
            phys = np.arange(serial, serial + len(arg), dtype=np.int64)
            sizes = phys * 7 + 1
            serial += len(arg)
            index.insert(phys, sizes, slots)
            twin.insert(phys, sizes, slots)
            seen.update(arg)
        else:
            assert index.release(arg) == twin.release(arg)
        assert index.pending == twin.pending
        assert index.first_slot() == twin.first_slot()
        for key in seen:
            assert pairs(index.entries(key)) == twin.entries(key), key


# ---------------------------------------------------------- fixed stories
def test_empty_log(tmp_path):
    root = str(tmp_path)
    w = opened(root, fire_slot=BASE_SLOT)
    assert (w.next_cq_offset, w.pending, w.next_due_slot()) == (-1, 0, None)
    assert phys_of(w, BASE_SLOT) == []
    assert w.release(BASE_SLOT + 10) == 0
    w.close()
    w = opened(root, fire_slot=BASE_SLOT)
    assert (w.next_cq_offset, w.pending, log_files(root)) == (-1, 0, [])
    w.close()


def test_slot_keeps_add_order_and_late_entries_join_the_fire_slot(tmp_path):
    w = opened(str(tmp_path), fire_slot=100)
    add(w, [0, 1, 2], [105, 103, 105], fire_slot=100)
    add(w, [3, 4], [105, 90], fire_slot=100)      # 90 is late: fires at 100
    add(w, [5], [100], fire_slot=100)
    assert phys_of(w, 105) == [0, 2000, 3000]
    assert phys_of(w, 100) == [4000, 5000]
    assert w.next_due_slot() == 100
    w.release(101)
    add(w, [6, 7], [50, 104], fire_slot=104)     # a cursor at 104: 50 joins 104
    assert phys_of(w, 104) == [6000, 7000]
    assert (w.next_due_slot(), w.pending, w.next_cq_offset) == (103, 6, 8)
    assert w.slot_entries(105)[1].tolist() == [1, 3, 4]
    with pytest.raises(AssertionError):
        add(w, [8], [200], fire_slot=100)         # a cursor behind a release: a caller bug
    w.close()


def test_restart_reproduces_the_remaining_deliveries(tmp_path):
    root = str(tmp_path)
    w = opened(root, fire_slot=10)
    add(w, range(7), [12, 11, 12, 11, 13, 12, 11], fire_slot=10)
    w.close()
    # after add, nothing fired
    w = opened(root, fire_slot=10)
    assert [phys_of(w, s) for s in (11, 12, 13)] == [[1000, 3000, 6000], [0, 2000, 5000], [4000]]
    w.close()
    # mid-slot: two of slot 11 fired; the list starts after them
    w = opened(root, fire_slot=11, fired=2)
    assert phys_of(w, 11) == [6000]
    add(w, [7, 8], [5, 12], fire_slot=11)         # late 5 → end of 11
    assert phys_of(w, 11) == [6000, 7000]
    w.close()
    w = opened(root, fire_slot=11, fired=3)
    assert phys_of(w, 11) == [7000]
    assert w.pending == 1 + 4 + 1
    w.release(12)
    w.close()
    # after release: the cursor persisted at (12, 0)
    w = opened(root, fire_slot=12, fired=0)
    assert phys_of(w, 11) == []
    assert phys_of(w, 12) == [0, 2000, 5000, 8000]
    assert (w.next_due_slot(), w.pending, w.next_cq_offset) == (12, 5, 9)
    w.close()
    # the whole fire slot fired: it is not loaded at all
    w = opened(root, fire_slot=12, fired=4)
    assert (w.next_due_slot(), phys_of(w, 12)) == (13, [])
    w.close()
    with pytest.raises(ValueError):
        opened(root, fire_slot=12, fired=5)


def test_roll_over_files(tmp_path):
    root = str(tmp_path)
    w = opened(root, file_entries=4)
    add(w, range(3), [5] * 3, fire_slot=0)
    add(w, range(3, 10), [6] * 7, fire_slot=0)
    assert log_files(root) == [f"{0:020d}", f"{4:020d}", f"{8:020d}"]
    assert os.path.getsize(os.path.join(root, "timerlog", f"{8:020d}")) == 4 * ENTRY_BYTES
    w.close()
    w = opened(root, file_entries=4)
    assert phys_of(w, 6) == [c * 1000 for c in range(3, 10)]
    add(w, [10, 11, 12], [7] * 3, fire_slot=0)   # fills file 8, rolls to file 12
    assert log_files(root)[-1] == f"{12:020d}"
    assert [v[0] for v in disk_entries(root).values()] == list(range(13))
    w.close()
    with pytest.raises(ValueError, match="file_entries"):
        opened(root, file_entries=8)


def test_release_deletes_fully_fired_files_only(tmp_path):
    root = str(tmp_path)
    w = opened(root, file_entries=2)
    add(w, range(8), [1, 1, 1, 9, 2, 2, 3, 3], fire_slot=0)   # files 0 1|2 3|4 5|6 7
    assert w.release(2) == 1                    # file 0: slots 1, 1
    assert log_files(root) == [f"{i:020d}" for i in (2, 4, 6)]
    assert w.release(4) == 1                    # file 4: 2, 2; file 2 holds 9
    assert w.release(100) == 1                  # file 2; file 6 holds the last entry
    assert log_files(root) == [f"{6:020d}"]
    assert (w.pending, w.next_due_slot()) == (0, None)
    w.close()
    w = opened(root, fire_slot=100, file_entries=2)
    assert (w.next_cq_offset, w.pending) == (8, 0)
    add(w, [8], [150], fire_slot=100)
    assert log_files(root) == [f"{6:020d}", f"{8:020d}"]
    assert w.release(200) == 1                  # file 6 is no longer the last
    w.close()
    w = opened(root, fire_slot=200, file_entries=2)
    assert (w.next_cq_offset, log_files(root)) == (9, [f"{8:020d}"])
    w.close()


def test_files_deleted_at_gaps_are_fine_after_restart(tmp_path):
    root = str(tmp_path)
    w = opened(root, file_entries=2)
    add(w, range(6), [50, 51, 1, 1, 52, 53], fire_slot=0)
    assert w.release(2) == 1                    # the middle file
    w.close()
    w = opened(root, fire_slot=2, file_entries=2)
    assert [phys_of(w, s) for s in (50, 51, 52, 53)] == [[0], [1000], [4000], [5000]]
    assert w.next_cq_offset == 6
    w.close()


def write_at(root: str, index: int, data: bytes, file_entries: int = 4) -> None:
    """Bytes at entry ``index``'s position, creating its file (sparse) as an
    interrupted ``add`` would."""
    path = os.path.join(root, "timerlog", f"{index - index % file_entries:020d}")
    if not os.path.exists(path):
        with open(path, "wb") as f:
            f.truncate(file_entries * ENTRY_BYTES)
    at = index % file_entries * ENTRY_BYTES
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(data[:file_entries * ENTRY_BYTES - at])


def valid_entry(cq: int, phy: int, size: int, slot: int) -> bytes:
    return struct.pack(">qqiiq", cq, phy, size, naive_check(cq, phy, size, slot), slot)


TORN = {
    "garbage": bytes(random.Random(7).randrange(256) for _ in range(ENTRY_BYTES + 7)),
    "half written, no check": struct.pack(">qqiiq", 2, 2000, 3, 0, 12),
    "partial bytes": valid_entry(2, 2000, 3, 12)[:13],
    "valid entry after a bad one": b"\x01" * ENTRY_BYTES + valid_entry(3, 3000, 4, 12),
    "bad check": valid_entry(2, 2000, 3, 12)[:20] + b"\0\0\0\1" + valid_entry(2, 2000, 3, 12)[24:],
}


@pytest.mark.parametrize("kind", list(TORN))
def test_torn_tail_is_discarded(tmp_path, kind):
    root = str(tmp_path)
    w = opened(root)
    add(w, [0, 1], [12, 12], fire_slot=10)
    w.close()
    write_at(root, 2, TORN[kind])
    w = opened(root, fire_slot=10)
    assert (w.next_cq_offset, w.pending, phys_of(w, 12)) == (2, 2, [0, 1000])
    assert w.recovery["torn_entries"] >= 1
    assert sorted(disk_entries(root)) == [0, 1]   # the tail was zeroed
    add(w, [2, 3], [12, 13], fire_slot=10)
    w.close()
    w = opened(root, fire_slot=10)
    assert phys_of(w, 12) == [0, 1000, 2000]
    assert w.next_cq_offset == 4
    w.close()


@pytest.mark.parametrize("data", [b"", TORN["garbage"]])
def test_torn_at_a_file_boundary(tmp_path, data):
    """A kill after the roll created the next file, before (or while) its first
    entry was written: that file goes, and the previous one stays the last."""
    root = str(tmp_path)
    w = opened(root)
    add(w, range(4), [12] * 4, fire_slot=10)
    w.close()
    write_at(root, 4, data)
    w = opened(root, fire_slot=10)
    assert (w.next_cq_offset, w.pending, log_files(root)) == (4, 4, [f"{0:020d}"])
    assert w.release(13) == 0
    add(w, [4], [14], fire_slot=13)
    w.close()
    assert sorted(disk_entries(root)) == [0, 1, 2, 3, 4]


def test_bad_entry_in_an_earlier_file_ends_the_log(tmp_path):
    root = str(tmp_path)
    w = opened(root)
    add(w, range(10), [12] * 10, fire_slot=10)
    w.close()
    write_at(root, 5, b"\x07")
    w = opened(root, fire_slot=10)
    assert (w.next_cq_offset, w.pending) == (5, 5)
    assert w.recovery["files_discarded"] == 1
    assert log_files(root) == [f"{0:020d}", f"{4:020d}"]
    w.close()


def test_resume_point_is_the_last_entry_present(tmp_path):
    """Not reachable by kill -9 (the file of the last entry is never deleted):
    the file before a torn one is gone. The caller resumes after the last
    entry still logged, so the lost ones are added again (at-least-once)."""
    root = str(tmp_path)
    w = opened(root)
    add(w, range(8), [12] * 8, fire_slot=10)
    w.close()
    os.unlink(os.path.join(root, "timerlog", f"{4:020d}"))
    write_at(root, 8, TORN["garbage"])
    w = opened(root, fire_slot=10)
    assert (w.next_cq_offset, w.pending, log_files(root)) == (4, 4, [f"{0:020d}"])
    add(w, range(4, 6), [12] * 2, fire_slot=10)
    assert phys_of(w, 12) == [c * 1000 for c in range(6)]
    w.close()


# ------------------------------------------------- the model-based test
class TimerWheelModel(RuleBasedStateMachine):
    """The caller's loop against a model: fire the slot at the cursor in
    pieces, advance only when the slot is done, persist (fire_slot, fired)
    after each piece, restart at any point (optionally after a torn write)."""

    FILE_ENTRIES = 2

    @initialize(start=st.sampled_from([0, BASE_SLOT]))
    def setup(self, start):
        self.root = tempfile.mkdtemp(prefix="timerwheel-")
        self.log: list[tuple[int, int, int, int]] = []   # (cq, phy, size, slot)
        self.in_memory: list[int] = []                   # log indexes, log order
        self.fire_slot, self.fired = start, 0            # the persisted cursor
        self.released_below = start
        self.next_cq = 0
        self.wheel = None
        self.reopen()

    def teardown(self):
        if self.wheel is not None:
            self.wheel.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def reopen(self):
        self.wheel = TimerWheel(self.root, file_entries=self.FILE_ENTRIES)
        self.wheel.open(self.fire_slot, self.fired)
        at_fire = [i for i, e in enumerate(self.log) if e[3] == self.fire_slot]
        skipped = set(at_fire[:self.fired])
        self.in_memory = [i for i, e in enumerate(self.log)
                          if e[3] >= self.fire_slot and i not in skipped]
        self.released_below = self.fire_slot
        owed = self.all_of_slot(self.fire_slot)[self.fired:]
        assert pairs(self.wheel.slot_entries(self.fire_slot)) == owed

    def model_entries(self, slot: int) -> list[tuple[int, int]]:
        return [self.log[i][1:3] for i in self.in_memory if self.log[i][3] == slot]

    def all_of_slot(self, slot: int) -> list[tuple[int, int]]:
        return [e[1:3] for e in self.log if e[3] == slot]

    @rule(deltas=st.lists(st.integers(-3, 8), min_size=1, max_size=7),
          gap=st.integers(0, 2))
    def add(self, deltas, gap):
        cqs = list(range(self.next_cq + gap, self.next_cq + gap + len(deltas)))
        slots = [self.fire_slot + d for d in deltas]
        phys = [c * 100 + 7 for c in cqs]
        sizes = [c % 50 + 1 for c in cqs]
        self.wheel.add(*arrays(cqs, phys, sizes, slots), self.fire_slot)
        for c, p, s, k in zip(cqs, phys, sizes, slots):
            self.in_memory.append(len(self.log))
            self.log.append((c, p, s, max(k, self.fire_slot)))
        self.next_cq = cqs[-1] + 1

    @rule(n=st.integers(1, 6))
    def fire(self, n):
        """Deliver the next n entries of the fire slot; persist the cursor."""
        owed = self.all_of_slot(self.fire_slot)
        listed = pairs(self.wheel.slot_entries(self.fire_slot))
        assert listed == self.model_entries(self.fire_slot)
        start = len(owed) - len(listed)          # entries before the list (after open)
        assert start <= self.fired
        self.fired = min(len(owed), self.fired + n)

    @precondition(lambda self: self.fired == len(self.all_of_slot(self.fire_slot)))
    @rule(step=st.integers(1, 4), release=st.booleans())
    def advance(self, step, release):
        later = [e[3] for e in self.log if e[3] > self.fire_slot]
        self.fire_slot = min([self.fire_slot + step] + later)
        self.fired = 0
        if release:
            event(f"release deleted {min(self.wheel.release(self.fire_slot), 2)}+ files")
            self.in_memory = [i for i in self.in_memory if self.log[i][3] >= self.fire_slot]
            self.released_below = self.fire_slot
            self.check_files_released()

    @rule(slots=st.integers(1, 12))
    def catch_up(self, slots):
        """The caller's loop after an idle gap: fire whole slots, releasing each."""
        for _ in range(slots):
            self.fire(len(self.log))
            self.advance(1, release=True)

    @rule(clean=st.booleans())
    def restart(self, clean):
        if clean:
            self.wheel.close()
        self.wheel = None   # else: abandoned mid-flight, like kill -9
        self.reopen()

    @rule(data=st.sampled_from(list(TORN.values())))
    def torn_write_then_restart(self, data):
        self.wheel = None
        write_at(self.root, len(self.log), data, self.FILE_ENTRIES)
        self.reopen()
        event(f"torn write at entry {len(self.log) % self.FILE_ENTRIES} of a file: "
              f"{self.wheel.recovery['torn_entries']} entries zeroed")

    def check_files_released(self):
        last = len(self.log) - 1
        for index, (cq, phy, size, check, slot) in disk_entries(self.root).items():
            assert check == naive_check(cq, phy, size, slot)
            assert (cq, phy, size, slot) == self.log[index]
        for name in log_files(self.root):
            first = int(name)
            in_file = [e[3] for e in self.log[first:first + self.FILE_ENTRIES]]
            holds_last = first <= last < first + self.FILE_ENTRIES
            assert holds_last or max(in_file, default=None) >= self.released_below, name

    @invariant()
    def matches_the_model(self):
        if self.wheel is None:
            return
        w = self.wheel
        assert w.next_cq_offset == (self.log[-1][0] + 1 if self.log else -1)
        assert w.pending == len(self.in_memory)
        assert w.next_due_slot() == min((self.log[i][3] for i in self.in_memory), default=None)
        assert pairs(w.slot_entries(self.fire_slot)) == self.model_entries(self.fire_slot)
        owed = self.all_of_slot(self.fire_slot)[self.fired:]
        listed = self.model_entries(self.fire_slot)
        assert listed[len(listed) - len(owed):] == owed


TimerWheelModel.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
test_timer_wheel_model = TimerWheelModel.TestCase


def test_a_roll_the_disk_refuses_keeps_the_last_entrys_file(tmp_path, monkeypatch):
    """A full file rolls to a new one whose first entry's page the disk
    refuses (ENOSPC): the full file, now closed, still holds the last entry
    and must outlive every ``release`` (it is where ``next_cq_offset``
    comes from: without it a restart would enqueue every timer message
    again). Once there is room the log goes on in the new file, and a
    retried roll takes the file the failed one made."""
    import errno
    from shmq.core.files import FileLayer

    def add(w, first, n, slot=10, fire=0):
        q = np.arange(first, first + n, dtype=np.int64)
        w.add(q, q * 100, np.full(n, 100, np.int64), np.full(n, slot, np.int64), fire)

    w = TimerWheel(str(tmp_path), file_entries=4)
    w.open(0, 0)
    add(w, 0, 4)                                      # file 0 full
    real = FileLayer.allocate_ahead

    def full(self, h, end, limit, ahead_max):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(FileLayer, "allocate_ahead", full)
    with pytest.raises(OSError, match="No space"):
        add(w, 4, 1)
    with pytest.raises(OSError, match="No space"):   # tried again: the file made is taken
        add(w, 4, 1)
    assert w.next_cq_offset == 4
    w.release(1000)                                   # every slot of file 0 fired
    assert os.path.exists(tmp_path / "timerlog" / f"{0:020d}")
    w.close()
    again = TimerWheel(str(tmp_path), file_entries=4)
    again.open(1000, 0)
    assert again.next_cq_offset == 4                  # not -1: not everything again
    monkeypatch.setattr(FileLayer, "allocate_ahead", real)
    add(again, 4, 2, slot=2000, fire=1000)
    assert again.next_cq_offset == 6 and again.pending == 2
    again.close()
