"""The client's background loops, and how their errors end.

Beside the application, a consumer runs a rebalance service, a pull loop per
queue it holds, an offset persister and (orderly) a lock renewer; its
``ClientInstance`` refreshes routes and sends heartbeats. Each is an asyncio
task, and each treats errors by the same two rules, kept here:

- an ``EXPECTED`` error (errors.py: a broker gone, slow or refusing) is a
  warning, and the loop tries again after its back-off: a periodic service
  waits its period, a pull loop ``pull_time_delay_millis_when_exception``
  (RocketMQ's delays; a broker that is down is asked again at that pace);
- any other exception is a bug, and no loop catches it. The task ends with
  it; ``watch`` (the task's done-callback) logs it once at ERROR with its
  traceback and gives it to the owner's ``on_bug``, which records it (a
  consumer raises it from ``shutdown()``). A bug is never retried in a loop,
  so it cannot fill a log at the loop's pace or hide behind one.

A cancelled task (shutdown, a queue let go) ends without either.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable, Iterable

from .errors import EXPECTED

log = logging.getLogger("shmq.client")

OnBug = Callable[[str, BaseException], None]


async def every(period: float, fn: Callable[[], Awaitable], what: str,
                first: float | None = None) -> None:
    """Call ``fn`` every ``period`` s (the first time after ``first``, if
    given); an expected error waits for the next period, a bug ends the loop."""
    await asyncio.sleep(period if first is None else first)
    while True:
        try:
            await fn()
        except EXPECTED as e:
            log.warning("%s: %s; again in %g s", what, e, period)
        await asyncio.sleep(period)


def watch(task: asyncio.Task, what: str, on_bug: OnBug) -> asyncio.Task:
    """When ``task`` ends on an exception: an expected one is a warning (the
    task was one-shot, or its loop gave up), anything else is logged at
    ERROR with its traceback and handed to ``on_bug(what, exc)``."""
    def done(t: asyncio.Task) -> None:
        if t.cancelled():
            return
        exc = t.exception()
        if exc is not None:
            report(what, exc, on_bug)
    task.add_done_callback(done)
    return task


def report(what: str, exc: BaseException, on_bug: OnBug) -> None:
    """How ``what`` ended on ``exc``: an expected error is a warning, anything
    else an ERROR with its traceback, handed to ``on_bug``."""
    if isinstance(exc, EXPECTED):
        log.warning("%s: %s", what, exc)
        return
    log.error("%s stopped on a bug", what, exc_info=exc)
    on_bug(what, exc)


def spawn(coro: Awaitable, what: str, on_bug: OnBug) -> asyncio.Task:
    """A task of ``coro`` on the running loop, watched."""
    return watch(asyncio.get_running_loop().create_task(coro), what, on_bug)


async def cancel(tasks: Iterable[asyncio.Task]) -> None:
    """Cancel ``tasks`` and wait until they have ended (their exceptions
    were seen by ``watch``; they are not raised again here)."""
    tasks = list(tasks)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


__all__ = ["cancel", "every", "report", "spawn", "watch"]
