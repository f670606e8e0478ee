"""A single-threaded reactor (``select.epoll``): connections, timers, readers.

Every broker process that serves sockets (a worker, the NameServer) runs one
``Reactor``. A ``Connection`` reads bytes into the sans-I/O ``FrameDecoder``
and hands each complete command to the process's handler, which runs it to
completion and answers with ``Connection.send``; it may also answer later (a
parked pull, a sync send waiting for the flush), so replies on a connection
go out in whatever order they are ready.

Output is a queue of memory slices and file ranges. ``send`` only queues:
every reply made for a connection in one reactor turn (the requests one
``recv`` brought, the parked pulls one wake-up released) leaves together
when the turn ends, in one ``sendmsg`` for adjacent memory pieces (a pull's
header and its records' slices of the mapping included) and ``sendfile``
for file ranges; what the socket does not take stays queued, and slices of
shared mappings that must wait are copied first, so no mapping stays pinned
by a slow client. A
connection with more than ``out_max`` bytes queued stops being read until it
drains to half that: a client that stops reading replies only stops itself.
A malformed frame closes that connection and is logged; nothing else.
Bytes of unfinished frames are counted across the reactor's connections:
past ``pending_max`` the connection holding the most is closed, so clients
that send part of a large frame and stop cannot grow the process without
bound (each is capped at the 16 MiB frame limit, but not their sum).

The loop polls ``select.epoll`` itself, with a dict from file descriptor to
its connection or reader, rather than through ``selectors``: the wrapper's
key objects, mask translation and list building cost a single-message
request about a microsecond per turn (issue 14's budget is 20 µs for the
whole send). As ``selectors`` does, an error or hang-up on a descriptor
runs both its read and its write handler, each only if it is interested.
"""
from __future__ import annotations

import heapq
import itertools
import logging
import os
import select
import signal
import socket
import time
from collections import deque
from typing import Callable

from shmq.core.commitlog import FileRange  # a piece of a pull body, as the store makes it
from shmq.ipc.remoting import FrameDecoder, RemoteProtocolError, RemotingCommand

from .logs import Repeats

log = logging.getLogger("shmq.reactor")

RECV_BYTES = 256 * 1024
# a connection closed for the same reason as one from the same host less than
# this long ago is a DEBUG line (a client retrying the same mistake every
# second — an HA slave pointed at this port — wrote a WARNING a second)
QUIET_REPEATS_S = 60.0
QUIET_KEPT = 256
IOV_MAX = 512
_IN, _OUT = select.EPOLLIN, select.EPOLLOUT
_READABLE = select.EPOLLIN | select.EPOLLERR | select.EPOLLHUP
_WRITABLE = select.EPOLLOUT | select.EPOLLERR | select.EPOLLHUP


