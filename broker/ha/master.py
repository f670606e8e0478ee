"""The master's end: accept slaves, stream them the CommitLog (RocketMQ's
``HAService`` + ``HAConnection``).

One selector loop in the ``shmq-ha`` process, phases in order each turn:
wait (the listener, every slave socket, the store's wake-up socket; at most
``TICK_S``), accept, read reports, send, housekeeping. Per connection:

    request   the slave's first report: where its stream starts (0: an
              empty slave, sent from the first segment still kept)
    acks      every report; the highest over all slaves is published
              as ``confirm_pos`` (only grows) and wakes parked SYNC sends
    next      the next CommitLog byte to send; frames are cut at the
              published ``write_pos``, at a segment's end and at
              ``haTransferBatchSize`` or CATCHUP_FRAME_BYTES, the larger
              (a backlog goes in 1 MiB frames), and sent from the mapping
              (sendmsg of header + view: no copy), several per call, never
              blocking: what the socket does not take waits for it to be
              writable. Not by sendfile: on loopback the master's copy then
              moves to the slave (the receive copies from the page cache
              instead of from what the send just wrote), whose CPU per GB
              caught up grew by a third or more, and the slave is what
              limits it

A slave that reports past the master's end, needs bytes retention deleted
(its store must then be emptied or copied anew), or says nothing for
``haHousekeepingInterval``, is dropped, with a line saying why; ``ha_slaves``
counts the live connections (published at once, so a SYNC_MASTER send
answers SLAVE_NOT_AVAILABLE as soon as the last slave is gone). A slave
that comes back every second to be dropped, before a byte was sent to it,
for the same reason (a store ahead of this one, or behind what is kept)
is logged once, then at DEBUG until it is sent bytes. Such a slave is
known by its host and the offset it asks from (its port changes with each
connection): another slave on that host, asking from its own offset, is
logged as any (keyed by host alone, one refused slave on 127.0.0.1 hid a
healthy one's lines).
"""
from __future__ import annotations

import logging
import selectors
import socket
import time

from shmq.core.store import MessageStore
from shmq.ipc.control import WANT_FLUSH, WANT_PUBLISH, ControlBlock

from ..config import BrokerConfig
from ..logs import Repeats
from .protocol import Reports, header

log = logging.getLogger("shmq.ha")
TICK_S = 0.1
FRAMES_PER_SEND = 16
# a frame's most bytes when more than haTransferBatchSize waits (a slave
# catching up): the slave writes each frame's body on its own; a Java
# HAClient reads into a 4 MiB buffer that must hold a whole frame, so this
# stays well below that
CATCHUP_FRAME_BYTES = 1 << 20
RECV_BYTES = 64 * 1024
# refused slaves remembered for quieting their lines (one a second otherwise):
# a fixed slave's entry is never taken out, so the oldest go past this many
REFUSED_KEPT = 64


class Connection:
    def __init__(self, sock: socket.socket, peer: str, now: float):
        self.sock, self.peer = sock, peer
        self.reports = Reports()
        self.request = -1          # the first report: where to start
        self.next = -1             # the next CommitLog byte to send
        self.pending: list = []    # what the socket has not taken yet (buffers)
        self.last_read = self.last_write = now
        self.fed = False           # a byte was sent to it


