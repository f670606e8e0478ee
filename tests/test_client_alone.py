"""``pip install shmq`` is the client alone: it imports and works with none of
the broker extra (numba, llvmlite, posix_ipc, pyyaml), and a broker command
run without them says which install it needs."""
from __future__ import annotations

import subprocess
import sys

from brokerproc import routed_topic, start_broker

# Run before the code under test: the broker extra's modules cannot be imported.
WITHOUT_BROKER_EXTRA = ("import sys\n"
                        "for m in ('numba', 'llvmlite', 'posix_ipc', 'yaml'):\n"
                        "    sys.modules[m] = None\n")


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WITHOUT_BROKER_EXTRA + code],
                          capture_output=True, text=True, timeout=120)


def test_the_client_sends_and_consumes_without_the_broker_extra(tmp_path):
    with start_broker(tmp_path) as b:
        topic = routed_topic(b, "Alone", 1)
        r = _run(f"""
from shmq.client import LitePullConsumer, Message, Producer
with Producer("pg-alone", namesrv_addr="{b.namesrv}") as p:
    assert p.send(Message("{topic}", b"no numba here")).status.name == "SEND_OK"
c = LitePullConsumer("cg-alone", namesrv_addr="{b.namesrv}",
                     consume_from_where="CONSUME_FROM_FIRST_OFFSET")
c.start()
c.assign(c.fetch_message_queues("{topic}"))
got = []
for _ in range(100):                      # at most 50 s
    got += c.poll(0.5)
    if got:
        break
c.shutdown()
assert [m.body for m in got] == [b"no numba here"], got
print("ok", sorted(m for m in sys.modules if m in ("numba", "llvmlite", "posix_ipc", "yaml")
                   and sys.modules[m] is not None))
""")
        assert r.returncode == 0, r.stderr[-3000:]
        assert r.stdout.strip() == "ok []"


def test_a_broker_command_without_the_extra_names_the_install_it_needs():
    r = _run("from shmq.tools.cli import main\nsys.exit(main(['broker']))")
    assert r.returncode == 2
    assert "needs the broker extra" in r.stderr and "pip install 'shmq[broker]'" in r.stderr
    assert "Traceback" not in r.stderr