class Connection:
    _ids = itertools.count(1)

    def __init__(self, reactor: "Reactor", sock: socket.socket, peer: str,
                 on_command: Callable[["Connection", RemotingCommand], None],
                 on_close: Callable[["Connection"], None] | None, out_max: int):
        self.id = next(self._ids)
        self.reactor = reactor
        self.sock = sock
        self.fd = sock.fileno()
        self.peer = peer
        self.decoder = FrameDecoder()
        self.on_command = on_command
        self.on_close = on_close
        self.out: deque = deque()
        self.out_bytes = 0
        self.out_max = out_max
        self.reading = True
        self.writing = False
        self.closed = False
        self.dirty = False         # queued output not yet offered to the socket this turn
        self.writes = 0            # sendmsg/send/sendfile calls made (what coalescing saves)
        self.last_active = time.monotonic()    # when its last bytes came (requests since wait)
        self.held = 0              # bytes in its decoder after the last read (Reactor.pending)
        self.attrs: dict = {}      # what the handlers remember about this client (Peer.attrs)
        # a reader of whole frames tried before the decoder (the worker's
        # send lane): lane(conn, the command the decoder last gave or None)
        self.lane: Callable[["Connection", RemotingCommand | None], None] | None = None

    # ------------------------------------------------------------ reading
    def _on_readable(self) -> None:
        buf = self.reactor.recv_buf
        try:
            n = self.sock.recv_into(buf)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self.close(f"read failed: {e}")
            return
        if not n:
            self.close("closed by peer")
            return
        self.last_active = time.monotonic()
        self.decoder.receive_data(self.reactor.recv_view[:n])
        self._drain_decoder()

    # ------------------------------------------------------------ writing
    def send(self, head: bytes, parts=()) -> None:
        """Queue ``head`` then each of ``parts`` (bytes, memoryview, FileRange);
        they go out when this reactor turn ends (``Reactor.flush``), with
        every other reply of the turn, or at once past ``out_max``."""
        if self.closed:
            return
        out = self.out
        out.append(head)
        n = len(head)
        for p in parts:
            if isinstance(p, FileRange):
                if p.n:
                    out.append(p)
                    n += p.n
            else:
                mv = memoryview(p).cast("B")
                if mv.nbytes:
                    out.append(mv)
                    n += mv.nbytes
        self.out_bytes += n
        if not self.dirty:
            self.dirty = True
            self.reactor.dirty.append(self)
        if self.out_bytes > self.out_max:
            self.write_out()       # and stop reading while that much waits

    def write_out(self) -> None:
        """Offer the queued output to the socket; queue what it does not take."""
        self.dirty = False
        if self.closed or not self.out:
            return
        self._flush()
        if self.out and not self.closed:
            # Whatever waits must not pin shared mappings: copy the slices.
            self.out = deque(p if isinstance(p, (FileRange, bytes)) or isinstance(p.obj, bytes)
                             else memoryview(p.tobytes()) for p in self.out)
            self._update_interest()

    def _flush(self) -> None:
        out = self.out
        try:
            while out:
                first = out[0]
                if isinstance(first, FileRange):
                    self.writes += 1
                    n = os.sendfile(self.fd, first.fd, first.off, first.n)
                    self.out_bytes -= n
                    if n == first.n:
                        out.popleft()
                        continue
                    first.off += n
                    first.n -= n
                    if n == 0:
                        return
                    continue
                bufs = []
                for p in out:
                    if isinstance(p, FileRange) or len(bufs) == IOV_MAX:
                        break
                    bufs.append(p)
                self.writes += 1
                n = self.sock.sendmsg(bufs) if len(bufs) > 1 else self.sock.send(bufs[0])
                self.out_bytes -= n
                while n:
                    p = out[0]
                    size = len(p) if isinstance(p, bytes) else p.nbytes
                    if n >= size:
                        n -= size
                        out.popleft()
                    else:
                        out[0] = memoryview(p)[n:]
                        n = 0
                        return
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self.close(f"write failed: {e}")

    def _on_writable(self) -> None:
        self._flush()
        self._update_interest()

    def _update_interest(self) -> None:
        if self.closed:
            return
        want_write = bool(self.out)
        if self.out_bytes > self.out_max:
            want_read = False
        elif self.out_bytes <= self.out_max // 2:
            want_read = True
        else:
            want_read = self.reading
        if (want_read, want_write) == (self.reading, self.writing):
            return
        resumed = want_read and not self.reading
        self.reading, self.writing = want_read, want_write
        self.reactor.watch(self.fd, (_IN if want_read else 0) | (_OUT if want_write else 0), self)
        if resumed:   # commands that arrived while we were not reading
            self.reactor.call_soon(self._drain_decoder)

    def _drain_decoder(self) -> None:
        """Run every complete command; under back-pressure (not reading) the
        rest waits in the decoder until the output drains. The lane, where
        there is one, takes what frames it can first, and again after each
        command the decoder gives."""
        lane, cmd = self.lane, None
        while not self.closed and self.reading:
            if lane is not None:
                lane(self, cmd)
                if self.closed or not self.reading:
                    break
            try:
                cmd = self.decoder.next_command()
            except RemoteProtocolError as e:
                self.close(f"protocol error: {e}")
                return
            if cmd is None:
                break
            self.on_command(self, cmd)
        held = self.decoder.buffered_bytes
        if held != self.held and not self.closed:
            r = self.reactor
            r.pending += held - self.held
            self.held = held
            if r.pending > r.pending_max:
                r.shed()

    def close(self, reason: str = "closed") -> None:
        if self.closed:
            return
        if self.reactor.end_turn is not None:
            # requests this turn kept for its end (the worker's taken sends)
            # are run now, their replies queued before the close
            self.reactor.end_turn()
            if self.closed:
                return
        if self.dirty and self.out:    # replies made this turn, before what closes it
            self.dirty = False
            self._flush()
            if self.closed:
                return
        self.closed = True
        if reason in ("closed by peer", "closed"):
            log.debug("connection %s: %s", self.peer, reason)
        else:
            self.reactor.warn_closed(self.peer, reason)
        self.reactor.watch(self.fd, 0, self)
        self.reactor.conns.pop(self.id, None)
        self.reactor.pending -= self.held
        self.held = 0
        self.sock.close()
        self.out.clear()
        self.out_bytes = 0
        if self.on_close is not None:
            self.on_close(self)


