"""Store configuration: one frozen dataclass, keyed by RocketMQ's own names.

Field names are ``MessageStoreConfig``'s (``flushDiskType``,
``fileReservedTime``, ``mappedFileSizeCommitLog`` …) so that a ``broker.conf``
line maps onto a field unchanged; defaults are RocketMQ 4.9's. Settings that
only shmq has say so in their comment. Units are in the RocketMQ name where
RocketMQ puts them there; otherwise the comment gives them.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from .layout import (CQ_UNIT_BYTES, CQ_UNITS_PER_FILE, END_FILE_MIN_BLANK_BYTES,
                     HOST_V6_BYTES, HOST_V4_BYTES, PROPERTIES_BYTES_MAX, RECORD_FIXED_BYTES,
                     TOPIC_BYTES_MAX)

RECORD_BYTES_MAX_OVERHEAD = (RECORD_FIXED_BYTES + 2 * (HOST_V6_BYTES - HOST_V4_BYTES)
                             + TOPIC_BYTES_MAX + PROPERTIES_BYTES_MAX + END_FILE_MIN_BLANK_BYTES)
ASYNC_FLUSH = "ASYNC_FLUSH"
SYNC_FLUSH = "SYNC_FLUSH"
# broker.conf spellings of older RocketMQ versions -> the field they set
OLD_NAMES = {"mapedFileSizeCommitLog": "mappedFileSizeCommitLog",
             "mapedFileSizeConsumeQueue": "mappedFileSizeConsumeQueue"}
# the directories that may lie outside storePathRootDir -> their default name in it
DATA_DIRS = {"storePathCommitLog": "commitlog", "storePathConsumeQueue": "consumequeue",
             "storePathIndex": "index"}
# where a store records the directories it was opened with, when not the defaults
# (<storePathRootDir>/config/storePath.json): tools opening the root find them there
PATHS_TABLE = "storePath.json"


class StorePathMoved(ValueError):
    """A data directory is configured elsewhere than where this store's data is."""


