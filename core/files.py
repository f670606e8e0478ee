"""The store's only door to the file system: real, or simulated for crash tests.

``FileLayer`` is what the store calls; it never touches ``os`` directly. The
real layer uses pwrite/fdatasync and MAP_SHARED mappings. ``SimFileLayer``
keeps files in memory with a "durable" copy per file: ``sync`` copies the
current bytes into it, and ``crash(seed)`` throws away, keeps or tears (at a
512-byte sector boundary) every 4 KiB page that changed since its last sync —
what a power loss does to the page cache. Mappings of simulated files are
numpy arrays over the same bytearray, so writes through a mapping are
"dirty pages" exactly like pwrites.

Invariant of both layers: a segment file appears under its final name only
when it is complete (created under a temporary name, then hard-linked; a
second creator finds the name taken and uses the existing file).

Everything the real layer creates is owner-only: files ``FILE_MODE`` (0600),
directories ``DIR_MODE`` (0700), whatever the umask. Taking the store's lock
also takes group and other permissions off a store directory that an
older version made 0755, so the 0644 files inside it are out of reach too.
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import mmap
import os
import random
import shutil
import stat
import threading
import weakref
from dataclasses import dataclass, field

import numpy as np

_libc = ctypes.CDLL(None, use_errno=True)
log = logging.getLogger("shmq.store")

FILE_MODE = 0o600   # every file the store creates: owner-only
DIR_MODE = 0o700    # every directory it creates

PAGE_BYTES = 4096
# what a store's disk says when it cannot take a write: full, over quota,
# failing, remounted read-only, a file too large. A process that meets one
# says so and tries again later; any other OSError is a bug.
DISK_ERRORS = frozenset((errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EFBIG))
READ_AHEAD_DEFAULT_BYTES = 128 << 10   # read_ahead_kb's default: where a device's cannot be read
_MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)
SECTOR_BYTES = 512


class StoreInUse(RuntimeError):
    """Another live process has this store open."""


class StoreDirError(RuntimeError):
    """The store directory cannot be made."""


def make_dirs(path: str) -> None:
    """``os.makedirs`` with every directory it makes ``DIR_MODE``
    (``os.makedirs`` gives its mode to the last one only)."""
    if os.path.isdir(path):
        return
    parent = os.path.dirname(path.rstrip("/"))
    if parent and parent != path:
        make_dirs(parent)
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        if not os.path.isdir(path):
            raise


def make_owner_only(root: str) -> None:
    """Take group and other permissions off the store directory (one an
    older version made 0755), so nothing inside is reachable by other users.
    Only a directory this user owns that is not sticky (never /tmp); a
    failure is a warning, not a refusal to start."""
    try:
        st = os.stat(root)
        if (st.st_mode & 0o077 == 0 or st.st_uid != os.geteuid()
                or st.st_mode & stat.S_ISVTX):
            return
        os.chmod(root, stat.S_IMODE(st.st_mode) & 0o700)
    except OSError as e:
        log.warning("store directory %s is open to other users and could not be made "
                    "owner-only: %s", root, e.strerror)
        return
    log.warning("store directory %s was mode %04o: made owner-only (%04o), as the store's "
                "files are", root, stat.S_IMODE(st.st_mode), stat.S_IMODE(st.st_mode) & 0o700)


class StoreLock:
    """``<store>/lock``, flock'd by the one process that has the store open
    for writing (RocketMQ's store lock file) for as long as it does: the
    kernel drops it when that process dies, however it dies."""

    def __init__(self, root: str):
        try:
            make_dirs(root)
        except OSError as e:      # a file in the way, no permission: name the setting
            raise StoreDirError(f"storePathRootDir={root}: cannot make the store directory: "
                                f"{e.strerror}") from None
        self.path = os.path.join(root, "lock")
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self.fd, 32, 0).decode(errors="replace").strip()
            os.close(self.fd)
            raise StoreInUse(f"store {root} is in use by another process "
                             f"(pid {holder or 'unknown'} holds {self.path})") from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"{os.getpid()}\n".encode(), 0)
        make_owner_only(root)

    def release(self) -> None:
        if self.fd >= 0:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = -1


class _NoLock:
    def release(self) -> None:
        pass


class FlushLock:
    """Who may flush the CommitLog and publish ``flushed_pos`` (core/store.py
    ``flush_commitlog``): an flock on the CommitLog directory, which every
    store has, taken by one process at a time — the flusher, a worker
    leading a group commit at the end of its turn (broker/worker.py), or a
    direct producer's flush thread (client/direct.py ``FlushWaiter``). The
    kernel drops it when its holder dies, however it dies, so a process
    killed inside an fdatasync leaves nothing to repair: the next flush
    starts from the last ``flushed_pos`` published."""

    def __init__(self, path: str):
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        _FLUSH_LOCKS.add(self)

    def acquire(self, block: bool = True) -> bool:
        if self.fd < 0:               # (a forked child's: ``_forked``)
            self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX if block else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def release(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


_FLUSH_LOCKS: "weakref.WeakSet[FlushLock]" = weakref.WeakSet()


def _forked() -> None:
    """In a forked child: a FlushLock's descriptor is its parent's open
    file, which an flock belongs to, so the child would hold the parent's
    lock, and keep it held past the parent's death. Closed here (the
    parent's copy keeps whatever it holds); the child opens its own at its
    first flush."""
    for lock in list(_FLUSH_LOCKS):
        if lock.fd >= 0:
            try:
                os.close(lock.fd)
            except OSError:
                pass
            lock.fd = -1


os.register_at_fork(after_in_child=_forked)


class _NoFlushLock:
    """One simulated machine, one process: the flush is always ours."""

    def acquire(self, block: bool = True) -> bool:
        return True

    def release(self) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass(eq=False)
class Handle:
    """An open file of the store. ``array`` is the shared mapping (numpy uint8),
    made on first use of ``FileLayer.map``."""
    path: str
    size: int
    fd: int = -1
    writable: bool = True
    dev: int = -1          # st_dev: its device's read-ahead limit (``will_need``)
    allocated: int = 0     # bytes from the start known to have blocks (``allocate``)
    array: np.ndarray | None = None
    _mmap: mmap.mmap | None = field(default=None, repr=False)


class FileLayer:
    """Real files. Segments are preallocated with fallocate: measured here
    (perf bench ``flush_write_path``, kernel 6.18, ext4) a 1 KiB append + fdatasync
    costs p50 ≈ 99 µs and writes 4 KiB; into a file preallocated by large zero
    writes it wrote 1 MiB per sync (its page cache held large folios) at
    128 µs with pwrite and 342 µs through a mapping."""

    def lock_store(self, root: str) -> StoreLock:
        """Take the store's lock file, or raise StoreInUse."""
        return StoreLock(root)

    def flush_lock(self, commitlog_dir: str) -> FlushLock:
        """The lock a CommitLog flush holds (``FlushLock``)."""
        return FlushLock(commitlog_dir)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def listdir(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except FileNotFoundError:
            return []

    def makedirs(self, path: str) -> None:
        make_dirs(path)

    def file_size(self, path: str) -> int:
        return os.stat(path).st_size

    def mtime_ms(self, path: str) -> int:
        return int(os.stat(path).st_mtime * 1000)

    def disk_usage_ratio(self, path: str) -> float:
        u = shutil.disk_usage(path)
        return u.used / u.total if u.total else 0.0

    def create_preallocated(self, path: str, size: int, sparse: bool = False) -> bool:
        """Create ``path`` as ``size`` zero bytes, atomically: only a complete
        file ever has the final name. False if it already existed.

        Not sparse (CommitLog segments): blocks are allocated (fallocate)
        and the file and its name made durable, so a later sync writes only
        the pages written. Sparse (derived files, ConsumeQueues): just the
        size, no syncs — cheap enough to do under the append lock; recovery
        rebuilds a lost one."""
        if os.path.exists(path):
            return False
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
        try:
            if sparse:
                os.ftruncate(fd, size)
            else:
                os.posix_fallocate(fd, 0, size)
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)   # e.g. ENOSPC: do not leave a half-allocated file behind
            raise
        os.close(fd)
        try:
            os.link(tmp, path)
            created = True
        except FileExistsError:
            created = False
        os.unlink(tmp)
        if not sparse:
            self.fsync_dir(os.path.dirname(path))
        return created

    def extend(self, path: str, size: int) -> None:
        """Grow a file cut short to ``size`` bytes, the new ones zeros,
        allocated (fallocate: ENOSPC now, not at a later write) and durable.
        Recovery only, with no handle on the file open."""
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            old = os.fstat(fd).st_size
            if size > old:
                os.posix_fallocate(fd, old, size - old)
                os.fsync(fd)
        finally:
            os.close(fd)

    def allocate(self, h: Handle, end: int) -> None:
        """Blocks for ``h``'s bytes below ``end`` (a sparse file written
        through its mapping): a store into a page with no block on a full
        disk is a SIGBUS that kills the writer, where fallocate says ENOSPC
        (OSError) first. From ``h.allocated``: through the handle's
        descriptor while it is open, else by the path (the descriptor of a
        mapped ConsumeQueue file is closed: ``map_only``)."""
        begin = h.allocated - h.allocated % PAGE_BYTES
        if end <= begin:
            return
        if h.fd >= 0:
            os.posix_fallocate(h.fd, begin, end - begin)
        else:
            fd = os.open(h.path, os.O_RDWR | os.O_CLOEXEC)
            try:
                os.posix_fallocate(fd, begin, end - begin)
            finally:
                os.close(fd)
        h.allocated = end

    def allocate_ahead(self, h: Handle, end: int, limit: int, ahead_max: int) -> None:
        """``allocate`` below ``end`` and ahead of it, for a file written
        through its mapping bit by bit (ConsumeQueues, IndexFile entries,
        the timer log): as much again as is allocated already, a page at
        least, ``ahead_max`` at most, never past ``limit`` (the file's
        size) — a busy file makes the system calls once per ``ahead_max``,
        a quiet one keeps to a page or two. A disk with no room ahead is
        asked for the bytes below ``end`` alone; OSError (ENOSPC) when it
        has none for them."""
        if end <= h.allocated:
            return
        ahead = min(ahead_max, max(PAGE_BYTES, h.allocated))
        try:
            self.allocate(h, min(limit, end + ahead))
        except OSError:
            self.allocate(h, end)

    def open(self, path: str, writable: bool = True) -> Handle:
        fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
        st = os.fstat(fd)
        return Handle(path=path, size=st.st_size, fd=fd, writable=writable, dev=st.st_dev)

    def map(self, h: Handle) -> np.ndarray:
        if h.array is None:
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if h.writable else 0)
            h._mmap = mmap.mmap(h.fd, h.size, mmap.MAP_SHARED, prot)
            h.array = np.frombuffer(h._mmap, dtype=np.uint8)
            if not h.writable:
                h.array.flags.writeable = False
        return h.array

    def map_only(self, h: Handle) -> np.ndarray:
        """Map the file and close its descriptor: the mapping stays valid and
        ``sync`` uses msync. For the thousands of small ConsumeQueue files,
        which would otherwise exhaust the open-file limit.

        The mapping is advised MADV_RANDOM: a fault then maps one page. With
        the default read-around, the first 20-byte store into a sparse file
        made the kernel build (and zero) large folios around it: 1.4 ms per
        new queue and gigabytes of page cache for 10,000 queues."""
        arr = self.map(h)
        h._mmap.madvise(mmap.MADV_RANDOM)
        os.close(h.fd)
        h.fd = -1
        return arr

    def prefault(self, h: Handle, begin: int, end: int) -> None:
        """Map the pages of [begin, end) of a mapped file in one call
        (MADV_POPULATE_READ, Linux 5.14+) instead of a fault per page: a
        reader about to walk the range sequentially. Best effort."""
        if h._mmap is None or end <= begin:
            return
        begin -= begin % PAGE_BYTES
        try:
            h._mmap.madvise(_MADV_POPULATE_READ, begin, min(end, h.size) - begin)
        except OSError:
            pass   # older kernel: the faults happen one by one instead

    def will_need(self, h: Handle, begin: int, end: int) -> None:
        """Start reading [begin, end) of the file into the page cache in the
        background, in large requests (posix_fadvise WILLNEED on the
        descriptor, or MADV_WILLNEED on the mapping of a ``map_only`` file:
        both read ahead whatever the mapping's own advice, MADV_RANDOM
        included). For a reader about to walk a cold range: its faults then
        find the pages instead of reading them one at a time. Best effort.

        The kernel reads at most its device's read-ahead limit of one such
        call (max(read_ahead_kb, max_sectors_kb): 8 MiB on this VM's disk)
        and drops the rest without a word, so the range is advised in
        pieces of read_ahead_kb (``read_ahead_bytes``): a 32 MiB window
        asked for in one call was read 8 MiB deep."""
        begin, end = max(begin, 0), min(end, h.size)
        if end <= begin:
            return
        step = self.read_ahead_bytes(h.dev)
        try:
            if h.fd >= 0:
                for at in range(begin, end, step):
                    os.posix_fadvise(h.fd, at, min(step, end - at), os.POSIX_FADV_WILLNEED)
            elif h._mmap is not None:
                begin -= begin % PAGE_BYTES
                for at in range(begin, end, step):
                    h._mmap.madvise(mmap.MADV_WILLNEED, at, min(step, end - at))
        except (OSError, ValueError):
            pass

    _read_ahead: dict[int, int] = {}          # st_dev → bytes, read once a device

    def read_ahead_bytes(self, dev: int) -> int:
        """The read-ahead limit of the device ``dev`` (an st_dev): its
        backing device's read_ahead_kb in sysfs (/sys/class/bdi/MAJ:MIN, or
        for a partition its disk's queue), read once; 128 KiB (the kernel's
        default) where none can be read (a virtual file system, no sysfs)."""
        got = self._read_ahead.get(dev)
        if got is None:
            got = READ_AHEAD_DEFAULT_BYTES
            if dev >= 0:
                mm = f"{os.major(dev)}:{os.minor(dev)}"
                for path in (f"/sys/class/bdi/{mm}/read_ahead_kb",
                             f"/sys/dev/block/{mm}/../queue/read_ahead_kb"):
                    try:
                        with open(path) as f:
                            kb = int(f.read())
                    except (OSError, ValueError):
                        continue
                    if kb > 0:
                        got = kb << 10
                        break
            self._read_ahead[dev] = got
        return got

    def data_extent(self, h: Handle, offset: int) -> tuple[int, int]:
        """(begin, end): the first run of the file at or after ``offset``
        that may hold data (lseek SEEK_DATA, then SEEK_HOLE). Every byte
        outside such runs reads as zeros — a hole, or an extent fallocate'd
        and never written, which ext4 and XFS report as a hole unless the
        page cache holds its pages (so reading one caches its zero pages and
        makes it data: read such a run advised ``random_faults``, or the
        read-around makes the next run). ``(h.size, h.size)`` when nothing
        past ``offset`` does; ``(offset, h.size)`` when the descriptor is
        closed or the file system cannot tell."""
        if h.fd < 0:
            return offset, h.size
        try:
            begin = min(os.lseek(h.fd, offset, os.SEEK_DATA), h.size)
            return begin, min(os.lseek(h.fd, begin, os.SEEK_HOLE), h.size)
        except OSError as e:
            return (h.size, h.size) if e.errno == errno.ENXIO else (offset, h.size)

    def random_faults(self, h: Handle) -> None:
        """Advise the file's mapping MADV_RANDOM: a fault then reads its own
        page, not the kernel's read-around (up to read_ahead_kb, 8 MiB on
        some disks) of bytes nobody asked for. For a reader that reads ahead
        exactly what it wants (``will_need``). Best effort."""
        try:
            self.map(h)
            h._mmap.madvise(mmap.MADV_RANDOM)
        except (OSError, ValueError):
            pass

    def cached(self, h: Handle, begin: int, end: int) -> np.ndarray:
        """Which pages of the file from the one holding ``begin`` up to
        ``end`` are in the page cache now, one bool a page: mincore(2) on
        the file's mapping (made if need be), which for a shared file
        mapping answers for the page cache, whoever read the page, not for
        this process's page tables (Linux answers so for a file the caller
        owns or may write, as the store's owner-only files are to the
        broker; for others only pages this process mapped). For a reader
        that must leave the cache as it found it (the scrub: ``drop`` with
        ``cold`` only what was not)."""
        arr = self.map(h)
        begin -= begin % PAGE_BYTES
        end = min(end, h.size)
        vec = np.zeros(max(0, -(-(end - begin) // PAGE_BYTES)), np.uint8)
        if vec.size and _libc.mincore(ctypes.c_void_p(arr.ctypes.data + begin),
                                      ctypes.c_size_t(end - begin),
                                      vec.ctypes.data_as(ctypes.c_void_p)) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"mincore: {os.strerror(err)}", h.path)
        return (vec & 1).astype(bool)

    def drop(self, h: Handle, begin: int, end: int, cold: bool = False) -> None:
        """Give back this process's pages of [begin, end) of a mapped file,
        whole pages only (MADV_DONTNEED on the MAP_SHARED mapping): they
        leave the process's RSS; the page cache keeps them (a dirty page
        stays dirty: nothing written is lost) and a later read faults them
        back. For a scan that is done with a range, so a process that walks
        the whole store holds one window of it at a time. ``cold``: the
        range is also of no use to anyone soon (far below the write
        position): the clean pages leave the page cache too (posix_fadvise
        DONTNEED; needs the descriptor). Best effort."""
        begin = -(-max(begin, 0) // PAGE_BYTES) * PAGE_BYTES     # whole pages inside the range
        end = min(end, h.size)
        if end < h.size:
            end -= end % PAGE_BYTES
        if h._mmap is not None and end > begin:
            try:
                h._mmap.madvise(mmap.MADV_DONTNEED, begin, end - begin)
            except (OSError, ValueError):
                pass
        if cold and h.fd >= 0 and end > begin:
            try:
                os.posix_fadvise(h.fd, begin, end - begin, os.POSIX_FADV_DONTNEED)
            except OSError:
                pass

    def pwrite(self, h: Handle, data, offset: int) -> None:
        if h.fd < 0:
            self.map(h)[offset:offset + len(data)] = np.frombuffer(data, np.uint8)
            return
        assert 0 <= offset and offset + len(data) <= h.size, (offset, len(data), h.size)
        n = os.pwrite(h.fd, data, offset)
        # the usual whole write, told without a memoryview (a record's
        # bytearray, a batch's uint8 array, a blank's bytes)
        if n == (len(data) if data.__class__ is bytearray or data.__class__ is bytes
                 else data.nbytes):
            return
        view = memoryview(data).cast("B")[n:]
        offset += n
        while view:
            n = os.pwrite(h.fd, view, offset)
            view = view[n:]
            offset += n

    def sync(self, h: Handle) -> None:
        """Make everything written to the file (by pwrite or a mapping) durable."""
        if h.fd >= 0:
            os.fdatasync(h.fd)
        else:
            h._mmap.flush()  # msync(MS_SYNC) of the whole mapping

    def sync_filesystem(self, path: str) -> None:
        """syncfs(2): everything dirty on the file system holding ``path``, in
        one call. Beats one sync per file once there are many small files."""
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            if _libc.syncfs(fd) != 0:
                err = ctypes.get_errno()
                raise OSError(err, os.strerror(err), path)
        finally:
            os.close(fd)

    def close(self, h: Handle) -> None:
        h.array = None
        if h._mmap is not None:
            try:
                h._mmap.close()
            except BufferError:
                pass  # a caller still holds a view; the mapping dies with it
            h._mmap = None
        if h.fd >= 0:
            os.close(h.fd)
            h.fd = -1

    def unlink(self, path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    def fsync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def rmdir(self, path: str) -> None:
        try:
            os.rmdir(path)
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.ENOTEMPTY):
                raise

    def read_bytes(self, path: str) -> bytes | None:
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def write_durable(self, path: str, data: bytes) -> None:
        """Replace ``path`` atomically and durably (tmp, fsync, rename, fsync dir)."""
        tmp = f"{path}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
        with open(fd, "wb") as f:
            os.fchmod(fd, FILE_MODE)   # a .tmp left by an older version may be 0644
            f.write(data)
            f.flush()
            os.fsync(fd)
        os.replace(tmp, path)
        self.fsync_dir(os.path.dirname(path) or ".")

    def touch(self, path: str) -> None:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, FILE_MODE))
        self.fsync_dir(os.path.dirname(path) or ".")


REAL_FILES = FileLayer()


class _SimFile:
    __slots__ = ("data", "durable", "linked")

    def __init__(self, size: int):
        self.data = bytearray(size)
        self.durable = bytes(size)
        self.linked = False  # directory entry durable


class SimFileLayer(FileLayer):
    """In-memory files that lose what was not synced when they ``crash``."""

    def __init__(self):
        self.files: dict[str, _SimFile] = {}
        self.dirs: set[str] = set()
        self.syncs = 0

    def lock_store(self, root):
        return _NoLock()   # one simulated machine, one process

    def flush_lock(self, commitlog_dir):
        return _NoFlushLock()

    def exists(self, path):
        return path in self.files or path in self.dirs

    def listdir(self, path):
        pre = path.rstrip("/") + "/"
        names = {p[len(pre):].split("/", 1)[0] for p in list(self.files) + list(self.dirs)
                 if p.startswith(pre)}
        return sorted(names)

    def makedirs(self, path):
        while path and path not in self.dirs and path != "/":
            self.dirs.add(path)
            path = os.path.dirname(path)

    def file_size(self, path):
        return len(self.files[path].data)

    def mtime_ms(self, path):
        return 0

    def disk_usage_ratio(self, path):
        return 0.0

    def create_preallocated(self, path, size, sparse=False):
        if path in self.files:
            return False
        self.makedirs(os.path.dirname(path))
        f = _SimFile(size)
        f.linked = not sparse  # the real layer fsyncs the directory of non-sparse files
        self.files[path] = f
        return True

    def allocate(self, h, end):
        h.allocated = max(h.allocated, end)     # in memory: every byte has its place

    def extend(self, path, size):
        f = self.files[path]
        if size > len(f.data):
            f.data = bytearray(bytes(f.data) + bytes(size - len(f.data)))
            f.durable = bytes(f.durable) + bytes(size - len(f.durable))

    def open(self, path, writable=True):
        if path not in self.files:
            raise FileNotFoundError(path)
        return Handle(path=path, size=len(self.files[path].data), writable=writable)

    def map(self, h):
        if h.array is None:
            h.array = np.frombuffer(self.files[h.path].data, dtype=np.uint8)
        return h.array

    def map_only(self, h):
        return self.map(h)

    def prefault(self, h, begin, end):
        pass

    def will_need(self, h, begin, end):
        pass                      # in memory already

    def random_faults(self, h):
        pass

    def data_extent(self, h, offset):
        return offset, h.size     # no holes known: every byte is read

    def cached(self, h, begin, end):
        begin -= begin % PAGE_BYTES
        return np.ones(max(0, -(-(min(end, h.size) - begin) // PAGE_BYTES)), bool)   # in memory

    def drop(self, h, begin, end, cold=False):
        pass                      # the bytes are the file: nothing to give back

    def pwrite(self, h, data, offset):
        mv = memoryview(data).cast("B")
        f = self.files[h.path]
        assert 0 <= offset and offset + len(mv) <= len(f.data)
        f.data[offset:offset + len(mv)] = mv

    def sync(self, h):
        f = self.files[h.path]
        f.durable = bytes(f.data)
        self.syncs += 1

    def sync_filesystem(self, path):
        for f in self.files.values():
            f.durable = bytes(f.data)
            f.linked = True
        self.syncs += 1

    def close(self, h):
        h.array = None

    def unlink(self, path):
        self.files.pop(path, None)

    def fsync_dir(self, path):
        pre = path.rstrip("/") + "/"
        for p, f in self.files.items():
            if p.startswith(pre) and "/" not in p[len(pre):]:
                f.linked = True

    def rmdir(self, path):
        if not any(p.startswith(path.rstrip("/") + "/") for p in self.files):
            self.dirs.discard(path)

    def read_bytes(self, path):
        f = self.files.get(path)
        return bytes(f.data) if f is not None else None

    def write_durable(self, path, data):
        self.makedirs(os.path.dirname(path))
        f = _SimFile(0)
        f.data = bytearray(data)
        f.durable = bytes(data)
        f.linked = True
        self.files[path] = f

    def touch(self, path):
        if path not in self.files:
            self.write_durable(path, b"")

    def crash(self, seed: int) -> dict:
        """Power loss: each page changed since its last sync keeps its new
        bytes, its old bytes, or a torn mix; files whose directory entry was
        never made durable may vanish. Mappings held by callers become stale:
        reopen everything after a crash. Returns counts for the test's log."""
        rng = random.Random(seed)
        kept = lost = torn = vanished = 0
        for path in list(self.files):
            f = self.files[path]
            if not f.linked and rng.random() < 0.5:
                del self.files[path]
                vanished += 1
                continue
            new = bytearray(f.durable)
            for p in range(0, len(f.data), PAGE_BYTES):
                cur = f.data[p:p + PAGE_BYTES]
                old = f.durable[p:p + PAGE_BYTES]
                if cur == old:
                    continue
                r = rng.random()
                if r < 1 / 3:
                    new[p:p + PAGE_BYTES] = cur
                    kept += 1
                elif r < 2 / 3:
                    lost += 1
                else:
                    cut = rng.randrange(1, PAGE_BYTES // SECTOR_BYTES) * SECTOR_BYTES
                    new[p:p + cut] = cur[:cut]
                    torn += 1
            f.data = new
            f.durable = bytes(new)
            f.linked = True
        return {"pages_kept": kept, "pages_lost": lost, "pages_torn": torn,
                "files_vanished": vanished}
