"""The import direction of DESIGN §2: core and ipc import nothing of the
other rooms; broker only core and ipc; client only ipc (and core); the Spark
sources core, ipc and broker (the live view of a store). tools/ and perf/
never import each other: the benchmarks measure shmq's packages from
outside, and ``shmq bench`` starts perf's runner as a program."""
from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
ALLOWED = {
    "core": set(),
    "ipc": set(),
    "broker": {"core", "ipc"},
    "client": {"ipc", "core"},
    "spark": {"core", "ipc", "broker"},
}


def imported_rooms(path: pathlib.Path) -> set[str]:
    rooms = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "shmq" and len(parts) > 1:
                rooms.add(parts[1])
    return rooms


def test_rooms_import_only_what_the_design_allows():
    bad = []
    for room, allowed in ALLOWED.items():
        for path in (ROOT / room).rglob("*.py"):
            extra = imported_rooms(path) - allowed - {room}
            if extra:
                bad.append(f"{path.relative_to(ROOT)} imports {sorted(extra)}")
    assert not bad, bad


def test_relative_imports_stay_inside_their_room():
    """``.`` is the module's own package: a module of broker/ may go up no
    level, one of broker/handlers/ one (to broker/), and so on."""
    for room in ALLOWED:
        for path in (ROOT / room).rglob("*.py"):
            depth = len(path.relative_to(ROOT / room).parts) - 1     # packages below the room
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.level > depth + 1:
                    raise AssertionError(f"{path.relative_to(ROOT)}: relative import leaves {room}/")


def imported_modules(path: pathlib.Path) -> set[str]:
    """Every module ``path`` imports, statically or by ``importlib.import_module("...")``."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant)):
            names.add(str(node.args[0].value))
    return names


def test_tools_and_perf_do_not_import_each_other():
    bad = [f"{p.relative_to(ROOT)} imports {sorted(m)}" for p in (ROOT / "tools").rglob("*.py")
           if (m := {n for n in imported_modules(p) if n == "perf" or n.startswith("perf.")})]
    bad += [f"{p.relative_to(ROOT)} imports {sorted(m)}" for p in (ROOT / "perf").rglob("*.py")
            if (m := {n for n in imported_modules(p) if n == "shmq.tools" or n.startswith("shmq.tools.")})]
    assert not bad, bad


PRIVATE_KERNELS = "shmq.core._kernels"
OUTSIDE_CORE = ("broker", "client", "ipc", "tools", "perf", "spark")


def kernel_imports(path: pathlib.Path) -> list[int]:
    """Lines of ``path`` that import the private kernels, however spelled:
    ``import shmq.core._kernels``, ``from shmq.core._kernels[.x] import ...``,
    ``from shmq.core import _kernels``."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        if any(n == PRIVATE_KERNELS or n.startswith(PRIVATE_KERNELS + ".") for n in names):
            lines.append(node.lineno)
    return lines


def test_only_core_imports_the_private_kernels():
    """The kernels are core's private business (issue 16): other rooms call
    core's public readers (``core.reader``, ``core.records``, ``core.view``)
    and name the scan vocabulary from ``core.layout``. tests/ may import
    them: they test the kernels."""
    bad = []
    for room in OUTSIDE_CORE:
        for path in (ROOT / room).rglob("*.py"):
            for line in kernel_imports(path):
                bad.append(f"{path.relative_to(ROOT)}:{line}")
    assert not bad, bad


def test_the_kernel_import_check_sees_every_spelling(tmp_path):
    for text in ("from shmq.core import _kernels as K", "import shmq.core._kernels",
                 "from shmq.core._kernels import scan_records", "from shmq.core import layout, _kernels",
                 "from shmq.core._kernels.records import records_at", "def f():\n    import shmq.core._kernels as K"):
        p = tmp_path / "m.py"
        p.write_text(text + "\n")
        assert kernel_imports(p), text
    p = tmp_path / "m.py"
    p.write_text("from shmq.core import layout, records\nimport shmq.core.reader\n")
    assert not kernel_imports(p)
