"""The fault campaign (perf/faults.py), bounded: a few trials of each fault.

Each trial fails the campaign when it loses more than the fault itself
destroyed or would hand out a queue offset twice; the broker campaigns fail
when the workers grow past serverPendingFrameBytesMax. Here with --quick's
client counts (16 partial frames, 25 stalled readers); more trials:
``SHMQ_STRESS_ROUNDS=N`` or ``python -m perf.faults --trials N`` (perf/FAULTS.md)."""
from __future__ import annotations

import os
import subprocess
import sys

from conftest import stress_rounds

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_fault_campaign_loses_nothing_beyond_what_each_fault_destroyed(tmp_path):
    r = subprocess.run([sys.executable, "-m", "perf.faults", "--quick", "--trials", str(stress_rounds(2)),
                        "--report", str(tmp_path / "faults.md")],
                       cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "TMPDIR": str(tmp_path)})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    table = (tmp_path / "faults.md").read_text()
    for fault in ("bitflip", "torn_tail", "truncated_segment"):
        row = next(line for line in table.splitlines() if line.startswith(f"| {fault} |"))
        assert "| **0** | 0 |" in row, row           # nothing lost beyond it, no offset reused
    for fault in ("partial_frames", "stalled_readers"):
        assert any(line.startswith(f"| {fault} |") for line in table.splitlines()), table
