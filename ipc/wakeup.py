"""Wake-ups between processes: one selectable socket per process slot.

Each process that can wait (a worker with parked pulls or parked sync sends,
the flusher) binds a non-blocking Unix datagram socket at the abstract address
``\\0<namespace>.<slot>``; a reactor registers ``fileno()`` with its selector like
any other fd (an eventfd would need fd passing to reach unrelated processes).
Anyone wakes it by sending one byte to that name: no connection, no
filesystem entry, nothing to clean up when a process dies.

Wake-ups coalesce: the receiver drains everything at once, and a sender that
finds the receiver's queue full drops its byte (a wake-up is already pending).
A wake-up carries no data: after waking, the receiver re-reads the shared
counters it cares about. Every wait has a timeout, so a lost wake-up costs
latency, never a hang.
"""
from __future__ import annotations

import select
import socket

_DRAIN_BYTES = 4096


def address(namespace: str, slot: int) -> bytes:
    return f"\0{namespace}.{slot}".encode()


class Waiter:
    """The receiving end, owned by the process in ``slot``."""

    def __init__(self, namespace: str, slot: int):
        self.sock = socket.socket(socket.AF_UNIX,
                                  socket.SOCK_DGRAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
        self.sock.bind(address(namespace, slot))
        self._poll = select.poll()
        self._poll.register(self.sock.fileno(), select.POLLIN)

    def fileno(self) -> int:
        return self.sock.fileno()

    def drain(self) -> int:
        """Consume every pending wake-up; returns how many there were."""
        n = 0
        while True:
            try:
                self.sock.recv(_DRAIN_BYTES)
                n += 1
            except BlockingIOError:
                return n

    def wait(self, timeout_s: float) -> bool:
        """Sleep until woken or ``timeout_s`` passes; True if woken."""
        ready = self._poll.poll(max(0, int(timeout_s * 1000 + 0.999)))
        return self.drain() > 0 if ready else False

    def close(self) -> None:
        self.sock.close()


class Waker:
    """The sending end: one unbound socket per process, any number of targets."""

    def __init__(self, namespace: str):
        self.namespace = namespace
        self.sock = socket.socket(socket.AF_UNIX,
                                  socket.SOCK_DGRAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
        self._addr: dict[int, bytes] = {}

    def wake(self, slot: int) -> None:
        addr = self._addr.get(slot)
        if addr is None:
            addr = self._addr[slot] = address(self.namespace, slot)
        try:
            self.sock.sendto(b"\1", addr)
        except (BlockingIOError, ConnectionRefusedError, FileNotFoundError):
            pass  # already pending, or nobody there (process gone): nothing to do

    def close(self) -> None:
        self.sock.close()
