"""The client's background loops against a real broker (client/background.py):
an expected error (a broker that stops answering, a refused or broken
connection) is a warning and a later try; a bug stops its task, is logged at
ERROR with its traceback once, and the consumer's shutdown() raises it.

Faults are real where they can be (the broker SIGSTOPped); a bug is a
method of a live consumer replaced by one that raises, since no bug is
known to hide in the loops.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import time

import pytest
from brokerproc import routed_topic, start_broker, topic_for
from shmq.client import (AsyncLitePullConsumer, AsyncProducer, AsyncPushConsumer, BackgroundFailure,
                         ConsumeConcurrentlyStatus, Message)
from shmq.client.instance import ClientInstance

OK = ConsumeConcurrentlyStatus.CONSUME_SUCCESS


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = start_broker(tmp_path_factory.mktemp("background"))
    yield b
    assert b.stop() == 0, b.log()[-3000:]


@pytest.fixture
def client_log(caplog):
    caplog.set_level(logging.WARNING, logger="shmq.client")
    return caplog


def records(caplog, level, needle):
    return [r for r in caplog.records if r.levelno == level and needle in r.getMessage()]


async def until(pred, timeout=15.0, what="condition"):
    """Poll ``pred`` (a hang guard, not a timing)."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def send(broker, topic, body):
    async with AsyncProducer("pg-bg", namesrv_addr=broker.namesrv) as p:
        await p.send(Message(topic, body))


def push_consumer(broker, group, topic, seen, **settings):
    c = AsyncPushConsumer(group, namesrv_addr=broker.namesrv, **settings)
    c.subscribe(topic)

    async def listener(msgs, context):
        seen.extend(m.body for m in msgs)
        return OK
    c.register_message_listener(listener)
    return c


def test_a_broker_that_stops_answering_is_a_warning_and_pulls_go_on(broker, request, client_log):
    """SIGSTOP the broker: pulls time out (RemotingError), each a warning and
    a retry after pull_time_delay_millis_when_exception; SIGCONT: the next
    message is consumed, and nothing was logged as a bug or recorded."""
    topic = routed_topic(broker, topic_for(request, "BG_"), 1)
    seen = []

    async def main():
        c = push_consumer(broker, "cg-bg-stop", topic, seen, pull_time_delay_millis_when_exception=200,
                          broker_suspend_max_time_millis=300, consumer_timeout_millis_when_suspend=1000,
                          request_timeout=1.0)
        await c.start()
        await send(broker, topic, b"before")
        await until(lambda: b"before" in seen, what="the first message")
        os.killpg(broker.proc.pid, signal.SIGSTOP)
        try:
            await until(lambda: len(records(client_log, logging.WARNING, f"(topic='{topic}'")) >= 2,
                        what="two pull warnings")
        finally:
            os.killpg(broker.proc.pid, signal.SIGCONT)
        await send(broker, topic, b"after")
        await until(lambda: b"after" in seen, what="the message sent after the broker came back")
        assert c.failure is None
        await c.shutdown()                                  # raises nothing
    asyncio.run(main())
    assert not [r for r in client_log.records if r.levelno >= logging.ERROR], client_log.text


def test_an_expected_error_in_a_periodic_service_is_retried(broker, request, client_log):
    """The offset persister meets a reset connection: a warning naming it,
    and the next period it runs again (and goes through)."""
    topic = routed_topic(broker, topic_for(request, "BG_"), 1)
    calls = []

    async def main():
        c = push_consumer(broker, "cg-bg-retry", topic, [], persist_consumer_offset_interval=0.1)
        await c.start()
        real = c.offset_store.persist_all

        async def flaky(mqs):
            calls.append(len(calls))
            if len(calls) == 1:
                raise ConnectionResetError("the broker reset the connection")
            await real(mqs)
        c.offset_store.persist_all = flaky
        await until(lambda: len(calls) >= 3, what="the persister running again")
        assert c.failure is None
        await c.shutdown()
    asyncio.run(main())
    [warning] = records(client_log, logging.WARNING, "persist_all of cg-bg-retry")
    assert "the broker reset the connection" in warning.getMessage()
    assert not [r for r in client_log.records if r.levelno >= logging.ERROR], client_log.text


def test_a_bug_in_a_periodic_service_stops_it_loudly_and_shutdown_raises_it(broker, request, client_log):
    """A bug in the offset persister: logged once at ERROR with its
    traceback, the loop ends (its task is done: it cannot run again), the
    consumer goes on consuming, and shutdown() cleans up, then raises it."""
    topic = routed_topic(broker, topic_for(request, "BG_"), 1)
    seen, calls = [], []

    async def main():
        c = push_consumer(broker, "cg-bg-bug", topic, seen, persist_consumer_offset_interval=0.1)
        await c.start()
        real = c.offset_store.persist_all

        async def buggy(mqs):          # once: shutdown()'s own persist goes through
            calls.append(1)
            if len(calls) == 1:
                return 1 / 0
            await real(mqs)
        c.offset_store.persist_all = buggy
        await until(lambda: c.failure is not None, what="the failure recorded")
        assert isinstance(c.failure, ZeroDivisionError) and len(calls) == 1
        [ended] = [t for t in c._services if t.done()]         # the persister, not the rebalancer
        assert ended.get_coro().__qualname__ == "every"
        await send(broker, topic, b"still consumed")
        await until(lambda: b"still consumed" in seen, what="consumption going on")
        with pytest.raises(BackgroundFailure, match="persist_all of cg-bg-bug") as e:
            await c.shutdown()
        assert isinstance(e.value.__cause__, ZeroDivisionError)
        assert not c.running and "cg-bg-bug" not in c.instance.consumers
    asyncio.run(main())
    [error] = records(client_log, logging.ERROR, "persist_all of cg-bg-bug stopped on a bug")
    assert error.exc_info[0] is ZeroDivisionError and "Traceback" in client_log.text
    assert len(calls) == 2             # the loop's one call, then shutdown()'s