@dataclass(frozen=True)
class StoreConfig:
    storePathRootDir: str = os.path.join(os.path.expanduser("~"), "store")
    # the CommitLog's directory, e.g. on a disk of its own (RocketMQ 4.x's
    # name; one directory: 4.9's several, comma-separated, are refused);
    # empty: <storePathRootDir>/commitlog
    storePathCommitLog: str = ""
    # the ConsumeQueues' and the IndexFiles' directories (RocketMQ 3.x's
    # names, still in old broker.conf files); empty: <storePathRootDir>/consumequeue, /index
    storePathConsumeQueue: str = ""
    storePathIndex: str = ""
    # bytes per CommitLog segment file
    mappedFileSizeCommitLog: int = 1 << 30
    # bytes per ConsumeQueue file (300,000 units of 20 bytes)
    mappedFileSizeConsumeQueue: int = CQ_UNITS_PER_FILE * CQ_UNIT_BYTES
    flushDiskType: str = ASYNC_FLUSH
    # ms between async flushes of the CommitLog
    flushIntervalCommitLog: int = 500
    # async flush waits for this many dirty 4 KiB pages ...
    flushCommitLogLeastPages: int = 4
    # ... unless this many ms passed since the last flush
    flushCommitLogThoroughInterval: int = 10_000
    # ms between ConsumeQueue flushes (and checkpoint writes) ...
    flushIntervalConsumeQueue: int = 1000
    # ... of the queues with at least this many dirty 4 KiB pages ...
    flushConsumeQueueLeastPages: int = 2
    # ... and of every queue once this many ms have passed
    flushConsumeQueueThoroughInterval: int = 60_000
    # ms a SYNC_FLUSH send waits before FLUSH_DISK_TIMEOUT
    syncFlushTimeout: int = 5000
    # bytes: the largest message body accepted
    maxMessageSize: int = 4 * 1024 * 1024
    # hours a CommitLog segment is kept after its last write
    fileReservedTime: int = 72
    # hours of the day ("04" or "04;16") when expired files are deleted
    deleteWhen: str = "04"
    # percent of the disk above which expired files are deleted at any hour
    diskMaxUsedSpaceRatio: int = 75
    # percent of the disk above which the oldest files go even if not expired
    # (RocketMQ's system property rocketmq.broker.diskSpaceCleanForciblyRatio)
    diskSpaceCleanForciblyRatio: int = 85
    # percent of the disk above which the store is full: sends are refused
    # with SERVICE_NOT_AVAILABLE until it is not (RocketMQ's system property
    # rocketmq.broker.diskSpaceWarningLevelRatio; 1..100, 100: never)
    diskSpaceWarningLevelRatio: int = 90
    # may forced cleanup (above diskSpaceCleanForciblyRatio) delete messages a
    # group with a consumer offset has not consumed? RocketMQ: true; shmq:
    # false, so a full disk refuses sends instead of losing unread messages
    cleanFileForciblyEnable: bool = False
    # ms between retention checks
    cleanResourceInterval: int = 10_000
    # segments deleted per retention check at most (shmq's bound; RocketMQ
    # spaces deletions by deleteCommitLogFilesInterval instead)
    deleteFileBatchMax: int = 10
    checkCRCOnRecover: bool = True
    # RocketMQ's: a send is refused with SYSTEM_BUSY ([PC_SYNCHRONIZED]) while
    # the oldest append not yet published has been in flight longer than this
    # (ms): appends publish in claim order, so one stalled writer holds back
    # every later one (MessageStore.busy_ms)
    osPageCacheBusyTimeOutMills: int = 1000
    # shmq: pulls check each record they read from outside the page-cache
    # window (below) as recovery does — sizes, magic, own offset, body CRC —
    # and never serve one that fails: the queue moves past it (an ERROR and
    # stats' corruptSkipped). Off: RocketMQ's behaviour, records served unread
    checkCRCOnRead: bool = True
    # RocketMQ's MessageStoreConfig: the share of physical memory (percent)
    # that the newest CommitLog bytes are taken to occupy in the page cache;
    # records further behind the write position are read from disk
    accessMessageInMemoryMaxRatio: int = 40
    # shmq: the services process checks every record of the sealed CommitLog
    # segments at this many bytes a second (core/scrub.py); 0: off
    scrubBytesPerSecond: int = 32 * 1024 * 1024
    # shmq: a scrub pass over every sealed segment starts this many hours
    # after the last one began (segments sealed meanwhile are checked at once)
    scrubPassIntervalHours: int = 24
    # shmq: bytes of CommitLog a whole-store scan in the background (the
    # IndexFile backfill, the scrub) walks before it gives those pages back
    # (MADV_DONTNEED): what such a scan holds of the store in its RSS
    backgroundScanWindowBytes: int = 32 * 1024 * 1024
    # build the IndexFile (QUERY_MESSAGE by key / UNIQ_KEY)
    messageIndexEnable: bool = True
    # hash slots per IndexFile (4 bytes each)
    maxHashSlotNum: int = 5_000_000
    # entries per IndexFile (20 bytes each)
    maxIndexNum: int = 20_000_000
    # shmq: (topic, queueId) slots in the shared control block
    maxQueueSlots: int = 65536
    # shmq: processes that can attach to the control block at once
    maxProcessSlots: int = 64

    def __post_init__(self):
        errors = []
        seg = self.mappedFileSizeCommitLog
        if seg < 4096 or seg % 4096:
            errors.append(f"mappedFileSizeCommitLog={seg}: must be a multiple of 4096")
        cq = self.mappedFileSizeConsumeQueue
        if cq < CQ_UNIT_BYTES or cq % CQ_UNIT_BYTES:
            errors.append(f"mappedFileSizeConsumeQueue={cq}: must be a multiple of {CQ_UNIT_BYTES}")
        if self.flushDiskType not in (ASYNC_FLUSH, SYNC_FLUSH):
            errors.append(f"flushDiskType={self.flushDiskType!r}: must be ASYNC_FLUSH or SYNC_FLUSH")
        # The largest record (body + 127-byte topic + 32767-byte properties +
        # fixed fields + the end blank) must fit in one segment.
        if self.maxMessageSize <= 0 or self.maxMessageSize + RECORD_BYTES_MAX_OVERHEAD > seg:
            errors.append(f"maxMessageSize={self.maxMessageSize}: must be positive and, with "
                          f"{RECORD_BYTES_MAX_OVERHEAD} bytes of record overhead, fit in "
                          f"mappedFileSizeCommitLog={seg}")
        for name in ("flushIntervalCommitLog", "flushIntervalConsumeQueue", "syncFlushTimeout",
                     "osPageCacheBusyTimeOutMills",
                     "cleanResourceInterval", "maxQueueSlots", "maxProcessSlots",
                     "maxHashSlotNum", "maxIndexNum", "backgroundScanWindowBytes"):
            if getattr(self, name) <= 0:
                errors.append(f"{name}={getattr(self, name)}: must be positive")
        if not 10 <= self.diskMaxUsedSpaceRatio <= 95:
            errors.append(f"diskMaxUsedSpaceRatio={self.diskMaxUsedSpaceRatio}: must be 10..95")
        for name in ("diskSpaceCleanForciblyRatio", "diskSpaceWarningLevelRatio"):
            if not 1 <= getattr(self, name) <= 100:
                errors.append(f"{name}={getattr(self, name)}: must be a percent, 1..100")
        if not 0 <= self.accessMessageInMemoryMaxRatio <= 100:
            errors.append(f"accessMessageInMemoryMaxRatio={self.accessMessageInMemoryMaxRatio}: "
                          f"must be a percent, 0..100")
        if self.fileReservedTime < 0:
            errors.append(f"fileReservedTime={self.fileReservedTime}: hours a CommitLog file is "
                          f"kept, must be >= 0")
        for name in ("scrubBytesPerSecond", "scrubPassIntervalHours"):
            if getattr(self, name) < 0:
                errors.append(f"{name}={getattr(self, name)}: must be >= 0 (0: off / at once)")
        try:
            self.delete_hours()
        except ValueError as e:
            errors.append(str(e))
        for name in ("storePathRootDir", *DATA_DIRS):
            value = getattr(self, name)
            if name != "storePathRootDir" and ("," in value or ";" in value):
                errors.append(f"{name}={value}: one directory, not a list (RocketMQ 4.9's "
                              f"several CommitLog directories are not supported)")
                continue
            bad = store_root_problem(value) if value else None
            if bad:
                errors.append(f"{name}={value}{' ' if bad.startswith('is ') else ': '}{bad}")
        dirs = [self.data_dir(name) for name in DATA_DIRS]
        if len(set(dirs)) < len(dirs):
            errors.append(f"storePathCommitLog, storePathConsumeQueue and storePathIndex must be "
                          f"different directories: {', '.join(dirs)}")
        if errors:
            raise ValueError("; ".join(errors))

    def data_dir(self, name: str) -> str:
        """The absolute directory of ``name`` (one of DATA_DIRS): its setting,
        or its default under storePathRootDir. Every reader and writer of the
        store's files finds them through here (and the three properties)."""
        return os.path.abspath(os.path.expanduser(
            getattr(self, name) or os.path.join(self.storePathRootDir, DATA_DIRS[name])))

    @property
    def commitlog_dir(self) -> str:
        return self.data_dir("storePathCommitLog")

    @property
    def consumequeue_dir(self) -> str:
        return self.data_dir("storePathConsumeQueue")

    @property
    def index_dir(self) -> str:
        return self.data_dir("storePathIndex")

    @property
    def cq_units_per_file(self) -> int:
        return self.mappedFileSizeConsumeQueue // CQ_UNIT_BYTES

    @property
    def sync_flush(self) -> bool:
        return self.flushDiskType == SYNC_FLUSH

    def delete_hours(self) -> frozenset[int]:
        try:
            hours = frozenset(int(h) for h in self.deleteWhen.split(";") if h.strip())
        except ValueError:
            hours = frozenset({-1})
        if not hours or any(not 0 <= h <= 23 for h in hours):
            raise ValueError(f"deleteWhen={self.deleteWhen!r}: must be hours 00..23 separated by ';'")
        return hours

    @classmethod
    def from_strings(cls, values: dict[str, str], **overrides) -> "StoreConfig":
        """Build from ``broker.conf``-style strings; keys that are not store
        settings are ignored (the broker's own config takes them)."""
        kwargs = {}
        for old, name in OLD_NAMES.items():
            if old in values and name in values and values[old].strip() != values[name].strip():
                raise ValueError(f"{old}={values[old]} and {name}={values[name]}: one setting "
                                 f"(the first is its old spelling), given twice")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for key, raw in values.items():
            name = OLD_NAMES.get(key, key)
            if name in fields:
                kwargs[name] = _convert(key, fields[name].type, raw)
        kwargs.update(overrides)
        return cls(**kwargs)

    @classmethod
    def of_store(cls, root: str, files) -> "StoreConfig":
        """Settings to read the store at ``root`` by (tools, no broker.conf):
        the directories it recorded (``record_paths``), the defaults else."""
        return cls(storePathRootDir=os.path.abspath(os.path.expanduser(root)),
                   **recorded_paths(files, root))


