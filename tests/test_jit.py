"""The kernels' loading discipline (core/jit.py): one canonical
specialisation per kernel, a cache probe that knows what is compiled, and
frozen dispatchers that fit later calls to what is loaded instead of
compiling on a request path. Each check runs in a fresh interpreter, so no
other test's calls add specialisations."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(os.environ.get("NUMBA_DISABLE_JIT") == "1",
                                reason="no dispatchers with the JIT off")


def run(code: str) -> dict:
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_every_unit_loads_exactly_one_specialisation_of_each_of_its_kernels(tmp_path):
    """Also after reads through both Spark sources where pyspark is here (a
    Spark worker's path, which freezes nothing: rows and queue positions it
    made, writable, beside a read-only segment): they add no second
    specialisation, which a worker would compile for seconds on a cold cache."""
    from conftest import small_config
    from shmq.core.records import encode
    from shmq.core.store import close_clean, open_local
    root = str(tmp_path / "store")
    store, _ = open_local(small_config(root))
    for i in range(5):
        store.append(encode("Jit", [b"m%d" % i], queue_ids=0, properties=b"TAGS\x01t\x02KEYS\x01k"))
    close_clean(store)
    counts = run(f"""
import json
from shmq.core import jit
names = tuple(jit.UNITS)
jit.load(names)
try:
    from shmq.spark import sources as S
except ImportError:             # no pyspark here: the units alone
    S = None
if S is not None:
    for reader in (S.ShmqBatchReader({{"path": {root!r}, "subscribe": "Jit", "includeProperties": "true"}}),
                   S.ShmqCommitLogReader({{"path": {root!r}, "includeProperties": "true"}})):
        assert sum(b.num_rows for p in reader.partitions() for b in reader.read(p)) == 5
print(json.dumps(jit.compile_counts(names)))
""")
    assert counts and all(n == 1 for n in counts.values()), counts


def test_after_load_the_cache_probe_finds_nothing_cold():
    cold = run("import json\nfrom shmq.core import jit\njit.load(tuple(jit.UNITS))\n"
               "print(json.dumps([u.name for u in jit.cold_units(tuple(jit.UNITS))]))")
    assert cold == []


def test_a_frozen_kernel_takes_writable_arrays_and_refuses_what_does_not_fit():
    out = run("""
import json
import numpy as np
from shmq.core import jit, records, _kernels as K
jit.load(jit.BROKER)
jit.freeze(jit.BROKER)
# the request paths pass writable buffers and offsets: they fit the read-only kernels
b = records.encode("T", [b"ab", b"c"], properties=[b"TAGS\\x01x", b""])
K.scan_records(b.buf, 0, b.nbytes, 0, True, K.CRC_TABLES, records._TAGS_KEY,
               np.zeros((2, K.N_SCAN), np.int64))
bb = records.split_batch_body(b"\\x00\\x00\\x00\\x18" + bytes(12) + b"\\x00\\x00\\x00\\x01x\\x00\\x01t", b"")
records.encode_arrays("T", bb.body_buf, bb.body_off, bb.body_len, bb.props_buf, bb.props_off,
                      bb.props_len)
counts = jit.compile_counts(jit.BROKER)
try:
    K.last_nonzero(np.zeros(8, np.int32), 0)       # another dtype: a bug, refused at once
    refused = ""
except TypeError as e:
    refused = str(e)
print(json.dumps({"counts": counts, "refused": refused}))
""")
    assert all(n == 1 for n in out["counts"].values()), out["counts"]
    assert "No matching definition" in out["refused"]


def test_shmqs_programs_load_the_kernels_without_numbas_scipy_blas_probe():
    """The broker's processes never pay for importing scipy.linalg (numba's
    BLAS probe, 0.2-0.9 s a process where scipy is installed), and what
    they run may still import scipy.linalg itself."""
    out = run("""
import json, sys
from shmq.core import jit
jit.skip_blas_probe()
jit.load(jit.BROKER)
loaded = "scipy.linalg" in sys.modules
try:
    import scipy
except ImportError:              # no scipy here: nothing more to see
    scipy = None
if scipy is not None:
    import scipy.linalg.cython_blas
print(json.dumps({"loaded": loaded}))
""")
    assert out == {"loaded": False}


def test_an_edit_of_any_kernel_module_makes_every_kernels_cache_stale(tmp_path):
    """Numba keys a cache entry by the defining file only, but a kernel's
    machine code holds its helpers from the other modules (``_kernels``
    header). Here ``cq_put`` (consumequeue.py) inlines ``st_i64``
    (binary.py): after an edit of binary.py alone its cache entry must be
    stale. Run on a copy of the package, so the tree's cache is untouched."""
    import shutil
    from shmq.core import _kernels, layout
    pkg = tmp_path / "kpkg"
    shutil.copytree(os.path.dirname(_kernels.__file__), pkg / "_kernels",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(layout.__file__, pkg / "layout.py")
    (pkg / "__init__.py").write_text("")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    env.pop("NUMBA_CACHE_DIR", None)         # the cache beside the copied files

    def cached() -> bool:
        code = ("import json, numpy as np\nfrom shmq.core import jit\n"
                "from kpkg._kernels import consumequeue as C\n"
                "was = jit._cached(C.cq_put)\n"
                "C.cq_put(np.zeros(40, np.uint8), 1, 7, 20, 5)\n"
                "print(json.dumps(was))")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=600, env=env)
        assert r.returncode == 0, r.stderr[-3000:]
        return json.loads(r.stdout.strip().splitlines()[-1])

    assert cached() is False                 # first run compiles and saves
    assert cached() is True                  # a new process loads it
    with open(pkg / "_kernels" / "binary.py", "a") as f:
        f.write("# an edit\n")
    assert cached() is False                 # stale: binary.py changed under it


def test_a_compile_in_a_background_thread_leaves_the_main_threads_stdout_alone():
    """numba colours its error messages with colorama, which wraps and then
    puts back ``sys.stdout`` around each message, typing messages of
    successful compiles included: from a background thread (a direct reader
    warming its kernels) that put back the stream of an earlier moment under
    the main thread's ``redirect_stdout``, and its output went elsewhere (an
    admin command's JSON, lost). Importing shmq turns the colouring off."""
    got = run(
        "import contextlib, io, json, sys, threading, time\n"
        "import shmq.core  # noqa: F401 (before numba, as any shmq program imports it)\n"
        "import numba\n"
        "stop = threading.Event()\n"
        "def compile_loop():\n"
        "    while not stop.is_set():\n"
        "        try:\n"
        "            numba.njit(lambda x: x.nope)(1)      # a typing error, formatted\n"
        "        except Exception:\n"
        "            pass\n"
        "t = threading.Thread(target=compile_loop); t.start()\n"
        "lost = n = 0\n"
        "deadline = time.monotonic() + 1\n"
        "while time.monotonic() < deadline:\n"
        "    out = io.StringIO()\n"
        "    with contextlib.redirect_stdout(out):\n"
        "        time.sleep(0.001)\n"
        "        sys.stdout.write('x')\n"
        "    n += 1\n"
        "    lost += out.getvalue() != 'x'\n"
        "stop.set(); t.join()\n"
        "print(json.dumps({'lost': lost, 'writes': n}))")
    assert got["writes"] > 100 and got["lost"] == 0, got
