"""The test brokers' harness (tests/brokerproc.py): what it starts dies with
the test process, even one killed -9."""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap

from brokerproc import until
from shmq.ipc.control import process_start_ticks

# A stand-in for a pytest that started a broker: it starts a process as
# BrokerProc starts the broker (``spawn``), says its pid and waits to be killed.
STARTER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, sys.argv[1])
    from brokerproc import spawn
    child = spawn(["sleep", "120"])
    print(child.pid, flush=True)
    time.sleep(120)
""")


def test_what_a_test_starts_dies_when_the_test_process_is_killed():
    starter = subprocess.Popen([sys.executable, "-c", STARTER, os.path.dirname(__file__)],
                               stdout=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([starter.stdout], [], [], 60)   # a hang fails, never waits
        assert ready, "the starter said no pid within 60 s"
        child = int(starter.stdout.readline())
        assert process_start_ticks(child) > 0            # running, in its own session
        assert os.getsid(child) == child
        starter.send_signal(signal.SIGKILL)
        starter.wait()
        until(lambda: process_start_ticks(child) < 0, f"pid {child} dies with its starter")
    finally:
        starter.kill()
        starter.wait()
        starter.stdout.close()
