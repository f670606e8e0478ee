"""What the boss's fork server holds before it forks a child.

The broker's children (NameServer, flusher, workers, services) are forked
from one server process that the boss starts first (multiprocessing's
``forkserver``). That server is a fresh interpreter, not a copy of the boss:
it has imported the children's modules and loaded the kernels (this module)
and holds nothing else - no store, no sockets, no shared memory - so a child
still receives only the fds it is given, as a spawned one would. What it
saves: each spawned child paid ~0.6 s of CPU for imports and numba's start
before doing anything, 2.5 s of a 2-core machine's warm start; a forked one
starts in milliseconds, and a worker restarted after a crash serves at once.

The server dies with the boss (PR_SET_PDEATHSIG, set before anything else
here), and each child with the server: multiprocessing's own way, the
server leaving its loop when the boss's end of a pipe closes, took it
~1.1 s of interpreter teardown, while the flusher, services and HA went on
without an owner (a restarted boss may be recovering the store by then).
"""
import os

from shmq.ipc.control import FORK_SERVER_OWNER, die_with_parent, set_process_name

# the boss that started this server (its pid in the environment: a boss gone
# before this line leaves getppid() naming init, which would never tell)
die_with_parent(int(os.environ.pop(FORK_SERVER_OWNER, None) or os.getppid()))   # not the children's

from shmq.core import jit  # noqa: E402  (after the line above: a boss gone meanwhile ends us)

jit.skip_blas_probe()

from . import flusher, namesrv, services, worker  # noqa: F401  (imported for the children)
from .ha import process as _ha  # noqa: F401  (the HA process's)

set_process_name("shmq-forkserver")
jit.load(jit.BROKER)
