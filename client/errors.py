"""What can go wrong between the client and a broker, and which of it is expected.

Two errors are the client's own vocabulary: ``RemotingError`` (a request got
no usable answer: a timeout, a connection that closed or never opened) and
``MQClientError`` (a broker or NameServer answered with a refusal: a
response code and its remark). Together with ``OSError`` (ConnectionError
is one) and ``TimeoutError`` they are ``EXPECTED``: what a healthy client
meets when a broker restarts, is paused or says no. Background loops
(``background.py``) warn about these and try again later; any other
exception is a bug, and a bug is never retried silently.

``BackgroundFailure`` is how a bug in a background loop reaches the user:
the owner (a consumer) records the first one and its ``shutdown()`` raises
it, with the bug as ``__cause__``, once everything is cleaned up — as an
``asyncio.TaskGroup`` raises its tasks' failures where it is left.
"""
from __future__ import annotations


class RemotingError(Exception):
    """A request that got no usable answer: timeout, closed connection."""


class MQClientError(Exception):
    """A request the broker or NameServer refused: ``code`` and its remark."""

    def __init__(self, code: int, remark: str | None, what: str = ""):
        super().__init__(f"{what}: code {code}, {remark}" if what else f"code {code}, {remark}")
        self.code, self.remark = code, remark


class BackgroundFailure(RuntimeError):
    """A background loop of the client stopped on a bug (its ``__cause__``)."""


EXPECTED = (RemotingError, MQClientError, OSError, TimeoutError)
"""Errors a background loop meets when a broker is gone, slow or refusing."""

__all__ = ["EXPECTED", "BackgroundFailure", "MQClientError", "RemotingError"]
