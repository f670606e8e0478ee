"""The broker's log files: ``~/logs/shmqlogs/{broker,store,remoting,namesrv}.log``.

One function, ``setup(role, config)``, configures logging in every broker
process (boss, workers, flusher, services, NameServer) and in ``shmq
namesrv``: each line goes to stderr, as before, and to the file of its
area, as RocketMQ writes ``~/logs/rocketmqlogs/broker.log``, ``store.log``,
``remoting.log`` and ``namesrv.log``. A logger's area is the longest prefix
of its name in ``AREAS`` (``shmq.store``, ``shmq.flusher``, ``shmq.ha`` → store.log,
``shmq.reactor`` → remoting.log, ``shmq.broker.namesrv`` → namesrv.log);
every other ``shmq`` logger writes broker.log. Each line names the process
that wrote it (``worker-0``, ``flusher`` ...).

Settings (broker.conf, named after RocketMQ's client logging properties
``rocketmq.client.logRoot`` / ``logLevel`` / ``logFileMaxSize`` /
``logFileMaxIndex``; RocketMQ's broker sets them in logback_broker.xml) and
the environment variables that override them:

    logRoot          SHMQ_LOG_DIR             ~/logs/shmqlogs
    logLevel         SHMQ_LOG_LEVEL           INFO (DEBUG, INFO, WARN, ERROR)
    logFileMaxSize   SHMQ_LOG_FILE_MAX_SIZE   128 MiB: a file past it rotates
    logFileMaxIndex  SHMQ_LOG_FILE_MAX_INDEX  10: rotated files kept (.1 … .10)

The boss resolves them once (``setup`` with its config) and writes the
result back into its environment, which every child inherits (the fork
server and the flusher start after it): a child calls ``setup(role)`` and
reads the same settings, without being handed the broker's config.

Many processes, one file (the invariant: no line is torn, interleaved or
lost at rotation). Every process opens each file O_APPEND and writes a
whole line with one write(2): the kernel appends each write at the end,
under the inode's lock, so lines from different processes never overlap.
Before each write a process compares the path's inode with its descriptor's
(as ``logging.handlers.WatchedFileHandler``) and reopens the path if another
process rotated it. Rotation is done by whichever process finds the file at
or past the size cap after its write, holding an exclusive flock(2) on the
log directory, and only if the path is still past the cap once it holds the
lock (so N processes crossing the cap at once rotate once): broker.log.9 →
.10, …, broker.log → broker.log.1. A process that wrote between another's
rename and its own reopen wrote into broker.log.1: the line is kept, in the
file that was current when it checked. Only the oldest file, .N, is dropped
(the cap). A process's lines therefore appear in order, oldest file first,
and what is kept of them is a suffix with no gap.

Why not the alternatives: a RotatingFileHandler per process renames the
file under the others, which keep writing into the renamed (and later
deleted) file; a QueueHandler to one writer process puts a process in every
line's path, and a line is lost when the writer dies or its queue is full;
one file per process scatters what an operator greps for.
"""
from __future__ import annotations

import fcntl
import logging
import os
import sys
from dataclasses import dataclass

# logger name prefix -> file (the longest matching prefix wins; else broker)
AREAS = {
    "shmq.store": "store", "shmq.flusher": "store",
    "shmq.ha": "store",                  # replication: RocketMQ's HAService logs to store.log
    "shmq.reactor": "remoting", "shmq.remoting": "remoting",
    "shmq.broker.namesrv": "namesrv", "shmq.namesrv": "namesrv",
}
FILES = ("broker", "store", "remoting", "namesrv")
DEFAULT_AREA = "broker"
LEVELS = {"TRACE": logging.DEBUG, "DEBUG": logging.DEBUG, "INFO": logging.INFO,
          "WARN": logging.WARNING, "WARNING": logging.WARNING, "ERROR": logging.ERROR,
          "OFF": logging.CRITICAL + 1}
ENV = {"logRoot": "SHMQ_LOG_DIR", "logLevel": "SHMQ_LOG_LEVEL",
       "logFileMaxSize": "SHMQ_LOG_FILE_MAX_SIZE", "logFileMaxIndex": "SHMQ_LOG_FILE_MAX_INDEX"}
DEFAULT_ROOT = os.path.join("~", "logs", "shmqlogs")
DEFAULT_MAX_SIZE = 128 * 1024 * 1024       # RocketMQ's logback_broker.xml: 128MB
DEFAULT_MAX_INDEX = 10                     # ... and maxIndex 10
MAX_SIZE_MIN = 4096


