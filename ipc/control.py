"""The shared-memory control block: process table, append lock, store lock file.

One POSIX shared-memory object per store, named from the store's real path
(``/shmq-<sha1[:16]>``), so two stores on one host never collide. Layout::

      0  ipc header (128 B, native int64): magic, version, proc_slots,
         region_offset, region_bytes, owner_pid, owner_start, lock_owner_pid,
         lock_owner_start, retired
    128  proc_slots × 64-byte process slots (PROC_DTYPE):
           0 pid | 8 start_ticks | 16 flags | 24 role | 32 heartbeat_ms |
          40 msgs_got (a worker's messages returned by pulls: the broker's
             getTransferedTps; kept when a new process takes the slot) |
          48 corrupt_skipped (damaged records its pulls refused; kept likewise) |
          56 wait_mask (WANT_QUEUES: bit q % 62 for each queue slot q waited on,
             bit 62 for a queue with no slot yet: ``core.state.queue_bit``)
     region_offset (4 KiB aligned): the caller's region (the store's
         ``StoreState``; this module never interprets it)

Slot 0 is the flusher's, so an appender wakes it without a lookup. A process
writes only its own slot (the owner clears the slots of dead processes).

The append lock is a POSIX named semaphore (``/shmq-<sha1[:16]>-lock``). A
holder sets LOCKING in its slot before it waits and records its pid in
``lock_owner_pid`` once it holds the lock, so the owner can tell, when a
process dies, whether it died holding the lock: the pid is recorded, or the
pid is 0, the semaphore is taken and the dead process was LOCKING (it died
between acquiring and recording), checked again after a grace period in
which a live holder would have recorded itself.

Only the owner creates (and unlinks) the block; it holds the store's lock
file (``core.files.StoreLock``) for its whole life, so a block left by a
dead owner is stale by definition and made anew. Before a new owner
recovers the store it *retires* such a block (``retire_stale``): marks it,
waits for an append in flight, and from then on the old lock refuses every
process still attached to it, so none of them can write over what the new
owner recovers.
"""
from __future__ import annotations

import ctypes
import errno
import hashlib
import mmap
import logging
import os
import signal
import sys
import time

import numpy as np
import posix_ipc

from .wakeup import Waiter, Waker

MAGIC = 0x73686D716374726C  # "shmqctrl"
VERSION = 2        # 2: WANT_QUEUES and wait_mask (a process of version 1 would not wake them)
HEADER_BYTES = 128
PROC_DTYPE = np.dtype({"names": ["pid", "start_ticks", "flags", "role", "heartbeat_ms", "msgs_got",
                                 "corrupt_skipped", "wait_mask"],
                       "formats": [np.int64] * 8, "offsets": [0, 8, 16, 24, 32, 40, 48, 56],
                       "itemsize": 64})
_HDR = ["magic", "version", "proc_slots", "region_offset", "region_bytes", "owner_pid",
        "owner_start", "lock_owner_pid", "lock_owner_start", "retired"]
# The layouts drawn in the header, checked against the dtypes at import.
assert len(_HDR) * 8 <= HEADER_BYTES, "control block: the ipc header outgrew its 128 bytes"
assert PROC_DTYPE.itemsize == 64 and [PROC_DTYPE.fields[n][1] for n in PROC_DTYPE.names] == [
    0, 8, 16, 24, 32, 40, 48, 56], "control block: PROC_DTYPE is not the process slot drawn above"

