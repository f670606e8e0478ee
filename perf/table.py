"""The runner's terminal table (``python -m perf --table``, which ``shmq bench`` runs).

As results arrive: the machine in words, then one row per result with its
limit, ratio and peer (``report.cells``), while the JSON lines go to a file
(``--out``, else ``perf/results/<run id>.jsonl``, which git ignores).
"""
from __future__ import annotations

import json
import os

from perf import report

_COLS = (("bench", 36), ("result", 18), ("limit", 16), ("ratio", 7), ("peer", 14))


def machine_summary(m: dict) -> str:
    scr = m.get("scratch") or {}
    tune = m.get("sysctl_to_tune")
    lines = [(f"machine: {m['cpu']}{' (virtual)' if m.get('virtual') else ''}, {m['cores']} cores "
              f"({m['cores_usable']} usable), kernel {m['kernel']}, scratch {scr.get('path')} on "
              f"{scr.get('filesystem')} ({scr.get('source')}); commit {m.get('commit')}; "
              f"broker: {m['broker']}")]
    if m.get("sysctl") is None:
        lines.append(f"sysctl: {m.get('sysctl_note')}")
    elif tune:
        lines.append(f"sysctl/check would tune: {', '.join(tune)}")
    lines.append(f"run {m['run']}{' (--quick)' if m['quick'] else ''}")
    return "\n".join(lines)


def table_header() -> str:
    return "  ".join(f"{name:<{w}}" for name, w in _COLS) + "  limit / peer is"


def table_row(line: dict) -> str:
    c = report.cells(line)
    if c["result"] in ("skipped", "failed"):
        said = "FAILED" if c["result"] == "failed" else c["result"]
        return f"{c['bench']:<{_COLS[0][1]}}  {said}: {c['peer_name']}"
    what = c["limit_name"] + (f" / {c['peer_name']}" if c["peer_name"] else "")
    return "  ".join(f"{c[name]:<{w}}" for name, w in _COLS) + "  " + what


def results_dir() -> str:
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


class Printer:
    """``emit`` for the runner: the table (or the JSON lines) on stdout, the JSON
    lines to ``out`` (else, with ``keep``, to ``<results_dir>/<run id>.jsonl``)."""

    def __init__(self, out: str | None, table: bool, keep: bool, results: str | None = None):
        self.out_path = out
        self.table = table
        self.keep = keep
        self.results = results or results_dir()
        self.file = None

    def __call__(self, line: dict) -> None:
        text = json.dumps(line)
        if "bench" not in line:                                   # the machine line opens the run
            if self.out_path is None and self.keep:
                os.makedirs(self.results, exist_ok=True)
                self.out_path = os.path.join(self.results, f"{line['machine']['run']}.jsonl")
            if self.out_path is not None:
                self.file = open(self.out_path, "a")  # noqa: SIM115 -- open for the run; close()
            if self.table:
                print(machine_summary(line["machine"]), flush=True)
                print(table_header(), flush=True)
        if self.file is not None:
            self.file.write(text + "\n")
            self.file.flush()
        if not self.table:
            print(text, flush=True)
        elif "bench" in line:
            print(table_row(line), flush=True)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
