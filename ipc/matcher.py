"""Request/reply matching by opaque, sans I/O: what both remoting transports share.

A RocketMQ connection multiplexes: each request carries an ``opaque`` and
its reply carries the same one back, in whatever order the peer answers,
so any number of requests may be in flight on one connection. The peer
also sends requests of its own on it (a broker: NOTIFY_CONSUMER_IDS_CHANGED,
CHECK_TRANSACTION_STATE, …). ``OpaqueMatcher`` keeps the table of requests
waiting for their reply and sorts what arrives; the two transports around
it do the I/O and the waiting:

    transport                 waiter                  deadline
    ipc/channel.py (blocking) None: replies are kept  none (each recv has its own)
    client/connection.py      an asyncio Future       the loop's clock; one timer
                                                      sweeps with ``expire``

The calls:

- ``next_opaque()``: a fresh opaque, unique in this process (positive int32).
- ``register(opaque, waiter, deadline, code, timeout)``: a request is in
  flight. Its entry is the tuple ``(waiter, deadline, code, timeout)``;
  ``code`` and ``timeout`` are kept only to name the request in an error.
- ``receive(cmd)``: a decoded command. A reply to a pending request pops
  and returns its entry for the transport to settle; a request from the
  peer goes to ``on_request``; a reply nobody waits for (it came after its
  request timed out) is dropped and counted in ``strays``.
- ``expire(now)``: pops the entries whose deadline passed, and says when
  the next one falls due.
- ``forget(opaque)``: a request that never left (its write failed).
- ``lose(why)``: the connection is gone. Pops every entry, for the
  transport to fail with its own error, and refuses every later
  ``register``; ``closed`` and ``why_closed`` say so.

It never touches a socket, a clock or an event loop: deadlines are numbers
on the transport's clock, so a test drives it with plain numbers.

Invariant: an opaque is pending at most once; after ``lose`` nothing is
pending and nothing can be registered.
"""
from __future__ import annotations

import itertools
import math
from typing import Any, Callable

from .remoting import FLAG_RESPONSE, RemotingCommand

_opaques = itertools.count(1)

Entry = tuple[Any, float, int, float]            # (waiter, deadline, request code, timeout s)
OnRequest = Callable[[RemotingCommand], None]


def next_opaque() -> int:
    """A request id unique in this process (int32, positive)."""
    return next(_opaques) & 0x7FFFFFFF


class OpaqueMatcher:
    """The requests of one connection that wait for a reply, by opaque."""

    __slots__ = ("pending", "on_request", "closed", "why_closed", "strays")

    def __init__(self, on_request: OnRequest | None = None):
        self.pending: dict[int, Entry] = {}
        self.on_request = on_request             # None: requests from the peer are dropped
        self.closed = False
        self.why_closed = ""
        self.strays = 0                          # replies that matched nothing

    def register(self, opaque: int, waiter: Any = None, deadline: float = math.inf,
                 code: int = 0, timeout: float = 0.0) -> None:
        """``opaque`` is in flight; the transport checks ``closed`` first (it
        raises its own error), so a register after ``lose`` is a bug."""
        assert not self.closed, f"register on a lost connection ({self.why_closed})"
        assert opaque not in self.pending, f"opaque {opaque} is already pending"
        self.pending[opaque] = (waiter, deadline, code, timeout)

    def receive(self, cmd: RemotingCommand) -> Entry | None:
        """The pending entry ``cmd`` answers (popped: settle its waiter), or
        None: a request (given to ``on_request``) or a stray reply."""
        if cmd.flag & FLAG_RESPONSE:
            entry = self.pending.pop(cmd.opaque, None)
            if entry is None:
                self.strays += 1
            return entry
        if self.on_request is not None:
            self.on_request(cmd)
        return None

    def forget(self, opaque: int) -> Entry | None:
        return self.pending.pop(opaque, None)

    def expire(self, now: float) -> tuple[list[Entry], float | None]:
        """Pop the entries due by ``now``; (them, the next deadline or None)."""
        expired, nxt = [], None
        for opaque, entry in self.pending.items():
            deadline = entry[1]
            if deadline <= now:
                expired.append(opaque)
            elif nxt is None or deadline < nxt:
                nxt = deadline
        return [self.pending.pop(o) for o in expired], nxt

    def lose(self, why: str) -> list[Entry]:
        """The connection is gone: every pending entry, to fail; the first
        ``why`` is kept. Idempotent (a second call returns nothing)."""
        if not self.closed:
            self.closed, self.why_closed = True, why
        entries, self.pending = list(self.pending.values()), {}
        return entries


__all__ = ["Entry", "OpaqueMatcher", "next_opaque"]
