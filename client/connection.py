"""One asyncio remoting connection to a broker or a NameServer.

Owns one socket (an ``asyncio.BufferedProtocol`` reading into one buffer
of its own, no stream reader task) and, through an ``OpaqueMatcher``
(ipc/matcher.py, shared with the blocking ipc/channel.py), the table of
requests waiting for their answer. Never retries, never picks a broker:
that is the producer's and the consumer's business.

Requests are matched to replies by ``opaque``, so any number may be in
flight and replies may come in any order. A request is a frame appended to
an output list and a future registered with the matcher (``pending``);
every frame queued in one turn of the event loop leaves in one
``transport.write`` at the end of that turn (64 pipelined sends are one
syscall, not 64). The protocol's ``data_received`` decodes whatever
arrived, and the future of each reply the matcher pairs is resolved right
there: no task per request, no task per read.

Deadlines cost nothing per request beyond a number: one timer per
connection sweeps ``pending`` at the earliest deadline it knows and is
re-armed at the next one (most requests are answered long before, so a
busy connection sweeps about once per timeout, not once per request; a
request with a shorter timeout than all those pending pulls the timer in).

Invariant: once ``closed`` is set, every future in ``pending`` has failed
with ``RemotingError`` naming the connection, and every later request fails
at once; a caller never waits past the close for an answer that cannot come.

Requests the server sends us (NOTIFY_CONSUMER_IDS_CHANGED,
CHECK_TRANSACTION_STATE, RESET_CONSUMER_CLIENT_OFFSET, …) go to
``on_request``, which may return a reply. Addresses are ``host:port`` or
``unix:/path``. Given ``credentials`` (an account of the broker's ACL), every
request is signed as RocketMQ's ACL clients sign it (ipc/signing.py); a
pre-encoded frame (``send_frame``) must come signed. Every frame says
its language is ``PYTHON`` (RocketMQ's LanguageCode 3, ``LANGUAGE``; a
pre-encoded frame writes it too), as the Java client says JAVA: brokers
show it in a group's connections, and the one answer that depends on it,
RocketMQ's ResetOffsetBodyForC, is for CPP alone. Fork-safe by construction: a connection belongs to the event
loop that opened it, and a client checks its pid before using any
(``ClientInstance``).
"""
from __future__ import annotations

import asyncio
import logging
import socket
from typing import Awaitable, Callable

from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.matcher import OpaqueMatcher, next_opaque
from shmq.ipc.remoting import FLAG_ONEWAY, FrameDecoder, RemoteProtocolError, RemotingCommand, encode
from shmq.ipc.signing import Credentials, sign

from .errors import EXPECTED, RemotingError

LANGUAGE = "PYTHON"        # the remoting header's language of every frame the client writes

log = logging.getLogger("shmq.client")

OnRequest = Callable[["Connection", RemotingCommand], Awaitable[RemotingCommand | None]]


RECV_BYTES = 256 * 1024


