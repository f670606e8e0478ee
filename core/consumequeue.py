"""ConsumeQueues: per (topic, queueId) arrays of 20-byte units in fixed files.

``<storePathConsumeQueue>/<topic>/<queueId>/<20-digit byte offset>`` (the
directory defaults to ``<root>/consumequeue``), each file
``units_per_file`` × 20 bytes (6,000,000 by default); unit n of a queue lives
in file ``n // units_per_file`` at byte ``(n % units_per_file) * 20``. Layout in
``layout.CQ_UNIT_DTYPE``.

A ConsumeQueue is derived data: recovery checks it against the CommitLog and
rebuilds it. Units are written through the shared mapping (20-byte stores, no
system call); which units are published is decided by the queue table in
``StoreState``, never by this class. ``queue_offset`` always means a unit index,
``phy_offset`` a CommitLog byte position.
"""
from __future__ import annotations

import os
import struct

import numpy as np

from . import _kernels as K
from .files import FileLayer, Handle
from .layout import CQ_UNIT_BYTES, CQ_UNIT_DTYPE, offset_to_file_name

_UNIT = struct.Struct(">qiq")   # layout.CQ_UNIT_DTYPE
assert _UNIT.size == CQ_UNIT_DTYPE.itemsize, "ConsumeQueue unit: struct and dtype differ"

# Units a walk over a file reads ahead at a time (320 KiB).
WALK_UNITS = 1 << 14
# A file's pages get blocks (fallocate) ahead of the units written into them
# (``ConsumeQueues._allocate``): a page, then twice what the file has, up to this.
ALLOCATE_AHEAD_MAX = 1 << 20

# A tag filter that matches everything ("*").
ALL_TAGS = np.zeros(0, dtype=np.int64)


