"""Message features on a real broker: delivery-time scheduling and SQL92 filtering.

- broker_timer / broker_timer_burst / broker_delay: N messages with a
  delivery time (the timer wheel: TIMER_DELIVER_MS spread over one second,
  or all due at one instant) or a delay level (DELAY=1, 1 s), sent one per request with WINDOW in flight over the Unix socket
  (TCP to a named broker on another host).
  Intake msg/s beside the same sends without a delivery time in the same
  run (the limit: what scheduling costs on the send path); then a consumer
  long-polls the real topic and every message's lateness — arrival minus
  the time it was due — gives p50/p99; the delivery rate is N over the
  time from the first due instant to the last arrival (for the burst: how
  fast the services process re-posts).
- broker_sql_filter: a backlog of 100-byte messages with a property a = i,
  pulled to the end by one client; msg/s matched under a SQL92 filter
  matching all (``a >= 0``) and one matching 10%, beside the same pulls
  with a tag filter (the limit: the ConsumeQueue-only filter).

Every bench checks the count and that nothing arrives twice.
"""
from __future__ import annotations

import time

import numpy as np
from shmq.client.remoting import RemotingClient

from perf.broker import (
    PULL_NOT_FOUND,
    PULL_RETRY_IMMEDIATELY,
    SUCCESS,
    TIMEOUT_S,
    Broker,
    NamedBroker,
    broker,
    check,
    create_topic,
    pull_cmd,
    records,
    send_cmd,
)

WINDOW = 64


def _send_all(c: RemotingClient, cmds) -> float:
    """Pipelined sends, WINDOW in flight; returns msg/s."""
    t0 = time.perf_counter()
    inflight = []
    for cmd in cmds:
        inflight.append(c.send(cmd))
        if len(inflight) >= WINDOW:
            check(c.recv(inflight.pop(0), TIMEOUT_S), what="send")
    for o in inflight:
        check(c.recv(o, TIMEOUT_S), what="send")
    return len(cmds) / (time.perf_counter() - t0)


def _props(extra: dict) -> str:
    return "\x02".join(f"{k}\x01{v}" for k, v in {"TAGS": "t", **extra}.items())


def _collect(c: RemotingClient, topic: str, n: int, due_of, deadline_s: float):
    """Long-poll the topic's queue 0 until n messages came; (lateness ms, arrival s) each."""
    off, late, arrived, seen = 0, [], [], set()
    deadline = time.monotonic() + deadline_s
    while len(late) < n and time.monotonic() < deadline:
        r = c.invoke(pull_cmd(topic, 0, off, 32, suspend_ms=1000), timeout=TIMEOUT_S)
        now = time.time() * 1000
        check(r, SUCCESS, PULL_NOT_FOUND, PULL_RETRY_IMMEDIATELY, what="pull")
        off = int(r.ext["nextBeginOffset"])
        if r.code == SUCCESS:
            for _, _, body, _ in records(r.body):
                i = int(body.split(b":")[0])
                if i in seen:
                    raise AssertionError(f"message {i} arrived twice")
                seen.add(i)
                late.append(now - due_of(i))
                arrived.append(now)
    if len(late) != n:
        raise AssertionError(f"{topic}: {len(late)} of {n} delivered within {deadline_s} s")
    return np.array(late), np.array(arrived)


def _broker(ctx) -> Broker | NamedBroker:
    """The run's broker for these benches (SQL92 on)."""
    return broker(ctx, "ASYNC_FLUSH", "features", enablePropertyFilter="true")