class Repeats:
    """What a log line last said, per key (a peer's host and what it got
    wrong), so that a client repeating one mistake every second is logged
    once and then quietly: at most ``kept`` keys, the oldest forgotten
    first (a key is never taken out when the mistake stops)."""

    def __init__(self, kept: int):
        self.kept = kept
        self._last: dict = {}

    def get(self, key, default=None):
        return self._last.get(key, default)

    def note(self, key, value) -> None:
        """``key`` said ``value`` now (the newest key)."""
        last = self._last
        last.pop(key, None)
        last[key] = value
        while len(last) > self.kept:
            del last[next(iter(last))]

    def forget(self, key) -> None:
        self._last.pop(key, None)


# how long a process whose disk refused a write waits before it tries again
DISK_RETRY_S = 10.0


class DiskWait:
    """A background writer (the index build, the timer log) whose disk
    refused a write (``core.files.DISK_ERRORS``: full, read-only, failing):
    one WARNING naming ``what`` and the error, no try for ``retry_s``, then
    on; INFO once a try succeeds. Its process keeps doing everything else
    (it used to die of the SIGBUS, and the boss stopped a broker whose
    process kept dying). Any other OSError is a bug: raised."""

    def __init__(self, log: logging.Logger, what: str, meanwhile: str,
                 retry_s: float = DISK_RETRY_S):
        self.log, self.what, self.meanwhile, self.retry_ms = log, what, meanwhile, int(retry_s * 1000)
        self.until = 0
        self.failing = False

    def ready(self, now_ms: int) -> bool:
        return now_ms >= self.until

    def failed(self, e: OSError, now_ms: int) -> None:
        from shmq.core.files import DISK_ERRORS
        if e.errno not in DISK_ERRORS:
            raise e
        if not self.failing:
            self.log.warning("cannot write %s: %s; %s (trying again every %.0f s)", self.what,
                             e.strerror or e, self.meanwhile, self.retry_ms / 1000)
        self.failing = True
        self.until = now_ms + self.retry_ms

    def ok(self) -> None:
        if self.failing:
            self.log.info("writing %s again", self.what)
            self.failing = False


@dataclass(frozen=True)
class LogSettings:
    logRoot: str = DEFAULT_ROOT
    logLevel: str = "INFO"
    logFileMaxSize: int = DEFAULT_MAX_SIZE
    logFileMaxIndex: int = DEFAULT_MAX_INDEX

    def problems(self) -> list[str]:
        """What is wrong with these settings, each naming its setting."""
        out = []
        if self.logLevel.upper() not in LEVELS:
            out.append(f"logLevel={self.logLevel!r}: must be one of "
                       f"TRACE, DEBUG, INFO, WARN, ERROR, OFF")
        if self.logFileMaxSize < MAX_SIZE_MIN:
            out.append(f"logFileMaxSize={self.logFileMaxSize}: at least {MAX_SIZE_MIN} bytes")
        if not 1 <= self.logFileMaxIndex <= 1000:
            out.append(f"logFileMaxIndex={self.logFileMaxIndex}: must be 1..1000")
        return out

    @property
    def level(self) -> int:
        return LEVELS[self.logLevel.upper()]

    @property
    def directory(self) -> str:
        return os.path.abspath(os.path.expanduser(self.logRoot))


def resolve(config=None, environ=os.environ) -> LogSettings:
    """The settings in effect: ``config``'s (a BrokerConfig, or None for the
    defaults), each overridden by its environment variable when that is set.
    ValueError names the setting or variable that is wrong."""
    values = {name: getattr(config, name) if config is not None else getattr(LogSettings, name)
              for name in ENV}
    for name, var in ENV.items():
        raw = environ.get(var, "").strip()
        if not raw:
            continue
        if isinstance(values[name], int):
            try:
                values[name] = int(raw)
            except ValueError:
                raise ValueError(f"{var}={raw!r}: not an integer") from None
        else:
            values[name] = raw
    settings = LogSettings(**values)
    bad = settings.problems()
    if bad:
        raise ValueError("; ".join(bad))
    return settings


def area_of(logger_name: str) -> str:
    best, area = -1, DEFAULT_AREA
    for prefix, a in AREAS.items():
        if (logger_name == prefix or logger_name.startswith(prefix + ".")) and len(prefix) > best:
            best, area = len(prefix), a
    return area