class Connection(asyncio.BufferedProtocol):
    def __init__(self, addr: str, on_request: OnRequest | None, credentials: Credentials | None = None):
        self.addr = addr
        self.on_request = on_request
        self.credentials = credentials
        # entries (future, deadline on the loop's clock, request code, timeout s)
        self._matcher = OpaqueMatcher(self._request_received)
        self.transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        self._decoder = FrameDecoder()
        self._recv_view = memoryview(bytearray(RECV_BYTES))   # asyncio reads into it
        self._out: list[bytes] = []            # frames queued this loop turn
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        # requests from the broker being served: the loop keeps only a weak
        # reference to a task, so one nobody holds can vanish mid-await
        self._serving: set[asyncio.Task] = set()

    @property
    def pending(self) -> dict:
        """opaque → (future, deadline, request code, timeout s), while unanswered."""
        return self._matcher.pending

    @property
    def closed(self) -> bool:
        return self._matcher.closed

    @classmethod
    async def open(cls, addr: str, on_request: OnRequest | None = None,
                   timeout: float = 3.0, credentials: Credentials | None = None) -> "Connection":
        # asyncio.timeout, not wait_for: in 3.11 wait_for can swallow a
        # cancellation that races with its result, and the task runs on
        loop = asyncio.get_running_loop()
        conn = cls(addr, on_request, credentials)
        try:
            async with asyncio.timeout(timeout):
                if addr.startswith("unix:"):
                    await loop.create_unix_connection(lambda: conn, addr[5:])
                else:
                    host, _, port = addr.rpartition(":")
                    tr, _ = await loop.create_connection(lambda: conn, host, int(port))
                    tr.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except (OSError, TimeoutError) as e:
            conn._closed(f"connect failed: {e or 'timed out'}")
            raise RemotingError(f"connect to {addr} failed: {e or 'timed out'}") from None
        return conn

    # ------------------------------------------------------------ requests
    def send_frame(self, opaque: int, frame: bytes, timeout: float, code: int = 0) -> asyncio.Future:
        """Queue ``frame`` (a request carrying ``opaque``); the future gets its
        reply, or RemotingError on timeout or close. No awaiting here."""
        m = self._matcher
        if m.closed:
            raise RemotingError(f"connection to {self.addr} is {m.why_closed}")
        fut = self._loop.create_future()
        deadline = self._loop.time() + timeout
        m.register(opaque, fut, deadline, code, timeout)
        if self._timer is None or deadline < self._timer_at:
            self._arm(deadline)
        self._write(frame)
        return fut

    def request(self, cmd: RemotingCommand, timeout: float = 3.0) -> asyncio.Future:
        cmd.opaque = next_opaque()
        cmd.language = LANGUAGE
        if self.credentials is not None:
            sign(cmd, self.credentials)
        return self.send_frame(cmd.opaque, encode(cmd), timeout, cmd.code)

    async def invoke(self, cmd: RemotingCommand, timeout: float = 3.0) -> RemotingCommand:
        return await self.request(cmd, timeout)

    def send_oneway(self, cmd: RemotingCommand) -> None:
        if self.closed:
            raise RemotingError(f"connection to {self.addr} is {self._matcher.why_closed}")
        cmd.flag |= FLAG_ONEWAY
        cmd.opaque = next_opaque()
        cmd.language = LANGUAGE
        if self.credentials is not None:
            sign(cmd, self.credentials)
        self._write(encode(cmd))

    def send_reply(self, reply: RemotingCommand) -> None:
        if not self.closed:
            reply.language = LANGUAGE
            self._write(encode(reply))

    def _write(self, frame: bytes) -> None:
        out = self._out
        out.append(frame)
        if len(out) == 1:
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        out = self._out
        if not out or self.closed:
            out.clear()
            return
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        self.transport.write(data)

    # ------------------------------------------------------------ deadlines
    def _arm(self, deadline: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = deadline
        self._timer = self._loop.call_at(deadline, self._sweep)

    def _sweep(self) -> None:
        self._timer = None
        expired, nxt = self._matcher.expire(self._loop.time())
        for fut, _, code, timeout in expired:
            if not fut.done():
                fut.set_exception(RemotingError(f"no reply from {self.addr} to request {code} "
                                                f"within {timeout} s"))
        if nxt is not None:
            self._arm(nxt)

    # ------------------------------------------------------------ protocol
    def connection_made(self, transport) -> None:
        self.transport = transport

    # asyncio reads into our buffer (BufferedProtocol): with plain
    # data_received it reads with recv(256 KiB), an allocation above glibc's
    # mmap threshold per read (mmap, page faults, munmap) that cost more
    # than decoding the replies it carried.
    def get_buffer(self, sizehint: int) -> memoryview:
        return self._recv_view

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self._recv_view[:nbytes])

    def data_received(self, data) -> None:
        decoder, receive = self._decoder, self._matcher.receive
        try:
            decoder.receive_data(data)
            while (cmd := decoder.next_command()) is not None:
                entry = receive(cmd)              # None: a request (served) or a stray reply
                if entry is not None and not entry[0].done():
                    entry[0].set_result(cmd)
        except RemoteProtocolError as e:
            log.warning("connection to %s: %s", self.addr, e)
            self._closed(f"closed: the peer broke the protocol ({e})")

    def eof_received(self) -> bool:
        return False                              # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None and not self.closed:
            log.warning("connection to %s: %s", self.addr, exc)
        self._closed(f"closed ({exc})" if exc else "closed by the peer")

    def _request_received(self, cmd: RemotingCommand) -> None:
        if self.on_request is not None:
            task = self._loop.create_task(self._serve(cmd))
            self._serving.add(task)
            task.add_done_callback(self._serving.discard)

    async def _serve(self, cmd: RemotingCommand) -> None:
        try:
            reply = await self.on_request(self, cmd)
        except EXPECTED as e:           # e.g. the broker went away meanwhile
            log.warning("handling request %d from %s: %s", cmd.code, self.addr, e)
            return
        except Exception as e:          # a bug: loud, and the broker gets SYSTEM_ERROR
            log.error("handling request %d from %s failed on a bug", cmd.code, self.addr, exc_info=True)
            reply = cmd.reply(R.SYSTEM_ERROR, f"{type(e).__name__}: {e}")   # as NettyRemotingAbstract
        if reply is not None and not cmd.is_oneway:
            self.send_reply(reply)

    def _closed(self, why: str = "closed") -> None:
        if self.closed:
            return
        pending = self._matcher.lose(why)
        self._out.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for fut, *_ in pending:
            if not fut.done():
                fut.set_exception(RemotingError(f"connection to {self.addr} {why}"))
        if self.transport is not None:
            try:
                self.transport.close()
            except RuntimeError:
                pass    # the loop is gone

    async def close(self) -> None:
        self._closed("closed by this client")

    def inherited(self) -> None:
        """In a forked child: close this process's copy of the socket and
        nothing else — no transport.close (its loop's selector is shared
        with the parent through the fork), no pending future failed (they
        are the parent's requests). Closed from now on for this process."""
        self._matcher.lose("inherited from the parent process")
        self._out.clear()
        sock = getattr(self.transport, "_sock", None)   # asyncio's socket transports
        if sock is not None:
            sock.close()