class HAService:
    def __init__(self, config: BrokerConfig, store: MessageStore, cb: ControlBlock,
                 listener: socket.socket, clock=time.monotonic):
        self.config, self.store, self.cb = config, store, cb
        self.listener = listener
        self.clock = clock
        self.seg = store.config.mappedFileSizeCommitLog
        self.sel = selectors.DefaultSelector()
        listener.setblocking(False)
        self.sel.register(listener, selectors.EVENT_READ, None)
        self.sel.register(cb.waiter.fileno(), selectors.EVENT_READ, "wake")
        self.conns: dict[socket.socket, Connection] = {}
        # (host, offset asked from) -> why that slave was last dropped before a byte was sent
        self.refused = Repeats(REFUSED_KEPT)
        st = store.state
        st.set("ha_slaves", 0)       # a restarted service: whatever its predecessor counted is gone
        self.acked = st.get("confirm_pos")
        self.cl_min = st.get("cl_min_offset")

    # ------------------------------------------------------------------ loop
    def step(self) -> None:
        now = self.clock()
        for key, events in self.sel.select(TICK_S):
            if key.fileobj is self.listener:
                self._accept(now)
            elif key.data == "wake":
                self.cb.waiter.drain()
            else:
                c = key.data
                if events & selectors.EVENT_READ:
                    self._read(c, now)
        for c in list(self.conns.values()):
            self._send(c, now)
        hk = self.config.haHousekeepingInterval / 1000
        for c in list(self.conns.values()):
            if now - c.last_read > hk:
                self._drop(c, f"nothing read for {hk:.0f} s (haHousekeepingInterval)")

    def close(self) -> None:
        for c in list(self.conns.values()):
            self._drop(c, "the broker stops")
        self.sel.close()

    # ---------------------------------------------------------------- accept
    def _accept(self, now: float) -> None:
        try:
            sock, addr = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        c = Connection(sock, f"{addr[0]}:{addr[1]}", now)
        self.conns[sock] = c
        self.sel.register(sock, selectors.EVENT_READ, c)
        self._count()
        log.debug("HA: slave %s connected", c.peer)     # INFO at its first report: who it is

    def _count(self) -> None:
        self.store.state.set("ha_slaves", len(self.conns))
        self.cb.set_flag(WANT_PUBLISH, bool(self.conns))
        self.cb.wake_flagged(WANT_FLUSH)    # parked SYNC sends: maybe no slave is left

    def _drop(self, c: Connection, why: str) -> None:
        if self.conns.pop(c.sock, None) is None:
            return
        key = (c.peer.rpartition(":")[0], c.request)
        quiet = not c.fed and self.refused.get(key) == why
        log.log(logging.DEBUG if quiet else logging.INFO, "HA: slave %s dropped: %s", c.peer, why)
        if not c.fed:
            self.refused.note(key, why)
        try:
            self.sel.unregister(c.sock)
        except (KeyError, ValueError):
            pass
        c.sock.close()
        self._count()

    # ------------------------------------------------------------------ read
    def _read(self, c: Connection, now: float) -> None:
        try:
            data = c.sock.recv(RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._drop(c, e.strerror or str(e))
            return
        if not data:
            self._drop(c, "closed by the slave")
            return
        c.last_read = now
        offset = c.reports.feed(data)
        if offset is None:
            return
        st = self.store.state
        if offset > st.write_pos:        # never an ack: the bytes past the end are not ours
            # (a master that lost its unflushed tail, a store from a backup, another
            # master's slave): counted, it would answer SEND_OK for sends no slave has
            asked = c.request < 0
            if asked:
                c.request = offset
            self._drop(c, f"it {'asks from' if asked else 'reports'} offset {offset}, "
                          f"past this CommitLog's end {st.write_pos}")
            return
        if c.request < 0:
            c.request = offset
            log.log(logging.DEBUG if self.refused.get((c.peer.rpartition(":")[0], offset))
                    else logging.INFO, "HA: slave %s connected, asks from offset %d (this "
                    "CommitLog: %d..%d)", c.peer, offset, st.get("cl_min_offset"), st.write_pos)
        if offset > self.acked:
            self.acked = offset
            st.set("confirm_pos", offset)
            st.set("ha_acks", st.get("ha_acks") + 1)
            self.cb.wake_flagged(WANT_FLUSH)

    # ------------------------------------------------------------------ send
    def _send(self, c: Connection, now: float) -> None:
        if c.request < 0:
            return
        st = self.store.state
        if c.next < 0:
            c.next = c.request or st.get("cl_min_offset")
        if not c.pending:
            cl_min = st.get("cl_min_offset")
            if c.next < cl_min:      # retention deleted what this slave still needs
                self._drop(c, f"it needs offset {c.next}, below the first byte kept here "
                              f"({cl_min}): empty its store (it is then sent what is kept) or copy "
                              f"this one to it")
                return
            if cl_min != self.cl_min:
                self.store.release_deleted()
                self.cl_min = cl_min
            self._cut(c, st.write_pos)
            if not c.pending and now - c.last_write > self.config.haSendHeartbeatInterval / 1000:
                c.pending.append(memoryview(header(c.next, 0)))
        if not c.pending:
            return
        try:
            n = c.sock.sendmsg(c.pending)
        except (BlockingIOError, InterruptedError):
            n = 0
        except OSError as e:
            self._drop(c, e.strerror or str(e))
            return
        c.last_write = now
        if n and not c.fed:
            c.fed = True
            self.refused.forget((c.peer.rpartition(":")[0], c.request))
        self._consume(c, n)
        more = c.pending or c.next < st.write_pos     # a backlog: send on as the socket drains
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if more else 0)
        self.sel.modify(c.sock, events, c)

    def _cut(self, c: Connection, end: int) -> None:
        """Frames of [c.next, end), up to FRAMES_PER_SEND, onto ``pending``."""
        cl = self.store.cl
        batch = max(self.config.haTransferBatchSize, CATCHUP_FRAME_BYTES)
        for _ in range(FRAMES_PER_SEND):
            if c.next >= end:
                return
            s = cl.segment_start(c.next)
            n = min(end, s + self.seg, c.next + batch) - c.next
            c.pending.append(memoryview(header(c.next, n)))
            c.pending.append(memoryview(cl.view(c.next, n)))
            c.next += n

    @staticmethod
    def _consume(c: Connection, n: int) -> None:
        pending = c.pending
        i = 0
        while i < len(pending) and n >= len(pending[i]):
            n -= len(pending[i])
            i += 1
        del pending[:i]
        if n:
            pending[0] = pending[0][n:]
