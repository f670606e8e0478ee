"""Every example in examples/ runs, as a user would run it, against a broker."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from brokerproc import start_broker

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = start_broker(tmp_path_factory.mktemp("examples"), transactionTimeOut=300,
                     transactionCheckInterval=300)
    yield b
    assert b.stop() == 0, b.log()[-3000:]


def run(broker, name, *args, timeout=60, **env):
    e = dict(os.environ, NAMESRV_ADDR=broker.namesrv, **env)
    r = subprocess.run([sys.executable, str(EXAMPLES / name), *map(str, args)], env=e,
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{name}: {r.stderr[-2000:]}"
    return r.stdout


def test_quickstart_producer_then_consumer(broker):
    out = run(broker, "quickstart_producer.py", 10)
    assert out.count("SEND_OK") == 10
    out = run(broker, "quickstart_consumer.py", 10)
    lines = out.splitlines()
    got = sorted(line.split()[-1] for line in lines if "Hello shmq" in line)
    assert got == sorted(str(i) for i in range(10)), out               # one whole line each
    assert all(line.split()[:3] == ["TopicTest", "TagA", f"key-{line.split()[-1]}"]
               for line in lines if "Hello shmq" in line), out
    assert lines[-1] == "10 messages received, offsets committed", out
    # shutdown committed the offsets: a second run gets nothing old, then only what is new
    out = run(broker, "quickstart_consumer.py", 1, 3)
    assert out.splitlines() == ["0 messages received, offsets committed"], out
    sent = sorted(line.split()[1] for line in run(broker, "quickstart_producer.py", 2).splitlines())
    out = run(broker, "quickstart_consumer.py", 2, 30)
    assert sorted(line.split()[3] for line in out.splitlines() if "Hello shmq" in line) == sent, out


def test_ordered_producer_then_orderly_consumer(broker):
    out = run(broker, "ordered_producer.py")
    queue_of = {}
    for line in out.splitlines():
        order, step, _, _, q = line.split()
        assert queue_of.setdefault(order, q) == q            # one queue per order
    out = run(broker, "ordered_consumer.py", 15)
    steps = {}
    for line in out.splitlines():
        if ": " in line:
            order, step = line.split(" ", 2)[2].split(": ")
            steps.setdefault(order, []).append(step)
    # in order per order; a replay (at least once) repeats, never reorders
    firsts = {order: list(dict.fromkeys(s)) for order, s in steps.items()}
    assert len(steps) == 5 and all(f == ["created", "paid", "shipped"] for f in firsts.values()), steps


def test_broadcast_consumer(broker):
    run(broker, "quickstart_producer.py", 3)
    out = run(broker, "broadcast_consumer.py", 3)
    assert out.count("broadcast") >= 3


def test_batch_and_transaction_producers(broker):
    assert "100 messages" in run(broker, "batch_producer.py", 100)
    out = run(broker, "batch_consumer.py", 100)
    assert out.splitlines()[-1] == "100 messages, numbered 0..99", out
    assert sum(int(line.split()[2]) for line in out.splitlines()[:-1]) == 100, out
    out = run(broker, "transaction_producer.py", TX_WAIT_S="5")
    assert "order 1 SEND_OK COMMIT_MESSAGE" in out and "ROLLBACK_MESSAGE" in out
    assert "the broker asks about" in out
