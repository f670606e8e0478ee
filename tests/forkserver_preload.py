"""What the tests' fork server holds before it forks a test's child process
(as broker/preload.py does for the broker): the children's modules and the
kernels, loaded once for the session instead of once a child. A child
spawned fresh paid ~1-2 s of a 2-core machine (interpreter, imports, numba's
kernel loads) before it did anything; test_control, test_claims and
test_crash start dozens. The server is a fresh interpreter holding no store,
socket or shared memory, so a child still gets only what it is given."""
from shmq.core import jit

import procs  # noqa: F401  (the children's bodies)

jit.load(jit.BROKER)