class SharedRotatingFile(logging.Handler):
    """Appends lines to ``path`` beside other processes doing the same, and
    rotates it past ``max_bytes`` keeping ``backups`` files (module doc)."""

    def __init__(self, path: str, max_bytes: int, backups: int):
        super().__init__()
        self.path, self.max_bytes, self.backups = path, max_bytes, backups
        self.dir = os.path.dirname(path)
        self.fd = -1
        self.ino = None
        self.failing = False

    def _open(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        st = os.fstat(self.fd)
        self.ino = (st.st_dev, st.st_ino)

    def _current(self) -> None:
        """Reopen if the path is not our file any more (rotated by another process)."""
        try:
            st = os.stat(self.path)
            same = (st.st_dev, st.st_ino) == self.ino
        except FileNotFoundError:
            same = False
        if not same or self.fd < 0:
            self._open()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            data = (self.format(record) + "\n").encode("utf-8", "backslashreplace")
        except Exception:
            self.handleError(record)
            return
        with self.lock:
            try:
                self._current()
                os.write(self.fd, data)         # one write: one whole line (O_APPEND)
                if os.fstat(self.fd).st_size >= self.max_bytes:
                    self._rotate()
                if self.failing:
                    self.failing = False
                    print(f"log file {self.path}: writing again", file=sys.stderr)
            except OSError as e:
                # A full disk or a removed directory: the line is on stderr
                # still; say so once, not per line, and try again next line.
                if not self.failing:
                    self.failing = True
                    print(f"log file {self.path}: cannot write ({e.strerror}); lines go to "
                          f"stderr only until it works", file=sys.stderr)
                if self.fd >= 0:
                    os.close(self.fd)
                    self.fd = -1

    def _rotate(self) -> None:
        dfd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fcntl.flock(dfd, fcntl.LOCK_EX)     # one rotation at a time, across processes
            try:
                st = os.stat(self.path)
            except FileNotFoundError:
                st = None
            if st is not None and st.st_size >= self.max_bytes:   # not rotated meanwhile
                for i in range(self.backups - 1, 0, -1):
                    older = f"{self.path}.{i}"
                    if os.path.exists(older):
                        os.replace(older, f"{self.path}.{i + 1}")
                os.replace(self.path, f"{self.path}.1")
        finally:
            os.close(dfd)                       # releases the lock
        self._open()

    def close(self) -> None:
        with self.lock:
            if self.fd >= 0:
                os.close(self.fd)
                self.fd = -1
        super().close()


class _AreaFilter(logging.Filter):
    def __init__(self, area: str):
        super().__init__()
        self.area = area

    def filter(self, record: logging.LogRecord) -> bool:
        return area_of(record.name) == self.area


_installed: list[logging.Handler] = []


def setup(role: str, config=None, stream=None) -> LogSettings:
    """Configure logging for this process, named ``role`` in every line:
    stderr and the area files under the log directory. ``config`` (the
    boss's BrokerConfig) is resolved against the environment and written
    back to it for the children; without it the environment (or the
    defaults) decide. Calling it again replaces what it set up.
    ValueError: a bad setting; OSError: the directory cannot be made."""
    settings = resolve(config)
    if config is not None:
        os.environ.update({var: str(getattr(settings, name)) for name, var in ENV.items()})
    os.makedirs(settings.directory, exist_ok=True)
    root = logging.getLogger()
    for h in _installed:
        root.removeHandler(h)
        h.close()
    _installed.clear()
    fmt = logging.Formatter(f"%(asctime)s {role} %(levelname)s %(name)s %(message)s")
    console = logging.StreamHandler(stream or sys.stderr)
    console.setFormatter(fmt)
    _installed.append(console)
    for area in FILES:
        h = SharedRotatingFile(os.path.join(settings.directory, f"{area}.log"),
                               settings.logFileMaxSize, settings.logFileMaxIndex)
        h.setFormatter(fmt)
        h.addFilter(_AreaFilter(area))
        _installed.append(h)
    for h in _installed:
        root.addHandler(h)
    # the level is shmq's loggers'; other libraries' (numba's compiler logs
    # at DEBUG) stay at WARNING or above, so DEBUG means shmq's own lines
    logging.getLogger("shmq").setLevel(settings.level)
    root.setLevel(max(settings.level, logging.WARNING))
    return settings