def test_a_bug_in_a_pull_loop_stops_that_loop_loudly(broker, request, client_log):
    topic = routed_topic(broker, topic_for(request, "BG_"), 1)

    async def main():
        c = push_consumer(broker, "cg-bg-pull", topic, [])

        async def buggy(req):
            raise KeyError("nextBeginOffset")
        c._pull_once = buggy
        await c.start()
        await until(lambda: c.failure is not None, what="the failure recorded")
        assert all(t.done() for t in c._pull_tasks.values())
        with pytest.raises(BackgroundFailure, match="the pull loop of") as e:
            await c.shutdown()
        assert isinstance(e.value.__cause__, KeyError)
    asyncio.run(main())
    errors = records(client_log, logging.ERROR, "stopped on a bug")
    assert errors and all(r.exc_info[0] is KeyError for r in errors)
    assert len(errors) == len({r.getMessage() for r in errors})     # each queue's loop once


def test_a_bug_in_a_lite_pull_loop_is_raised_by_shutdown(broker, request, client_log):
    topic = routed_topic(broker, topic_for(request, "BG_"), 1)

    async def main():
        c = AsyncLitePullConsumer("cg-bg-lite", namesrv_addr=broker.namesrv)
        c.subscribe(topic)

        async def buggy(mq, st):
            raise AttributeError("a bug")
        c._pull_once = buggy
        await c.start()
        await until(lambda: c.failure is not None, what="the failure recorded")
        with pytest.raises(BackgroundFailure, match="the pull loop of") as e:
            await c.shutdown()
        assert isinstance(e.value.__cause__, AttributeError)
    asyncio.run(main())
    [error] = records(client_log, logging.ERROR, "stopped on a bug")
    assert error.exc_info[0] is AttributeError


def test_a_bug_in_the_instance_route_refresh_reaches_its_consumers(broker, request, client_log,
                                                                   monkeypatch):
    """The ClientInstance's loops follow the same rules: a bug in the route
    refresh stops it, is logged once, and each consumer on the instance
    raises it from shutdown()."""
    topic = routed_topic(broker, topic_for(request, "BG_"), 1)

    async def buggy(self):
        raise TypeError("a bug")
    monkeypatch.setattr(ClientInstance, "refresh_routes", buggy)

    async def main():
        c = push_consumer(broker, "cg-bg-routes", topic, [], poll_name_server_interval=0.1)
        await c.start()
        await until(lambda: c.failure is not None, what="the failure recorded")
        assert isinstance(c.instance.failure, TypeError)
        with pytest.raises(BackgroundFailure, match="the route refresh of") as e:
            await c.shutdown()
        assert isinstance(e.value.__cause__, TypeError)
    asyncio.run(main())
    [error] = records(client_log, logging.ERROR, "stopped on a bug")
    assert error.exc_info[0] is TypeError


def test_a_bug_in_serving_a_broker_request_is_answered_system_error(tmp_path, client_log):
    """A request a broker sends us (here from a real Unix-socket peer) whose
    handler has a bug gets SYSTEM_ERROR naming it, as RocketMQ's remoting
    answers, and an ERROR with the traceback; an expected error in the
    handler is a warning, and the connection serves on."""
    import socket
    import threading

    from shmq.client.connection import Connection, RemotingError
    from shmq.ipc.codes import ResponseCode
    from shmq.ipc.remoting import FrameDecoder, RemotingCommand, encode

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "b.sock"))
    listener.listen(1)
    peer = []
    accepted = threading.Thread(target=lambda: peer.append(listener.accept()[0]))
    accepted.start()

    async def handler(conn, cmd):
        if cmd.code == 1:
            raise RemotingError("the broker went away")
        if cmd.code == 2:
            return {}["a bug"]
        return cmd.reply(ResponseCode.SUCCESS, "served")

    def answers(sock, n):
        d, got = FrameDecoder(), []
        while len(got) < n:
            d.receive_data(sock.recv(65536))
            while (cmd := d.next_command()) is not None:
                got.append(cmd)
        return got

    async def main():
        conn = await Connection.open(f"unix:{tmp_path / 'b.sock'}", handler)
        accepted.join()
        peer[0].sendall(b"".join(encode(RemotingCommand(code=c, opaque=100 + c)) for c in (1, 2, 3)))
        got = await asyncio.to_thread(answers, peer[0], 2)
        await conn.close()
        return got
    try:
        got = asyncio.run(main())
    finally:
        listener.close()
        for s in peer:
            s.close()
    got.sort(key=lambda r: r.opaque)
    assert [(r.opaque, r.code) for r in got] == [(102, ResponseCode.SYSTEM_ERROR), (103, ResponseCode.SUCCESS)]
    assert "KeyError" in got[0].remark
    [error] = records(client_log, logging.ERROR, "handling request 2")
    assert error.exc_info[0] is KeyError
    assert records(client_log, logging.WARNING, "handling request 1")
