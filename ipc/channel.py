"""A blocking RocketMQ remoting connection: what the broker uses to call a NameServer
and what the Python client builds on.

``RemotingClient`` connects over TCP (``"host:port"``) or a Unix socket
(``"unix:/path/broker.sock"``), assigns each request an ``opaque`` and matches
replies to requests by it, so requests can be pipelined: ``send`` several,
then ``recv`` their replies in whatever order the broker answers. ``invoke``
is send + wait for that request's reply. Requests the broker sends to us
(NOTIFY_CONSUMER_IDS_CHANGED, CHECK_TRANSACTION_STATE) are queued on
``requests`` for the caller to look at. Given ``credentials``, it signs
every request it sends as a RocketMQ ACL client does (ipc/signing.py).

The matching is ``ipc/matcher.py``'s, the same as the asyncio client's
(client/connection.py): this module only reads, writes and waits. A reply
is kept in ``replies`` (arrival order) until ``recv`` takes it; a reply to
no request of ours is dropped. Once the peer closes (or the socket fails)
the connection is lost for good: every later ``send`` or ``recv`` that
needs the socket raises ConnectionError, replies already kept excepted.
The broker's services and ``shmq admin`` use it; so do the tests and perf/.
"""
from __future__ import annotations

import select
import socket
import time
from collections import deque

from .matcher import OpaqueMatcher, next_opaque
from .remoting import FLAG_ONEWAY, FrameDecoder, RemotingCommand, encode
from .signing import Credentials, sign

_RECV_BYTES = 1 << 20     # one buffer per client, received into (never allocated per read)


class RemotingTimeout(TimeoutError):
    pass


def connect(addr: str, timeout: float = 5.0) -> socket.socket:
    if addr.startswith("unix:"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        s.connect(addr[5:])
    else:
        host, _, port = addr.rpartition(":")
        s = socket.create_connection((host, int(port)), timeout=timeout)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.settimeout(None)
    return s


class RemotingClient:
    def __init__(self, addr: str, timeout: float = 5.0, credentials: Credentials | None = None):
        self.addr = addr
        self.credentials = credentials
        self.sock = connect(addr, timeout)
        # Waiting is a poll() and reading a recv_into with MSG_DONTWAIT on the
        # socket as it is (blocking, for sendall): a socket timeout per read
        # cost four fcntl calls, and recv(1 MiB) an mmap and munmap.
        self._poll = select.poll()
        self._poll.register(self.sock, select.POLLIN)
        self._buf = bytearray(_RECV_BYTES)
        self._view = memoryview(self._buf)
        self.decoder = FrameDecoder()
        self.replies: dict[int, RemotingCommand] = {}
        self.requests: deque[RemotingCommand] = deque()
        self.matcher = OpaqueMatcher(self.requests.append)

    def send(self, cmd: RemotingCommand) -> int:
        """Send a request without waiting; returns its opaque."""
        frame = self._prepare(cmd)
        self._write(frame, (cmd,))
        return cmd.opaque

    def send_many(self, cmds: list[RemotingCommand]) -> list[int]:
        """Pipeline several requests in one write."""
        frames = [self._prepare(cmd) for cmd in cmds]
        self._write(b"".join(frames), cmds)
        return [c.opaque for c in cmds]

    def _prepare(self, cmd: RemotingCommand) -> bytes:
        """Give ``cmd`` an opaque, sign it and (unless one-way) register it."""
        m = self.matcher
        if m.closed:
            raise ConnectionError(f"{self.addr}: {m.why_closed}")
        cmd.opaque = next_opaque()
        if self.credentials is not None:
            sign(cmd, self.credentials)
        if not cmd.flag & FLAG_ONEWAY:
            m.register(cmd.opaque)
        return encode(cmd)

    def _write(self, data: bytes, cmds) -> None:
        try:
            self.sock.sendall(data)
        except OSError as e:          # never sent: nothing to wait for, and the connection is gone
            for cmd in cmds:
                self.matcher.forget(cmd.opaque)
            self.matcher.lose(f"write failed ({e})")
            raise

    def recv(self, opaque: int | None = None, timeout: float = 5.0) -> RemotingCommand:
        """The reply to ``opaque`` (None: the next reply to anything)."""
        deadline = time.monotonic() + timeout
        while True:
            if opaque is None and self.replies:
                return self.replies.pop(next(iter(self.replies)))
            if opaque is not None and opaque in self.replies:
                return self.replies.pop(opaque)
            self._receive(deadline, f"no reply from {self.addr} within {timeout} s")

    def next_request(self, timeout: float = 5.0) -> RemotingCommand:
        """The next request the broker sent us (CHECK_TRANSACTION_STATE, …)."""
        deadline = time.monotonic() + timeout
        while not self.requests:
            self._receive(deadline, f"no request from {self.addr} within {timeout} s")
        return self.requests.popleft()

    def _receive(self, deadline: float, timeout_message: str) -> None:
        m = self.matcher
        if m.closed:
            raise ConnectionError(f"{self.addr}: {m.why_closed}")
        try:
            n = self.sock.recv_into(self._buf, _RECV_BYTES, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            left = deadline - time.monotonic()
            if left <= 0:
                raise RemotingTimeout(timeout_message) from None
            self._poll.poll(left * 1000)
            return
        except OSError as e:
            m.lose(f"read failed ({e})")
            raise
        if not n:
            m.lose("closed by the peer")
            raise ConnectionError(f"{self.addr} closed the connection")
        self.decoder.receive_data(self._view[:n])
        receive, replies = m.receive, self.replies
        while (cmd := self.decoder.next_command()) is not None:
            if receive(cmd) is not None:          # a request went to self.requests
                replies[cmd.opaque] = cmd

    def invoke(self, cmd: RemotingCommand, timeout: float = 5.0) -> RemotingCommand:
        return self.recv(self.send(cmd), timeout)

    def invoke_oneway(self, cmd: RemotingCommand) -> None:
        cmd.flag |= FLAG_ONEWAY
        self.send(cmd)

    def close(self) -> None:
        self.matcher.lose("closed by this client")
        self.sock.close()

    def __enter__(self) -> "RemotingClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
