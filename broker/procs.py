"""The broker's process tree, read from /proc: which process plays which role.

Every broker process names itself ``shmq-<role>`` (``ipc.control.
set_process_name``): shmq-worker-0, shmq-flusher, shmq-services,
shmq-namesrv, shmq-forkserver. ``shmq profile``, perf's benches and the
tests find them here.
"""
from __future__ import annotations

import os


def proc_stat(pid: int) -> tuple[str, int] | None:
    """(comm, ppid) of a process, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        return stat[stat.index("(") + 1:stat.rindex(")")], int(stat.rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def children(ppid: int) -> dict[str, int]:
    """Process name (shmq-worker-0, shmq-flusher, shmq-services, shmq-namesrv) -> pid
    of the broker boss's processes: its children and theirs (most fork from
    its fork server), as ``shmq profile``, perf and the tests find them."""
    stats = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = proc_stat(int(name))
            if st is not None:
                stats[int(name)] = st
    return {comm: pid for pid, (comm, parent) in stats.items()
            if parent == ppid or (parent in stats and stats[parent][1] == ppid)}


def broker_processes(boss: int) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """(role, pid) of the boss and of its children that name themselves shmq-<role>
    (worker-0, flusher, services, namesrv); and the other children (multiprocessing's
    resource tracker), which are not the broker's."""
    found, others = [("boss", boss)], []
    for name, pid in sorted(children(boss).items()):
        if name.startswith("shmq-"):
            found.append((name.removeprefix("shmq-"), pid))
        else:
            others.append((name, pid))
    return found, others