class _Reader:
    __slots__ = ("callback",)

    def __init__(self, callback):
        self.callback = callback


class SignalWakeup:
    """A socket that every signal this process receives makes readable
    (``signal.set_wakeup_fd``; main thread only), for a loop's selector: the
    signal then ends the current ``select`` at once (its Python handler runs
    before the loop looks at its flags) instead of when the timeout ends."""

    def __init__(self):
        self.r, self.w = socket.socketpair()
        self.r.setblocking(False)
        self.w.setblocking(False)
        signal.set_wakeup_fd(self.w.fileno(), warn_on_full_buffer=False)

    def drain(self) -> None:
        try:
            while self.r.recv(512):
                pass
        except (BlockingIOError, InterruptedError):
            pass


class Reactor:
    def __init__(self, pending_max: int = 1 << 62):
        self.ep = select.epoll()
        self.watched: dict[int, object] = {}  # fd → its Connection or _Reader
        self.conns: dict[int, Connection] = {}
        self._timers: list = []
        self._seq = itertools.count()
        self._soon: deque = deque()
        self.dirty: list[Connection] = []    # connections with output queued this turn
        # One receive buffer for every connection (the decoder copies out of
        # it): ``recv(RECV_BYTES)`` allocated 256 KiB per call, above malloc's
        # mmap threshold, so every request paid an mmap, page faults and a
        # munmap — 3× a raw echo server's CPU per request.
        self.recv_buf = bytearray(RECV_BYTES)
        self.recv_view = memoryview(self.recv_buf)
        self.stopping = False
        self.pending = 0                     # bytes held in the connections' decoders
        self.pending_max = pending_max
        # called at the end of each turn, before its replies leave (the
        # worker's driver: the sends it took this turn are appended then)
        self.end_turn: Callable[[], None] | None = None
        # called after end_turn, once every request of the turn is handled,
        # before its replies leave and the loop sleeps (Redis's beforeSleep:
        # the worker's group commit of its turn's sync sends)
        self.before_sleep: Callable[[], None] | None = None
        # (peer host, why) -> [when it was last a WARNING, DEBUG lines since]
        self._warned = Repeats(QUIET_KEPT)

    def shed(self) -> None:
        """Over ``pending_max``: close the connection holding the most bytes
        of unfinished requests until under it again."""
        while self.pending > self.pending_max and self.conns:
            conn = max(self.conns.values(), key=lambda c: c.held)
            if not conn.held:
                return
            conn.close(f"closed holding {conn.held} bytes of unfinished requests: this process "
                       f"held {self.pending} across its connections, past its limit "
                       f"{self.pending_max} (serverPendingFrameBytesMax)")

    def watch(self, fd: int, events: int, obj) -> None:
        """Poll ``fd`` for ``events`` (EPOLLIN / EPOLLOUT) on behalf of ``obj``;
        no events: stop polling it."""
        if events:
            if fd in self.watched:
                self.ep.modify(fd, events)
            else:
                self.ep.register(fd, events)
            self.watched[fd] = obj
        elif self.watched.pop(fd, None) is not None:
            try:
                self.ep.unregister(fd)
            except OSError:       # closed already: the kernel dropped it
                pass

    def add_reader(self, fileobj, callback: Callable[[], None]) -> None:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        if fd in self.watched:
            raise KeyError(f"{fileobj!r} (fd {fd}) is already registered")
        self.watch(fd, _IN, _Reader(callback))

    def wake_on_signals(self) -> None:
        """A signal ends the current ``select`` at once (its handler then
        runs before the loop checks ``stopping``), instead of up to a second
        later when the timeout ends: SIGTERM stops this process promptly."""
        self._signals = SignalWakeup()
        self.add_reader(self._signals.r, self._signals.drain)

    def remove_reader(self, fileobj) -> None:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        if fd not in self.watched:
            raise KeyError(f"{fileobj!r} (fd {fd}) is not registered")
        self.watch(fd, 0, None)

    def add_connection(self, sock: socket.socket, peer: str, on_command, on_close=None,
                       out_max: int = 8 << 20) -> Connection:
        sock.setblocking(False)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = Connection(self, sock, peer, on_command, on_close, out_max)
        self.conns[conn.id] = conn
        self.watch(conn.fd, _IN, conn)
        return conn

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> list:
        """Run ``fn`` after ``delay_s``; returns a handle for ``cancel``."""
        entry = [time.monotonic() + delay_s, next(self._seq), fn]
        heapq.heappush(self._timers, entry)
        return entry

    @staticmethod
    def cancel(entry: list) -> None:
        entry[2] = None

    def call_soon(self, fn: Callable[[], None]) -> None:
        self._soon.append(fn)

    def every(self, period_s: float, fn: Callable[[], None]) -> None:
        def tick():
            try:
                fn()
            finally:
                self.call_later(period_s, tick)
        self.call_later(period_s, tick)

    def run(self) -> None:
        while not self.stopping:
            self.run_once()

    def run_once(self) -> None:
        timeout = None
        if self._soon:
            timeout = 0
        elif self._timers:
            timeout = max(0.0, self._timers[0][0] - time.monotonic())
        watched = self.watched
        for fd, mask in self.ep.poll(-1 if timeout is None else min(timeout, 1.0)):
            obj = watched.get(fd)
            if obj is None:           # unwatched by an earlier handler of this turn
                continue
            if obj.__class__ is Connection:
                if mask & _WRITABLE and obj.writing and not obj.closed:
                    obj._on_writable()
                if mask & _READABLE and obj.reading and not obj.closed:
                    obj._on_readable()
            else:
                obj.callback()
        while self._soon:
            self._soon.popleft()()
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            _, _, fn = heapq.heappop(self._timers)
            if fn is not None:
                fn()
        if self.end_turn is not None:
            self.end_turn()
        if self.before_sleep is not None:
            self.before_sleep()
        self.flush()

    def flush(self) -> None:
        """End of a turn (or mid-turn, when the worker answers a group of
        sends: ``worker.ANSWER_EVERY``): each connection's queued replies
        leave in one write (``sendmsg`` of all its queued memory pieces)."""
        dirty = self.dirty
        while dirty:
            self.dirty = []
            for conn in dirty:
                conn.write_out()
            dirty = self.dirty

    def warn_closed(self, peer: str, reason: str) -> None:
        """A connection closed for ``reason``: a WARNING, unless one from the
        same host said the same less than QUIET_REPEATS_S ago (then DEBUG,
        counted in the next WARNING)."""
        key = (peer.rpartition(":")[0], reason)
        now = time.monotonic()
        seen = self._warned.get(key)
        if seen is not None and now - seen[0] < QUIET_REPEATS_S:
            seen[1] += 1
            log.debug("connection %s: %s", peer, reason)
            return
        more = f" ({seen[1]} more from {key[0]} in the last {QUIET_REPEATS_S:.0f} s)" \
            if seen is not None and seen[1] else ""
        log.warning("connection %s: %s%s", peer, reason, more)
        self._warned.note(key, [now, 0])

    def close_idle(self, idle_s: float) -> None:
        cutoff = time.monotonic() - idle_s
        for conn in [c for c in self.conns.values() if c.last_active < cutoff]:
            conn.close(f"idle for more than {idle_s:.0f} s")

    def close(self) -> None:
        self.flush()
        for conn in list(self.conns.values()):
            conn.close("shutting down")
        self.ep.close()
