"""``shmq bench`` and ``shmq profile``: perf's runner, started from the checkout.

    shmq bench [--quick] [--out FILE] [--results FILE] [--broker HOST:PORT] [--json] [name ...]
    shmq profile [--duration S] [--out DIR] [--rate HZ] [--quick] [--pid BOSS] [bench]

``shmq bench`` is ``python -m perf --table`` (``--json``: without
``--table``, the JSON lines on stdout) and ``shmq profile`` is ``python -m
perf.profile``, run in a child Python with the checkout on its path: their
flags, help and output are perf's (``shmq bench --help``). The tools never
import perf, nor perf the tools: the benchmarks measure shmq's packages
from outside, and the command line only finds them.

perf/ is not in the installed package: pyproject.toml maps only shmq's
packages into ``shmq``; perf/ (and sysctl/, which the machine record reads)
stay in the checkout. ``perf_checkout()`` looks for them beside this
package's source (an editable install or the tree itself), then in the
current directory, and names both places when neither has them.
"""
from __future__ import annotations

import os
import subprocess
import sys


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


def launch(command: str, module: str, argv: list[str]) -> int:
    """``python -m <module> --prog="shmq <command>" <argv>`` with the checkout
    first on the child's path; its exit status."""
    try:
        root = perf_checkout()
    except NoCheckout as e:
        print(f"shmq {command}: {e}", file=sys.stderr)
        return 2
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    try:
        return subprocess.call([sys.executable, "-m", module, f"--prog=shmq {command}", *argv], env=env)
    except KeyboardInterrupt:          # the child got the same ^C and has reported
        return 130


def _bench(args) -> int:
    argv = list(args.argv)
    table = "--json" not in argv
    return launch("bench", "perf", (["--table"] if table else []) + [a for a in argv if a != "--json"])


def _profile(args) -> int:
    return launch("profile", "perf.profile", list(args.argv))


def add_parser(subparsers) -> None:
    # Every argument goes to perf as it is (prefix_chars that no flag uses:
    # argparse here parses none of them); perf's parser checks them and
    # answers --help, which knows nothing of --json: `shmq --help` names it.
    for name, what, func in (("bench", "run the benchmarks (perf/) and print a table "
                              "(--json: the JSON lines on stdout instead)", _bench),
                             ("profile", "py-spy flame graphs of a broker's processes under a benchmark",
                              _profile)):
        p = subparsers.add_parser(name, help=what, add_help=False, prefix_chars="\x00",
                                  description=f"{what} (python -m {'perf' if name == 'bench' else 'perf.profile'})")
        p.add_argument("argv", nargs="*")
        p.set_defaults(func=func)