# process slot flags (all in the flags word's low byte: wake_flagged reads only that)
WANT_PUBLISH = 1   # wake me on every publish (the HA service; workers before WANT_QUEUES)
WANT_FLUSH = 2     # has parked sync sends: wake me when flushed_pos moves
LOCKING = 4        # waiting for or holding the append lock
WANT_CLIENTS = 8   # a broker worker: wake me when a consumer group changes
WANT_CONFIG = 16   # the broker's services: wake me when the topic table changes
REGISTERED = 32    # the broker's services: a NameServer took its routes since it started
WANT_QUEUES = 64   # pulls waiting (a worker's parked, a direct consumer's) on its wait_mask's queues
_FLAGS_LOW = PROC_DTYPE.fields["flags"][1] + (0 if sys.byteorder == "little" else 7)
_HAS_FLAG = {f: bytes(1 if b & f else 0 for b in range(256))
             for f in (WANT_PUBLISH | WANT_QUEUES, WANT_FLUSH, LOCKING, WANT_CLIENTS, WANT_CONFIG,
                       REGISTERED)}


# roles
ROLE_FLUSHER = 1
ROLE_WORKER = 2
ROLE_OWNER = 3
ROLE_OTHER = 4
FLUSHER_SLOT = 0

log = logging.getLogger("shmq.store")
LOCK_GRACE_S = 1.0
RETIRE_WAIT_S = 5.0


class SlotTaken(RuntimeError):
    """A process slot asked for by number belongs to another live process."""


class NotRunning(RuntimeError):
    """No live owner has this store open (or it is still opening it)."""


class Retired(RuntimeError):
    """This control block belongs to an owner that is gone: a new owner has
    reopened the store. Attach again."""


def names(store_dir: str) -> tuple[str, str, str]:
    """(shared memory name, semaphore name, wake-up namespace) of a store."""
    h = hashlib.sha1(os.path.realpath(store_dir).encode()).hexdigest()[:16]
    return f"/shmq-{h}", f"/shmq-{h}-lock", f"shmq-{h}"


def unlink_names(store_dir: str) -> None:
    """Remove the store's shared memory and semaphore names, where they exist
    (the owner's, at its start and its stop). Processes that have the block
    open keep it until they close it; the kernel frees it then. After a
    kill -9 of the owner the names stay until the store's next owner starts
    (``create``): a restart reclaims them."""
    shm_name, sem_name, _ = names(store_dir)
    _unlink(shm_name, sem_name)


def _unlink(shm_name: str, sem_name: str) -> None:
    for unlink, name in ((posix_ipc.unlink_shared_memory, shm_name),
                         (posix_ipc.unlink_semaphore, sem_name)):
        try:
            unlink(name)
        except posix_ipc.ExistentialError:
            pass


