"""``shmq bench``: the perf/ suite (or some of it) with a table on the terminal.

    shmq bench [--quick] [--out FILE] [--results FILE] [--broker HOST:PORT] [--json] [name ...]

The run is perf's runner (``python -m perf``): the same benches, sizes,
limits and JSON lines, the machine record first (perf.machine). This module
only finds perf/, prints the table as results arrive and writes the JSON
lines: to ``--out`` (appended), else to ``perf/results/<run id>.jsonl`` in
the checkout (git ignores it). ``--broker`` measures a running broker
instead of starting one; ``--results`` writes the Markdown table
(perf/RESULTS.md).

perf/ is not in the installed package: pyproject.toml maps only core, ipc,
broker, client and tools into ``shmq``; perf/ (and sysctl/, which the
machine record reads) stay in the checkout. ``perf_checkout()`` looks for
them beside this package's source (an editable install or the tree itself),
then in the current directory, and names both places when neither has them.
"""
from __future__ import annotations

import importlib
import json
import os
import sys
import time


class NoCheckout(Exception):
    pass


def _has_perf(root: str) -> bool:
    return all(os.path.isfile(os.path.join(root, "perf", f)) for f in ("__main__.py", "broker.py"))


def perf_checkout() -> str:
    """The checkout holding perf/: beside shmq's source, else the current directory."""
    beside = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for root in (beside, os.getcwd()):
        if _has_perf(root):
            return root
    raise NoCheckout(f"no perf/ folder beside shmq's source ({beside}) or in the current directory "
                     f"({os.getcwd()}): the benchmarks live in a checkout of the shmq repository, "
                     "not in the installed package; run from a checkout (pip install -e .)")


def load_runner():
    """perf's runner module (perf/__main__.py) from the checkout."""
    root = perf_checkout()
    if root not in sys.path:
        sys.path.insert(0, root)
    runner = importlib.import_module("perf.__main__")
    got = os.path.dirname(os.path.dirname(os.path.abspath(runner.__file__)))
    if got != root:
        raise NoCheckout(f"`import perf` found {runner.__file__}, not {root}/perf (another package "
                         "named perf is installed?)")
    return runner


# ------------------------------------------------------------------ the table
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


def table_row(report, line: dict) -> str:
    c = report.cells(line)
    if c["result"] == "skipped":
        return f"{c['bench']:<{_COLS[0][1]}}  skipped: {c['peer_name']}"
    what = c["limit_name"] + (f" / {c['peer_name']}" if c["peer_name"] else "")
    return "  ".join(f"{c[name]:<{w}}" for name, w in _COLS) + "  " + what


class Printer:
    """``emit`` for the runner: the table (or JSON lines) on stdout, JSON lines to a file."""

    def __init__(self, runner, out: str | None, json_stdout: bool, results_dir: str):
        self.report = runner.report
        self.out_path = out
        self.json_stdout = json_stdout
        self.results_dir = results_dir
        self.file = None

    def __call__(self, line: dict) -> None:
        text = json.dumps(line)
        if "bench" not in line:                                   # the machine line opens the run
            if self.out_path is None:
                os.makedirs(self.results_dir, exist_ok=True)
                self.out_path = os.path.join(self.results_dir, f"{line['machine']['run']}.jsonl")
            self.file = open(self.out_path, "a")      # noqa: SIM115 -- open for the run; close()
            if not self.json_stdout:
                print(machine_summary(line["machine"]), flush=True)
                print(table_header(), flush=True)
        self.file.write(text + "\n")
        self.file.flush()
        if self.json_stdout:
            print(text, flush=True)
        elif "bench" in line:
            print(table_row(self.report, line), flush=True)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def check_broker(runner, addr: str | None) -> str | None:
    """Why the named broker cannot be used (unreachable), or None."""
    if addr is None:
        return None
    try:
        runner.broker.NamedBroker(addr)
    except RuntimeError as e:
        return str(e)
    return None


def command_of(args) -> str:
    """The command line that reproduces this run (for the Markdown's first line)."""
    parts = ["shmq bench"] + (["--quick"] if args.quick else [])
    parts += [f"--broker {args.broker}"] if args.broker else []
    parts += [f"--results {args.results}"] if args.results else []
    return " ".join(parts + args.names)


def _bench(args) -> int:
    try:
        runner = load_runner()
        chosen = runner.select(args.names)
    except (NoCheckout, ValueError) as e:
        print(f"shmq bench: {e}", file=sys.stderr)
        return 2
    why = check_broker(runner, args.broker)
    if why:
        print(f"shmq bench: {why}", file=sys.stderr)
        return 1
    printer = Printer(runner, args.out, args.json, os.path.join(perf_checkout(), "perf", "results"))
    t0 = time.perf_counter()
    try:
        lines = runner.run(chosen, args.quick, printer, args.broker, args.install_peers)
    finally:
        printer.close()
    if args.results:
        runner.report.write(args.results, lines, command_of(args))
    done = sum(1 for line in lines if "value" in line)
    skipped = sum(1 for line in lines if "skipped" in line)
    print(f"# {len(chosen)} benchmarks, {done} results, {skipped} skipped in "
          f"{time.perf_counter() - t0:.1f} s; JSON lines in {printer.out_path}"
          + (f"; table in {args.results}" if args.results else ""), file=sys.stderr)
    return 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("bench", help="run the benchmarks (perf/) and print a table",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("names", nargs="*", help="benchmarks to run, by prefix (default: all; "
                                            "`broker` runs every broker bench)")
    p.add_argument("--quick", action="store_true", help="small sizes, for CI (about two minutes)")
    p.add_argument("--out", metavar="FILE", help="append the JSON lines here "
                                                 "(default perf/results/<run id>.jsonl)")
    p.add_argument("--results", metavar="FILE",
                   help="write the run as a Markdown table with limits and peers (perf/RESULTS.md)")
    p.add_argument("--broker", metavar="HOST:PORT", default=os.environ.get("SHMQ_PERF_BROKER"),
                   help="measure this running broker instead of starting one; benches that need "
                        "their own store or settings it lacks are skipped ($SHMQ_PERF_BROKER)")
    p.add_argument("--json", action="store_true", help="print the JSON lines instead of the table")
    p.add_argument("--install-peers", action="store_true",
                   help="as root, apt-get install a missing peer (redis-server); also when $CI is set")
    p.set_defaults(func=_bench)
