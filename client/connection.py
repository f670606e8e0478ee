"""One asyncio remoting connection to a broker or a NameServer.

Requests are matched to replies by ``opaque``, so any number may be in
flight on one connection and replies may come in any order. Requests the
server sends us (NOTIFY_CONSUMER_IDS_CHANGED, CHECK_TRANSACTION_STATE,
RESET_CONSUMER_CLIENT_OFFSET, …) go to ``on_request``, which may return a
reply. Addresses are ``host:port`` or ``unix:/path``. Fork-safe by
construction: a connection belongs to the event loop that opened it, and a
client checks its pid before using any (``ClientInstance``).
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import socket
from typing import Awaitable, Callable

from shmq.ipc.remoting import FLAG_ONEWAY, FrameDecoder, RemoteProtocolError, RemotingCommand, encode

log = logging.getLogger("shmq.client")
_READ_BYTES = 1 << 20
_opaques = itertools.count(1)

OnRequest = Callable[["Connection", RemotingCommand], Awaitable[RemotingCommand | None]]


class RemotingError(Exception):
    """A request that got no usable answer: timeout, closed connection."""


class Connection:
    def __init__(self, addr: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 on_request: OnRequest | None):
        self.addr = addr
        self.reader, self.writer = reader, writer
        self.on_request = on_request
        self.pending: dict[int, asyncio.Future] = {}
        self.closed = False
        self._task = asyncio.get_running_loop().create_task(self._read_loop())

    @classmethod
    async def open(cls, addr: str, on_request: OnRequest | None = None,
                   timeout: float = 3.0) -> "Connection":
        # asyncio.timeout, not wait_for: in 3.11 wait_for can swallow a
        # cancellation that races with its result, and the task runs on
        try:
            async with asyncio.timeout(timeout):
                if addr.startswith("unix:"):
                    r, w = await asyncio.open_unix_connection(addr[5:])
                else:
                    host, _, port = addr.rpartition(":")
                    r, w = await asyncio.open_connection(host, int(port))
                    w.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except (OSError, TimeoutError) as e:
            raise RemotingError(f"connect to {addr} failed: {e or 'timed out'}") from None
        return cls(addr, r, w, on_request)

    async def invoke(self, cmd: RemotingCommand, timeout: float = 3.0) -> RemotingCommand:
        if self.closed:
            raise RemotingError(f"connection to {self.addr} is closed")
        cmd.opaque = next(_opaques) & 0x7FFFFFFF
        fut = asyncio.get_running_loop().create_future()
        self.pending[cmd.opaque] = fut
        try:
            self.writer.write(encode(cmd))
            async with asyncio.timeout(timeout):
                return await fut
        except TimeoutError:
            raise RemotingError(f"no reply from {self.addr} to request {cmd.code} "
                                f"within {timeout} s") from None
        finally:
            self.pending.pop(cmd.opaque, None)

    def send_oneway(self, cmd: RemotingCommand) -> None:
        if self.closed:
            raise RemotingError(f"connection to {self.addr} is closed")
        cmd.flag |= FLAG_ONEWAY
        cmd.opaque = next(_opaques) & 0x7FFFFFFF
        self.writer.write(encode(cmd))

    def send_reply(self, reply: RemotingCommand) -> None:
        if not self.closed:
            self.writer.write(encode(reply))

    async def _read_loop(self) -> None:
        decoder = FrameDecoder()
        try:
            while True:
                data = await self.reader.read(_READ_BYTES)
                if not data:
                    break
                decoder.receive_data(data)
                while (cmd := decoder.next_command()) is not None:
                    if cmd.is_response:
                        fut = self.pending.get(cmd.opaque)
                        if fut is not None and not fut.done():
                            fut.set_result(cmd)
                    elif self.on_request is not None:
                        asyncio.get_running_loop().create_task(self._serve(cmd))
        except (OSError, RemoteProtocolError) as e:
            log.warning("connection to %s: %s", self.addr, e)
        except asyncio.CancelledError:
            pass
        finally:
            self._closed()

    async def _serve(self, cmd: RemotingCommand) -> None:
        try:
            reply = await self.on_request(self, cmd)
        except Exception:
            log.exception("handling request %d from %s", cmd.code, self.addr)
            return
        if reply is not None and not cmd.is_oneway:
            self.send_reply(reply)

    def _closed(self) -> None:
        if self.closed:
            return
        self.closed = True
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(RemotingError(f"connection to {self.addr} closed"))
        try:
            self.writer.close()
        except RuntimeError:
            pass    # the loop is gone

    async def close(self) -> None:
        self._task.cancel()
        self._closed()