def process_start_ticks(pid: int) -> int:
    """Start time of ``pid`` in clock ticks since boot; -1 if it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return -1
    fields = stat[stat.rindex(b")") + 2:].split()
    if fields[0] in (b"Z", b"X"):
        return -1
    return int(fields[19])


def pid_alive(pid: int, start_ticks: int) -> bool:
    """True if ``pid`` runs and is the process that had ``start_ticks`` (not a reuse)."""
    return pid > 0 and process_start_ticks(pid) == start_ticks


_PR_SET_PDEATHSIG = 1
# the environment variable that names a fork server's owner to it (broker/preload.py)
FORK_SERVER_OWNER = "SHMQ_FORK_SERVER_OWNER"
_libc = ctypes.CDLL(None, use_errno=True)


def die_with_parent(owner_pid: int) -> None:
    """Have the kernel SIGKILL this process when its parent dies (Linux
    PR_SET_PDEATHSIG), and exit now if the owner ``owner_pid`` is already
    gone. A helper of a dead owner must not outlive it: a new owner may be
    recovering the store while it would still flush, checkpoint or delete
    files from a stale control block. The parent is the owner itself, or the
    owner's fork server (``broker/boss.py``), which exits when the owner does
    once this process has let go of its pipe (below), so the signal comes
    either way. (It follows the parent *thread* that
    started this process: start helpers from the owner's main thread.) Safe
    in a ``preexec_fn`` (between fork and exec): libc was loaded at import,
    so nothing here takes a lock another thread may have held at the fork."""
    if _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG): {os.strerror(err)}")
    _let_go_of_fork_server()
    if os.getppid() != owner_pid and process_start_ticks(owner_pid) < 0:
        os._exit(0)


def _let_go_of_fork_server() -> None:
    """Close this process's copy of the fork server's "owner alive" pipe.

    multiprocessing's fork server exits when that pipe's write end is
    closed everywhere, which is meant to be when its owner dies. But CPython
    hands every child it forks a copy of the write end (so the child could
    start processes through the same server), and our children die only
    when their parent — the fork server — does: a kill -9 of the boss (the
    OOM killer's choice, or an operator's) left the fork server, services
    and the HA process running for good, holding their wake-up addresses,
    and a restart on the store failed to start its workers. No broker child
    starts processes through the fork server, so each lets go of the pipe."""
    fs = sys.modules.get("multiprocessing.forkserver")
    server = getattr(fs, "_forkserver", None)
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is not None:
        server._forkserver_alive_fd = None
        try:
            os.close(fd)
        except OSError:
            pass


def set_process_name(name: str) -> None:
    """Name this process for ps/top and /proc/<pid>/comm (15 bytes at most)."""
    _libc.prctl(15, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)   # PR_SET_NAME


class SemaphoreLock:
    """The cross-process append lock (``acquire``/``release``, as StoreState wants)."""

    def __init__(self, cb: "ControlBlock"):
        self.cb = cb
        self.sem = cb.sem
        self._pid = os.getpid()
        self._start = process_start_ticks(self._pid)

    def acquire(self) -> None:
        cb = self.cb
        if cb.slot >= 0:
            cb.proc_flags[cb.slot] |= LOCKING
        self.sem.acquire()
        cb.hdr_lock_owner_start[0] = self._start
        cb.hdr_lock_owner[0] = self._pid
        if cb.hdr_retired[0]:
            self.release()
            raise Retired(f"store {cb.store_dir} was reopened by a new owner: attach again")

    def release(self) -> None:
        cb = self.cb
        cb.hdr_lock_owner[0] = 0
        self.sem.release()
        if cb.slot >= 0:
            cb.proc_flags[cb.slot] &= ~LOCKING


class ControlBlock:
    def __init__(self, store_dir: str, shm: posix_ipc.SharedMemory, sem: posix_ipc.Semaphore):
        self.store_dir = store_dir
        self.shm_name, self.sem_name, self.namespace = names(store_dir)
        self.mm = mmap.mmap(shm.fd, shm.size)
        shm.close_fd()
        self.sem = sem
        self.header = np.ndarray((1,), np.dtype({"names": _HDR, "formats": [np.int64] * len(_HDR),
                                                "offsets": [8 * i for i in range(len(_HDR))],
                                                "itemsize": HEADER_BYTES}), self.mm, 0)
        n = int(self.header["proc_slots"][0]) if int(self.header["magic"][0]) == MAGIC else 0
        self.procs = np.ndarray((n,), PROC_DTYPE, self.mm, HEADER_BYTES)
        self.proc_flags = self.procs["flags"]
        self.wait_masks = self.procs["wait_mask"]
        self.hdr_lock_owner = self.header["lock_owner_pid"]
        self.hdr_lock_owner_start = self.header["lock_owner_start"]
        self.hdr_retired = self.header["retired"]
        self.lock = SemaphoreLock(self)
        self.slot = -1
        self._flag_bytes: memoryview | None = None   # wake_flagged's view of the slots' flags
        self._flag_bytes_of = None
        self.waiter: Waiter | None = None
        self.waker = Waker(self.namespace)

    # ------------------------------------------------------------ lifecycle
    @classmethod
    def create(cls, store_dir: str, region_bytes: int, proc_slots: int) -> "ControlBlock":
        """Make a fresh block (owner only, holding the store lock): any
        block of an earlier owner of this store is stale and is removed."""
        shm_name, sem_name, _ = names(store_dir)
        unlink_names(store_dir)
        region_offset = -(-(HEADER_BYTES + proc_slots * PROC_DTYPE.itemsize) // 4096) * 4096
        size = region_offset + region_bytes
        shm = posix_ipc.SharedMemory(shm_name, posix_ipc.O_CREX, mode=0o600, size=size)
        sem = posix_ipc.Semaphore(sem_name, posix_ipc.O_CREX, mode=0o600, initial_value=1)
        cb = cls(store_dir, shm, sem)
        h = cb.header[0]
        h["version"] = VERSION
        h["proc_slots"] = proc_slots
        h["region_offset"] = region_offset
        h["region_bytes"] = region_bytes
        h["owner_pid"] = os.getpid()
        h["owner_start"] = process_start_ticks(os.getpid())
        cb.header["magic"] = MAGIC
        cb.procs = np.ndarray((proc_slots,), PROC_DTYPE, cb.mm, HEADER_BYTES)
        cb.proc_flags = cb.procs["flags"]
        cb.wait_masks = cb.procs["wait_mask"]
        return cb

    @classmethod
    def attach(cls, store_dir: str) -> "ControlBlock":
        """Open the block of a store whose owner is running."""
        shm_name, sem_name, _ = names(store_dir)
        shm = None
        try:
            shm = posix_ipc.SharedMemory(shm_name)
            sem = posix_ipc.Semaphore(sem_name)
        except posix_ipc.ExistentialError:
            if shm is not None:
                shm.close_fd()
            raise NotRunning(f"store {store_dir} is not open (no broker owns it)") from None
        cb = cls(store_dir, shm, sem)
        h = cb.header[0]
        if int(h["magic"]) != MAGIC or int(h["version"]) != VERSION or int(h["retired"]):
            cb.close()
            raise NotRunning(f"store {store_dir}: control block {shm_name} is not initialised")
        owner = int(h["owner_pid"])
        if not pid_alive(owner, int(h["owner_start"])):
            cb.close()
            raise NotRunning(f"store {store_dir}: its owner (pid {owner}) is gone; "
                             f"the control block is stale")
        return cb

    @staticmethod
    def retire_stale(store_dir: str, wait_s: float = RETIRE_WAIT_S) -> bool:
        """Retire the block an earlier (dead) owner left, before the store is
        recovered: mark it, wait up to ``wait_s`` for an append in flight
        (a dead holder never finishes), wake everyone blocked on its lock so
        they see the mark. True if there was one."""
        shm_name, sem_name, _ = names(store_dir)
        try:
            cb = ControlBlock(store_dir, posix_ipc.SharedMemory(shm_name), posix_ipc.Semaphore(sem_name))
        except posix_ipc.ExistentialError:
            return False
        if cb.header.shape[0] and int(cb.header["magic"][0]) == MAGIC:
            cb.hdr_retired[0] = 1
            try:
                cb.sem.acquire(wait_s)
                cb.sem.release()
            except posix_ipc.BusyError:
                pass   # held by a dead process: nobody can write through it any more
            for _ in range(64):   # let blocked waiters through: each sees the mark
                cb.sem.release()
        cb.close()
        return True

    def region(self) -> memoryview:
        """The caller's region (the StoreState buffer)."""
        off = int(self.header["region_offset"][0])
        return memoryview(self.mm)[off:off + int(self.header["region_bytes"][0])]

    def close(self) -> None:
        """Leave the block. The mapping is not unmapped here: numpy views of
        it (a StoreState) may outlive this object, and a view of an unmapped
        block is a crash; it is unmapped when the last view is collected."""
        self.unregister()
        self.waker.close()
        self.sem.close()
        self.header = self.procs = self.proc_flags = self.wait_masks = self.hdr_lock_owner = None
        self.mm = None

    def unlink(self) -> None:
        """Remove the names (owner, at shutdown); mappings stay valid until
        closed. The names this block was made under, not the store path's
        now: a path that resolves elsewhere by the stop (a symlink moved)
        must not leave this block behind or take another store's."""
        _unlink(self.shm_name, self.sem_name)

    # -------------------------------------------------------- process slots
    def register(self, role: int, slot: int | None = None) -> int:
        """Claim a process slot (``slot`` if given, else a free one) and bind
        its wake-up socket. Claiming takes the append lock to exclude races.
        The bound address is part of the claim: a slot whose address another
        process still holds (one leaving, between freeing its slot and closing
        its socket; or a child that inherited the socket through a plain
        fork) is not free, whatever its row says."""
        pid = os.getpid()
        start = process_start_ticks(pid)
        explicit = slot is not None
        self.lock.acquire()
        try:
            if not explicit:
                candidates = [i for i in range(1, self.procs.shape[0])
                              if not pid_alive(int(self.procs["pid"][i]),
                                               int(self.procs["start_ticks"][i]))]
            else:
                p = self.procs[slot]
                if int(p["pid"]) not in (0, pid) and pid_alive(int(p["pid"]), int(p["start_ticks"])):
                    raise SlotTaken(f"process slot {slot} belongs to live pid {int(p['pid'])}")
                candidates = [slot]
            waiter = None
            for cand in candidates:
                try:
                    waiter = Waiter(self.namespace, cand)
                except OSError as e:
                    if e.errno != errno.EADDRINUSE:
                        raise
                    continue
                slot = cand
                break
            if waiter is None:
                if explicit:
                    raise SlotTaken(f"process slot {slot}: its wake-up address is still "
                                    f"held by another process")
                raise RuntimeError(f"all {self.procs.shape[0]} process slots are taken "
                                   f"(maxProcessSlots)")
            p = self.procs[slot]
            p["flags"] = 0
            p["wait_mask"] = 0
            p["role"] = role
            p["start_ticks"] = start
            p["heartbeat_ms"] = int(time.time() * 1000)
            p["pid"] = pid
        finally:
            self.lock.release()
        self.slot = slot
        self.waiter = waiter
        return slot

    def unregister(self) -> None:
        """Leave the slot: the wake-up address is let go of before the row
        says the slot is free, so the next process to claim it can bind it."""
        if self.waiter is not None:
            self.waiter.close()
            self.waiter = None
        if self.slot >= 0 and self.procs is not None:
            p = self.procs[self.slot]
            p["flags"] = 0
            p["pid"] = 0
        self.slot = -1

    def set_flag(self, flag: int, on: bool) -> None:
        if on:
            self.proc_flags[self.slot] |= flag
        else:
            self.proc_flags[self.slot] &= ~flag

    def set_wait_mask(self, mask: int) -> None:
        """This slot's wait_mask: the queues (``core.state.queue_bit``) whose
        appends wake it while it is flagged WANT_QUEUES."""
        if self.slot >= 0:
            self.wait_masks[self.slot] = mask

    def flags_of(self, pid: int) -> int:
        """The flags of the slot ``pid`` holds (0 if it holds none)."""
        hit = np.flatnonzero(self.procs["pid"] == pid)
        return int(self.proc_flags[hit[0]]) if hit.size else 0

    def heartbeat(self) -> None:
        self.procs["heartbeat_ms"][self.slot] = int(time.time() * 1000)

    def wake(self, slot: int) -> None:
        self.waker.wake(slot)

    def wake_flagged(self, flag: int, queues: int = -1, me_too: bool = True) -> bool:
        """Wake every process whose slot has ``flag``; for WANT_PUBLISH also
        every slot with WANT_QUEUES whose wait_mask meets ``queues`` (the
        published queues' ``core.state.queue_bit``s, -1: any): a pull
        waiting on other queues is not woken. Every append publishes through
        here, so the common answer (nobody) costs one copy of the slots' low
        flag bytes and a ``bytes.translate``, not numpy's masking and
        scanning of every slot (5 µs here). ``me_too`` False: this process
        is not woken (it looks itself); whether it would have been."""
        low = self._flag_bytes
        if low is None or self._flag_bytes_of is not self.procs:
            self._flag_bytes_of = self.procs
            low = self._flag_bytes = memoryview(self.procs.view(np.uint8))[_FLAGS_LOW::PROC_DTYPE.itemsize]
        by_queue = flag == WANT_PUBLISH
        hits = low.tobytes().translate(_HAS_FLAG[flag | WANT_QUEUES if by_queue else flag])
        slot = hits.find(1)
        mine = False
        while slot >= 0:
            if (not by_queue or self.proc_flags[slot] & WANT_PUBLISH
                    or self.wait_masks[slot] & queues):
                if me_too or slot != self.slot:
                    self.waker.wake(slot)
                else:
                    mine = True
            slot = hits.find(1, slot + 1)
        return mine

    def wait(self, timeout_s: float) -> bool:
        return self.waiter.wait(timeout_s)

    # ------------------------------------------------------------ the owner
    def dead_processes(self) -> list[tuple[int, int]]:
        """(slot, pid) of every registered process that no longer runs."""
        out = []
        for slot in np.flatnonzero(self.procs["pid"] != 0):
            p = self.procs[slot]
            if not pid_alive(int(p["pid"]), int(p["start_ticks"])):
                out.append((int(slot), int(p["pid"])))
        return out

    def dead_lock_holder(self) -> int:
        """The pid recorded as holding the append lock if that process is
        dead (whether or not it ever had a slot), else 0."""
        owner = int(self.hdr_lock_owner[0])
        if not owner:
            return 0
        start = int(self.hdr_lock_owner_start[0])
        # The pair is two words: between reading them the holder may have
        # released (owner 0 first) and another taken the lock (its start,
        # then its pid), and a live holder's pid with the next one's start
        # reads as a dead process. The owner read again tells.
        if int(self.hdr_lock_owner[0]) != owner or pid_alive(owner, start):
            return 0
        return owner

    def died_holding_lock(self, slot: int, pid: int) -> bool:
        """Did the dead process in ``slot`` die holding the append lock?"""
        owner = int(self.hdr_lock_owner[0])
        if owner == pid:
            return True
        if owner != 0 or not self.proc_flags[slot] & LOCKING:
            return False
        # It was waiting for or holding the lock and nobody is recorded as
        # holder: if the semaphore stays taken with no holder recorded for the
        # grace period, the dead process took it and died before recording.
        deadline = time.monotonic() + LOCK_GRACE_S
        while time.monotonic() < deadline:
            if self.sem.value > 0 or int(self.hdr_lock_owner[0]) != 0:
                return False
            time.sleep(0.01)
        return self.sem.value == 0 and int(self.hdr_lock_owner[0]) == 0

    def release_dead_lock(self) -> None:
        """Release the lock a dead process held (after repairing its append)."""
        owner = int(self.hdr_lock_owner[0])
        if self.sem.value != 0:
            # Taken for held by a dead process but free now: releasing it would
            # let two processes in at once. Never seen under a single writer;
            # seen (rarely) with workers killed while direct appenders
            # contend, so the caller's "held" judgement has a race left: say
            # so, loudly, and keep the lock's count right.
            log.error("lock repair: the append lock a dead process was taken to hold is free "
                      "(recorded holder %d); not released again", owner)
            return
        assert not owner or not pid_alive(owner, int(self.hdr_lock_owner_start[0])), \
            f"lock repair: the append lock is recorded as held by live pid {owner}"
        self.hdr_lock_owner[0] = 0
        self.sem.release()

    def clear_slot(self, slot: int) -> None:
        p = self.procs[slot]
        p["flags"] = 0
        p["pid"] = 0