def recorded_paths(files, root: str) -> dict[str, str]:
    """The data directories the store at ``root`` was last opened with, those
    not at their default (``record_paths``)."""
    from .checkpoint import load_table
    table = load_table(files, root, PATHS_TABLE)
    return {k: v for k, v in table.items() if k in DATA_DIRS and isinstance(v, str) and v}


def record_paths(config: StoreConfig, files) -> None:
    """At the store's opening (recovery): refuse to start on a data directory
    other than the one holding this store's data (StorePathMoved: the CQs
    would be cut to an empty CommitLog), and record the configured ones in
    <root>/config/storePath.json, so tools given only the root find them."""
    from .checkpoint import config_path, save_table
    root = config.storePathRootDir
    before = StoreConfig(storePathRootDir=root, **recorded_paths(files, root))
    for name in DATA_DIRS:
        was, now = before.data_dir(name), config.data_dir(name)
        if was != now and files.listdir(was):
            raise StorePathMoved(
                f"{name}={now}: this store's data is in {was} (recorded in "
                f"{config_path(root, PATHS_TABLE)}); set {name}={was}, or move the files there")
    want = {name: config.data_dir(name) for name in DATA_DIRS if getattr(config, name)}
    if want != recorded_paths(files, root):
        save_table(files, root, PATHS_TABLE, want)


def store_root_problem(path: str) -> str | None:
    """Why ``path`` cannot be (or become) a store directory, or None: it, or
    a directory above it, is something other than a directory."""
    p = os.path.abspath(path)
    while True:
        if os.path.lexists(p):
            if os.path.isdir(p):
                return None
            kind = "a file, not a directory" if os.path.isfile(p) else "not a directory"
            return f"is {kind}" if p == os.path.abspath(path) else f"{p} is {kind}"
        parent = os.path.dirname(p)
        if parent == p:
            return None
        p = parent


def _convert(name: str, type_name, raw: str):
    raw = raw.strip()
    if type_name in ("int", int):
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"{name}={raw!r}: not an integer") from None
    if type_name in ("bool", bool):
        if raw.lower() not in ("true", "false"):
            raise ValueError(f"{name}={raw!r}: must be true or false")
        return raw.lower() == "true"
    return raw