class ConsumeQueues:
    def __init__(self, files: FileLayer, directory: str, units_per_file: int,
                 read_only: bool = False):
        """``directory``: StoreConfig.consumequeue_dir. ``read_only``: files
        opened O_RDONLY, mapped PROT_READ, never created."""
        self.files = files
        self.dir = directory
        self.units_per_file = units_per_file
        self.file_bytes = units_per_file * CQ_UNIT_BYTES
        self.read_only = read_only
        self._open: dict[tuple[str, int, int], Handle] = {}
        if not read_only:
            files.makedirs(self.dir)

    # ---------------------------------------------------------------- files
    def queue_dir(self, topic: str, queue_id: int) -> str:
        return os.path.join(self.dir, topic, str(queue_id))

    def file_path(self, topic: str, queue_id: int, file_index: int) -> str:
        return os.path.join(self.queue_dir(topic, queue_id),
                            offset_to_file_name(file_index * self.file_bytes))

    def list_files(self, topic: str, queue_id: int) -> list[int]:
        """File indexes of a queue on disk, ascending."""
        out = []
        for name in self.files.listdir(self.queue_dir(topic, queue_id)):
            if len(name) == 20 and name.isdigit() and int(name) % self.file_bytes == 0:
                out.append(int(name) // self.file_bytes)
        return sorted(out)

    def list_queues(self) -> list[tuple[str, int]]:
        out = []
        for topic in self.files.listdir(self.dir):
            for qid in self.files.listdir(os.path.join(self.dir, topic)):
                if qid.isdigit():
                    out.append((topic, int(qid)))
        return out

    def mapped(self, topic: str, queue_id: int, file_index: int, create: bool,
               need: int = CQ_UNIT_BYTES) -> np.ndarray | None:
        """File ``file_index`` of the queue mapped (None if it does not exist
        and ``create`` is false). A file created here gets blocks for its
        first ``need`` bytes (and ahead) while its descriptor is open."""
        key = (topic, queue_id, file_index)
        h = self._open.get(key)
        if h is None:
            path = self.file_path(topic, queue_id, file_index)
            new = not self.files.exists(path)
            if new:
                if not create or self.read_only:
                    return None
                self.files.makedirs(os.path.dirname(path))
                self.files.create_preallocated(path, self.file_bytes, sparse=True)
            h = self.files.open(path, writable=not self.read_only)
            if h.size != self.file_bytes:
                self.files.close(h)
                raise ValueError(f"{path}: {h.size} bytes, expected {self.file_bytes} "
                                 f"(mappedFileSizeConsumeQueue differs from the store's)")
            if new:     # its first units' blocks while the descriptor is open (not by path later)
                try:
                    self._allocate(h, need)
                except OSError:
                    self.files.close(h)
                    raise
            self.files.map_only(h)
            self._open[key] = h
            prev = self._open.get((topic, queue_id, file_index - 1)) if create else None
            if prev is not None:
                # a writer moves on to the next file: the one it filled leaves
                # this process's RSS (its pages stay in the page cache), or an
                # appending worker would hold 20 bytes per message of the store
                self.files.drop(prev, 0, prev.size)
        return h.array

    def close(self) -> None:
        for h in self._open.values():
            self.files.close(h)
        self._open.clear()

    def open_files(self) -> list[tuple[str, int, int]]:
        return list(self._open)

    def forget(self, topic: str, queue_id: int, file_index: int) -> None:
        """Close this process's handle on one file (it stays on disk)."""
        h = self._open.pop((topic, queue_id, file_index), None)
        if h is not None:
            self.files.close(h)

    # ----------------------------------------------------------------- units
    def put(self, topic: str, queue_id: int, first_offset: int, phys: np.ndarray,
            sizes: np.ndarray, codes: np.ndarray, start: int, count: int) -> None:
        """Write ``count`` units from arrays[start:] at queue offsets
        first_offset, first_offset+1, … (crossing file boundaries as needed)."""
        assert first_offset >= 0 and start >= 0 and count >= 0, (
            "ConsumeQueue: queue offsets and counts are never negative", first_offset, count)
        for cq, rel, k, n in self._spans(topic, queue_id, first_offset, count):
            K.cq_put_many(cq, rel, phys, sizes, codes, start + k, n)

    def put_units(self, topic: str, queue_id: int, first_offset: int, units: np.ndarray) -> int:
        """Write ``units`` (``CQ_UNIT_DTYPE``) at queue offsets first_offset,
        first_offset+1, … as ``put``; returns how many differed there before
        (recovery's count of units rebuilt)."""
        assert first_offset >= 0, ("ConsumeQueue: queue offsets are never negative", first_offset)
        raw = units.view(np.uint8).reshape(-1)
        return sum(int(K.cq_put_units(cq, rel, raw[k * CQ_UNIT_BYTES:], n))
                   for cq, rel, k, n in self._spans(topic, queue_id, first_offset,
                                                    raw.shape[0] // CQ_UNIT_BYTES))

    def _spans(self, topic: str, queue_id: int, first_offset: int, count: int):
        """(file mapping, first unit in it, units before it, units in it) of
        queue offsets [first_offset, first_offset + count), file by file,
        each file's pages for them given blocks first (``_allocate``)."""
        upf = self.units_per_file
        done = 0
        while done < count:
            fi, rel = divmod(first_offset + done, upf)
            n = min(count - done, upf - rel)
            yield self._writable(topic, queue_id, fi, (rel + n) * CQ_UNIT_BYTES).array, rel, done, n
            done += n

    def _writable(self, topic: str, queue_id: int, fi: int, end: int) -> Handle:
        """File ``fi`` of the queue, mapped (created if new) with blocks for
        its bytes below ``end`` (``_allocate``)."""
        h = self._open.get((topic, queue_id, fi))
        if h is None:
            self.mapped(topic, queue_id, fi, create=True, need=end)
            h = self._open[(topic, queue_id, fi)]
        if end > h.allocated:
            self._allocate(h, end)
        return h

    def put_one(self, topic: str, queue_id: int, offset: int, phy: int, size: int,
                tags_code: int) -> None:
        """Write one unit (a single send: no arrays, no kernel call)."""
        assert offset >= 0 and phy >= 0 and 0 < size < K.CQ_PAD_SIZE, (
            "ConsumeQueue: a record's unit names a real position and size", offset, phy, size)
        fi, rel = divmod(offset, self.units_per_file)
        at = rel * CQ_UNIT_BYTES
        _UNIT.pack_into(self._writable(topic, queue_id, fi, at + CQ_UNIT_BYTES).array, at, phy,
                        size, tags_code)

    def _allocate(self, h: Handle, end: int) -> None:
        """Blocks for ``h``'s bytes below ``end`` and some ahead, before units
        are stored there (``FileLayer.allocate_ahead``). The files are
        sparse (10,000 queues cost a page each, not 6 MB), and a store
        through the mapping into a page with no block is a SIGBUS on a full
        disk: the writing worker (or the HA slave) died mid-append with no
        message. fallocate says ENOSPC instead, which the append turns into
        a refused send (its claim rolled back). Ahead up to
        ALLOCATE_AHEAD_MAX: a busy queue makes the three system calls once
        per MiB of units (52,428; at 64 KiB a send_many of 4,096 bodies made
        them on every call)."""
        self.files.allocate_ahead(h, end, self.file_bytes, ALLOCATE_AHEAD_MAX)

    def put_padding(self, topic: str, queue_id: int, first_offset: int, count: int) -> None:
        """Padding units (RocketMQ's fillPreBlank: size Integer.MAX_VALUE, the
        rest 0) at queue offsets [first_offset, first_offset + count): readers
        skip them, recovery keeps them, the offsets are never handed out again."""
        zeros = np.zeros(count, dtype=np.int64)
        self.put(topic, queue_id, first_offset, zeros, np.full(count, K.CQ_PAD_SIZE, np.int64),
                 zeros, 0, count)

    def unit(self, topic: str, queue_id: int, offset: int) -> tuple[int, int, int] | None:
        fi, rel = divmod(offset, self.units_per_file)
        cq = self.mapped(topic, queue_id, fi, create=False)
        if cq is None:
            return None
        u = cq[rel * CQ_UNIT_BYTES:(rel + 1) * CQ_UNIT_BYTES].view(np.uint8)
        rec = np.frombuffer(u.tobytes(), dtype=[("p", ">i8"), ("s", ">i4"), ("t", ">i8")])[0]
        return int(rec["p"]), int(rec["s"]), int(rec["t"])

    def units(self, topic: str, queue_id: int, offset: int, count: int) -> np.ndarray | None:
        """A copy of up to ``count`` units from ``offset``, within one file, as
        a ``CQ_UNIT_DTYPE`` array; None if the file is missing."""
        fi, rel = divmod(offset, self.units_per_file)
        cq = self.mapped(topic, queue_id, fi, create=False)
        if cq is None:
            return None
        n = min(count, self.units_per_file - rel)
        raw = cq[rel * CQ_UNIT_BYTES:(rel + n) * CQ_UNIT_BYTES]
        return np.frombuffer(raw.tobytes(), dtype=CQ_UNIT_DTYPE)

    def scan(self, topic: str, queue_id: int, offset: int, units_max: int, codes: np.ndarray,
             max_msgs: int, max_bytes: int, out_phy: np.ndarray, out_size: np.ndarray):
        """Matching units from ``offset`` among at most ``units_max`` units,
        within one file. Returns (found, scanned, status, their bytes) or None
        if the file is missing (deleted by retention)."""
        fi, rel = divmod(offset, self.units_per_file)
        cq = self.mapped(topic, queue_id, fi, create=False)
        if cq is None:
            return None
        n = min(units_max, self.units_per_file - rel)
        return K.cq_scan(cq, rel, n, codes, max_msgs, max_bytes, out_phy, out_size)

    def valid_units(self, topic: str, queue_id: int, file_index: int, cl_end: int) -> int:
        """How many units of a file, from its first, are real positions
        ending at or before ``cl_end`` (padding units count): what recovery
        keeps of it. 0 if the file is missing."""
        cq = self.mapped(topic, queue_id, file_index, create=False)
        if cq is None:
            return 0
        # window by window, each read ahead first: a sparse file's unwritten
        # tail is never read (it would fill the page cache with zeros)
        h = self._open[(topic, queue_id, file_index)]
        upf, n = self.units_per_file, 0
        while n < upf:
            k = min(WALK_UNITS, upf - n)
            self.files.will_need(h, n * CQ_UNIT_BYTES, (n + k) * CQ_UNIT_BYTES)
            valid = int(K.cq_valid_units(cq, n, k, cl_end)[0])
            n += valid
            if valid < k:
                break
        return n

    def valid_extent(self, topic: str, queue_id: int, cl_end: int,
                     durable_end: int | None = None) -> tuple[int, int] | None:
        """(first queue offset on disk, offset past the last valid unit) of a
        queue: the units from its first file on, through files that follow
        each other without a hole, up to the first that is not a real
        position ending at or before ``cl_end`` (``valid_units``). None if
        the queue has no files. Recovery keeps these; an offline view reads
        them (changes nothing).

        Only the tail is read (RocketMQ checks the last files too): a file
        whose last unit is a valid position below ``durable_end`` (default
        ``cl_end``) — a CommitLog position at or below the checkpoint's
        ConsumeQueue flushed position, as recovery's ``cl_end``, its scan
        start, is — was durable whole when the checkpoint was written
        (units are appended in queue order), and it and every file before
        it are trusted without reading them. The files after the last such
        file are walked unit by unit, read ahead in large requests
        (``FileLayer.will_need``) rather than faulted a page at a time
        through their MADV_RANDOM mapping. A unit damaged on disk below that
        point is not seen here: the scrub and the pulls' ``checkCRCOnRead``
        find what it points at, ``shmq store inspect --verify`` the unit
        (see ``core/recovery.py``)."""
        files = self.list_files(topic, queue_id)
        if not files:
            return None
        upf = self.units_per_file
        first = files[0] * upf
        run = 1                                # files that follow each other without a hole
        while run < len(files) and files[run] == files[0] + run:
            run += 1
        durable = cl_end if durable_end is None else min(durable_end, cl_end)
        trusted = 0                            # files[:trusted] are trusted whole
        for i in range(run - 1, -1, -1):
            cq = self.mapped(topic, queue_id, files[i], create=False)
            if cq is not None and K.cq_valid_units(cq, upf - 1, 1, durable)[0] == 1:
                trusted = i + 1
                break
        kept = first + trusted * upf
        for fi in files[trusted:run]:
            n = self.valid_units(topic, queue_id, fi, cl_end)
            kept = fi * upf + n
            if n < upf:
                break
        return first, kept

    def drop(self, topic: str, queue_id: int, begin: int, end: int) -> None:
        """Give back this process's pages of units [begin, end) of a queue
        (``FileLayer.drop``), in the files it has open: a reader done with them."""
        upf = self.units_per_file
        for fi in range(begin // upf, (end - 1) // upf + 1 if end > begin else 0):
            h = self._open.get((topic, queue_id, fi))
            if h is not None:
                lo, hi = max(begin - fi * upf, 0), min(end - fi * upf, upf)
                self.files.drop(h, lo * CQ_UNIT_BYTES, hi * CQ_UNIT_BYTES)

    def will_need(self, topic: str, queue_id: int, offset: int, count: int) -> None:
        """Read units [offset, offset + count) ahead into the page cache
        (``FileLayer.will_need``), within one file; nothing if it is missing."""
        fi, rel = divmod(offset, self.units_per_file)
        if self.mapped(topic, queue_id, fi, create=False) is None:
            return
        n = min(count, self.units_per_file - rel)
        self.files.will_need(self._open[(topic, queue_id, fi)], rel * CQ_UNIT_BYTES,
                             (rel + n) * CQ_UNIT_BYTES)

    def flush(self, topic: str, queue_id: int, begin: int, end: int) -> None:
        """Make units [begin, end) durable: one sync per file they touch."""
        if end <= begin:
            return
        upf = self.units_per_file
        for fi in range(begin // upf, (end - 1) // upf + 1):
            h = self._open.get((topic, queue_id, fi))
            if h is None:
                if self.mapped(topic, queue_id, fi, create=False) is None:
                    continue
                h = self._open[(topic, queue_id, fi)]
            self.files.sync(h)

    def sync_dirs(self, topic: str, queue_id: int, new_queue: bool) -> None:
        """Make the names of a queue's new files durable (and of the queue's
        directories, for a new queue)."""
        self.files.fsync_dir(self.queue_dir(topic, queue_id))
        if new_queue:
            self.files.fsync_dir(os.path.join(self.dir, topic))
            self.files.fsync_dir(self.dir)

    # -------------------------------------------------------------- recovery
    def recover_queue(self, topic: str, queue_id: int, cl_min: int, cl_end: int) -> tuple[int, int, int]:
        """Find a queue's valid extent against a CommitLog holding [cl_min,
        cl_end): units past the first invalid one or pointing at or past
        ``cl_end`` are zeroed, whole files past it deleted. Returns (min_offset,
        max_offset, units_dropped); both offsets 0 if the queue has no files."""
        files = self.list_files(topic, queue_id)
        if not files:
            return 0, 0, 0
        upf = self.units_per_file
        max_offset = files[0] * upf
        dropped = 0
        end_found = False
        for fi in files:
            cq = self.mapped(topic, queue_id, fi, create=False)
            if end_found or fi * upf != max_offset:
                # past the end, or a hole in the file sequence: nothing here counts
                dropped += int(np.count_nonzero(cq.reshape(-1, CQ_UNIT_BYTES).any(axis=1)))
                self.forget(topic, queue_id, fi)
                self.files.unlink(self.file_path(topic, queue_id, fi))
                end_found = True
                continue
            valid, _ = K.cq_valid_units(cq, 0, upf, cl_end)
            max_offset = fi * upf + valid
            if valid < upf:
                tail = cq[valid * CQ_UNIT_BYTES:]
                nz = tail.reshape(-1, CQ_UNIT_BYTES).any(axis=1)
                n_dirty = int(np.count_nonzero(nz))
                if n_dirty:
                    dropped += n_dirty
                    last = valid + int(np.flatnonzero(nz)[-1]) + 1
                    self.files.pwrite(self._open[(topic, queue_id, fi)],
                                      bytes((last - valid) * CQ_UNIT_BYTES), valid * CQ_UNIT_BYTES)
                end_found = True
        min_offset = self.min_offset_from(topic, queue_id, files[0] * upf, max_offset, cl_min)
        return min_offset, max_offset, dropped

    def min_offset_from(self, topic: str, queue_id: int, begin: int, end: int, cl_min: int) -> int:
        """First queue offset in [begin, end) whose unit points at or past
        ``cl_min``; ``end`` if none does."""
        upf = self.units_per_file
        off = begin
        while off < end:
            fi, rel = divmod(off, upf)
            cq = self.mapped(topic, queue_id, fi, create=False)
            n = min(end - off, upf - rel)
            if cq is None:
                off += n
                continue
            k = K.min_phy_from(cq, rel, n, cl_min)
            if k < n:
                return off + k
            off += n
        return end

    def delete_files_below(self, topic: str, queue_id: int, min_offset: int) -> int:
        """Delete files whose every unit lies below ``min_offset``; returns how many."""
        upf = self.units_per_file
        n = 0
        for fi in self.list_files(topic, queue_id):
            if (fi + 1) * upf <= min_offset:
                self.forget(topic, queue_id, fi)
                self.files.unlink(self.file_path(topic, queue_id, fi))
                n += 1
        return n

    def delete_queue(self, topic: str, queue_id: int) -> None:
        for fi in self.list_files(topic, queue_id):
            self.forget(topic, queue_id, fi)
            self.files.unlink(self.file_path(topic, queue_id, fi))
        self.files.rmdir(self.queue_dir(topic, queue_id))


def queues_due(words: np.ndarray, word: np.ndarray, lo: np.ndarray, n: int,
               out: np.ndarray) -> int:
    """Which of ``n`` watched queues have a message a pull waits for: the
    places ``at`` whose queue's next offset (``words[word[at]]``, the store
    state's words, read-only; 0 where ``word[at]`` is -1: no slot yet)
    passed ``lo[at]``, written into ``out``; how many. One kernel call
    (broker/parking.py: a worker's wake-up looks at every queue parked
    on it)."""
    return int(K.queues_due(words, word, lo, n, out))