def _scheduled(ctx, result, kind: str):
    n = 2000 if ctx.quick else 20000
    b = _broker(ctx)
    topic, plain = f"Perf_{kind}", f"Perf_{kind}_plain"
    with RemotingClient(b.addr(b.transports[0])) as c:
        create_topic(c, topic, 1)
        create_topic(c, plain, 1)
        def body(i: int) -> bytes:
            return b"%d:" % i + b"x" * 90
        limit = _send_all(c, [send_cmd(plain, 0, body(i), _props({})) for i in range(n)])
        lead = 1500 + n // 10                                       # all sent before any is due
        t0 = int(time.time() * 1000) + lead
        if kind == "timer_burst":
            due = {i: t0 for i in range(n)}                           # all at one instant
            props = [_props({"TIMER_DELIVER_MS": str(t0)}) for i in range(n)]
        elif kind == "timer":
            due = {i: t0 + i * 1000 // n for i in range(n)}           # spread over one second
            props = [_props({"TIMER_DELIVER_MS": str(due[i])}) for i in range(n)]
        else:
            props = [_props({"DELAY": "1"}) for _ in range(n)]
        cmds = [send_cmd(topic, 0, body(i), props[i]) for i in range(n)]
        t_send = time.time() * 1000
        rate = _send_all(c, cmds)
        if kind == "delay":                                          # due 1 s after stored
            span = time.time() * 1000 - t_send
            due = {i: t_send + 1000 + span * i / n for i in range(n)}  # approximate store time
        late, arrived = _collect(c, topic, n, due.get, 30 + n / 500)
    first_due = min(due.values())
    deliver_rate = n / max(1e-3, (arrived.max() - first_due) / 1000)
    name = {"timer": "timer wheel (TIMER_DELIVER_MS spread over 1 s)",
            "timer_burst": "timer wheel (TIMER_DELIVER_MS, all due at one instant)",
            "delay": "delay level 1 (DELAY=1)"}[kind]
    yield result(f"broker_{kind}", rate, "msg/s", limit,
                 "the same sends without a delivery time, same run (WINDOW 64, Unix socket)",
                 what=f"{name}: intake rate; lateness = arrival at the consumer − due time",
                 lateness_p50_ms=round(float(np.percentile(late, 50)), 1),
                 lateness_p99_ms=round(float(np.percentile(late, 99)), 1),
                 lateness_max_ms=round(float(late.max()), 1),
                 early=int((late < -5).sum()), messages=n,
                 delivery_rate=round(deliver_rate))


def run_timer(ctx, result):
    yield from _scheduled(ctx, result, "timer")


def run_timer_burst(ctx, result):
    yield from _scheduled(ctx, result, "timer_burst")


def run_delay(ctx, result):
    yield from _scheduled(ctx, result, "delay")


def _drain(c: RemotingClient, topic: str, expr: str | None) -> tuple[int, float]:
    """Pull queue 0 to the end with a tag filter (expr None) or SQL92; (matched, seconds)."""
    off, got = 0, 0
    t0 = time.perf_counter()
    while True:
        cmd = pull_cmd(topic, 0, off, 32)
        if expr is None:
            cmd.ext["subscription"] = "t"
        else:
            cmd.ext["subscription"], cmd.ext["expressionType"] = expr, "SQL92"
        r = check(c.invoke(cmd, timeout=TIMEOUT_S), SUCCESS, PULL_NOT_FOUND,
                  PULL_RETRY_IMMEDIATELY, what="pull")
        if r.code == PULL_NOT_FOUND:
            return got, time.perf_counter() - t0
        if r.code == SUCCESS:
            got += len(records(r.body))
        off = int(r.ext["nextBeginOffset"])


def run_sql_filter(ctx, result):
    n = 20000 if ctx.quick else 200000
    b = _broker(ctx)
    topic = "Perf_sql"
    with RemotingClient(b.addr(b.transports[0])) as c:
        create_topic(c, topic, 1)
        _send_all(c, [send_cmd(topic, 0, b"%d:" % i + b"y" * 90, _props({"a": str(i)}))
                      for i in range(n)])
        tag_n, tag_s = _drain(c, topic, None)
        all_n, all_s = _drain(c, topic, "a >= 0")
        few_n, few_s = _drain(c, topic, f"a < {n // 10}")
    if (tag_n, all_n, few_n) != (n, n, n // 10):
        raise AssertionError(f"matched {tag_n}, {all_n}, {few_n} of {n}")
    limit = tag_n / tag_s
    yield result("broker_sql_filter_all", all_n / all_s, "msg/s", limit,
                 "the same pulls with a tag filter (ConsumeQueue only), same run",
                 expression="a >= 0", messages=n)
    yield result("broker_sql_filter_10pct", few_n / few_s, "msg/s matched", limit,
                 "the same pulls with a tag filter (ConsumeQueue only), same run",
                 expression=f"a < {n // 10}", scanned_per_s=round(n / few_s), messages=n)
