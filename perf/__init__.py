"""shmq benchmarks: ``python -m perf [--quick] [name ...]`` or ``shmq bench``; see perf/__main__.py."""


class Skipped(Exception):
    """A bench cannot run here (a missing peer, a named broker without the
    settings it needs); the runner prints ``{"bench": ..., "skipped": str(e)}``."""
