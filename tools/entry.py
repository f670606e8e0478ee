"""The ``shmq`` command's entry point (``[project.scripts]``, ``python -m
shmq.tools``): ``tools.cli`` imports numpy and numba, up to a second or more
on a cold machine, before any of shmq's code can take Ctrl-C. A Ctrl-C then
(or before a command installs its own handling: the broker's boss does at
once) ends the command with one line and exit code 130, as a shell reports
SIGINT, not a KeyboardInterrupt traceback from deep inside an import."""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    try:
        from shmq.tools.cli import main as cli_main
        return cli_main(argv)
    except KeyboardInterrupt:
        print("shmq: interrupted", file=sys.stderr)
        return 130
