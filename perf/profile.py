"""``shmq profile`` (``python -m perf.profile``, which it runs from the checkout):
flame graphs of every broker process while a benchmark runs.

    shmq profile [--idle] [--duration S] [--out DIR] [--rate HZ] [--quick] [bench]
    shmq profile --pid BOSS [--broker HOST:PORT] [--idle] [--duration S] [--out DIR] [--rate HZ] [bench]

Without ``--pid`` it runs the bench (default broker_produce) through perf's
runner, which starts the broker(s) the bench needs; as each one serves, one
``py-spy record --format flamegraph --nonblocking`` is started per process:
the boss, every worker, the flusher, the services process (and an embedded
NameServer). With ``--pid`` it records the broker whose boss is BOSS, and
runs the bench against it when ``--broker`` gives its address (else it
records whatever load the broker has for ``--duration``).

Each recording stops when the bench ends or after ``--duration`` seconds,
whichever is first (py-spy writes its SVG on SIGINT), and always before the
broker is stopped. The SVGs are ``<out>/<role>-<pid>.svg`` (boss-1234.svg,
worker-0-1236.svg, flusher-1235.svg, ...); their paths are printed. The
bench's JSON lines go beside them (``<out>/<run id>.jsonl``).

``--idle`` samples the time a process waits too (py-spy ``--idle``): each
process's line then says what share of its time it spent waiting for the
store's append lock (``SemaphoreLock.acquire``) and for its turn to publish
(``MessageStore._await``), the two waits of the append protocol
(``core/store.py``), and in its reactor's poll (nothing to do).

py-spy reads the other processes' memory (ptrace / process_vm_readv): it
needs root or CAP_SYS_PTRACE wherever Yama's kernel.yama.ptrace_scope is 1 or
more (the broker is py-spy's sibling, not its child). When a recording
fails, the error names what stood in the way. ``--nonblocking`` never
pauses the broker, so the bench's figures stay honest.
"""
from __future__ import annotations

import argparse
import html
import os
import re
import shutil
import signal
import subprocess
import sys
import time

from shmq.broker.procs import broker_processes, proc_stat

CAP_SYS_PTRACE = 19
SETTLE_S = 10.0          # how long a broker's children may take to name themselves


# What a process waits for, by the frame that waits (``--idle``'s summary)
WAITS = (("append lock", "SemaphoreLock.acquire ("),
         ("publish wait", "MessageStore._await ("),
         ("poll", "Reactor.run_once (broker/reactor.py"))
_TITLE = re.compile(r"<title>([^<]*) \(([\d,]+) samples?, [\d.]+%\)</title>")


def wait_shares(svg_text: str) -> dict[str, float] | None:
    """Each of WAITS' share of the samples of a py-spy flame graph (its
    frames' own titles: ``name (file:line) (N samples, P%)``), None when it
    has none. A frame's samples include its callees': the poll's count is
    the poll line's, which only waits (``Reactor.run_once``'s other lines
    run the turn)."""
    total = 0
    got = dict.fromkeys((name for name, _ in WAITS), 0)
    for m in _TITLE.finditer(svg_text):
        title = html.unescape(m.group(1))
        n = int(m.group(2).replace(",", ""))
        if title == "all":
            total = n
            continue
        for name, frame in WAITS:
            if title.startswith(frame) and (name != "poll" or title.endswith(f":{POLL_LINE})")):
                got[name] += n
    if not total:
        return None
    return {name: n / total for name, n in got.items()}


# What XML 1.0 does not allow in a document (every C0 control but tab, LF, CR)
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f]")


def clean_svg(path: str) -> int:
    """Make py-spy's SVG a well-formed document again; how many characters
    it replaced (U+FFFD). ``--nonblocking`` reads the process's memory while
    it runs, so a frame's name can be read half-written: NUL bytes and
    bytes that are no UTF-8 in a ``<title>``, which no XML parser and no
    browser takes (seen once in CI: a worker's graph would not open). The
    frame's samples stay where they were."""
    with open(path, "rb") as f:
        raw = f.read()
    text = _NOT_XML.sub("\ufffd", raw.decode("utf-8", errors="replace"))
    n = text.count("\ufffd") - raw.count("\ufffd".encode())   # (less those it had)
    if n:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    return n


def _poll_line() -> int:
    """The line of ``Reactor.run_once`` that waits in ``epoll.poll``."""
    import inspect
    from shmq.broker.reactor import Reactor
    lines, first = inspect.getsourcelines(Reactor.run_once)
    return first + next(i for i, ln in enumerate(lines) if ".poll(" in ln)


POLL_LINE = _poll_line()


# ------------------------------------------------------------------ py-spy and ptrace
def find_pyspy() -> str | None:
    """py-spy from this Python's environment first (not a shim), else from PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return beside if os.access(beside, os.X_OK) else shutil.which("py-spy")


def ptrace_facts() -> dict:
    """What decides whether py-spy may read a sibling process."""
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            scope = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        scope = None                                          # no Yama: plain uid rules
    cap = False
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    cap = bool(int(line.split()[1], 16) >> CAP_SYS_PTRACE & 1)
    except (OSError, ValueError):
        pass
    return {"ptrace_scope": scope, "cap_sys_ptrace": cap, "euid": os.geteuid()}


def ptrace_problem(facts: dict | None = None) -> str | None:
    """Why py-spy will be refused here, when that is clear before trying (None: it should work)."""
    f = facts or ptrace_facts()
    if f["ptrace_scope"] == 3:
        return "kernel.yama.ptrace_scope=3: ptrace is disabled for everyone until reboot"
    if f["ptrace_scope"] in (1, 2) and not f["cap_sys_ptrace"]:
        return (f"kernel.yama.ptrace_scope={f['ptrace_scope']} and no CAP_SYS_PTRACE "
                f"(euid {f['euid']}): py-spy may not read the broker, which is not its child")
    return None


def ptrace_advice(facts: dict) -> str:
    scope = facts["ptrace_scope"]
    return (f"ptrace here: kernel.yama.ptrace_scope={'absent (no Yama)' if scope is None else scope}, "
            f"CAP_SYS_PTRACE {'present' if facts['cap_sys_ptrace'] else 'absent'}, euid {facts['euid']}. "
            "Run as root (sudo shmq profile ...), or give py-spy the capability "
            "(sudo setcap cap_sys_ptrace+ep \"$(which py-spy)\"), or allow sibling ptrace "
            "(sudo sysctl kernel.yama.ptrace_scope=0); in a container, start it with "
            "--cap-add SYS_PTRACE")


class Recording:
    """One ``py-spy record`` of one process, writing ``<out>/<role>-<pid>.svg``."""

    def __init__(self, pyspy: str, role: str, pid: int, out_dir: str, rate: int, duration: float,
                 idle: bool = False):
        self.role, self.pid = role, pid
        self.svg = os.path.join(out_dir, f"{role}-{pid}.svg")
        if os.path.exists(self.svg):
            os.unlink(self.svg)                     # an old run's: not evidence of this one
        self.log = open(os.path.join(out_dir, f".{role}-{pid}.log"), "w+")  # noqa: SIM115 -- wait() closes
        self.proc = subprocess.Popen(
            [pyspy, "record", "--format", "flamegraph", "--pid", str(pid), "--nonblocking",
             "--rate", str(rate), "--duration", str(max(1, round(duration))), "-o", self.svg,
             *(["--idle"] if idle else [])],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT)

    def sampling(self, timeout: float) -> bool:
        """Wait until py-spy says it samples (its first line), or has exited."""
        deadline = time.monotonic() + timeout
        while True:
            self.log.seek(0)
            if "Sampling process" in self.log.read(4096):
                return True
            if self.proc.poll() is not None or time.monotonic() > deadline:
                return False                    # wait() names what went wrong
            time.sleep(0.01)

    def idle(self) -> bool:
        """py-spy had no sample to draw (it drops idle stacks): the process only waited."""
        with open(self.svg, errors="replace") as f:
            return "No valid input provided to flamegraph" in f.read(4096)

    def waits(self) -> dict[str, float] | None:
        with open(self.svg, errors="replace") as f:
            return wait_shares(f.read())

    def stop(self) -> None:
        """SIGINT (py-spy writes what it has) unless it already stopped by itself."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)

    def wait(self, timeout: float) -> str | None:
        """None when the SVG was written, else why not (py-spy's last words)."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return f"py-spy did not finish within {timeout:.0f} s"
        self.log.seek(0)
        said = self.log.read().strip()
        self.log.close()
        os.unlink(self.log.name)
        if os.path.exists(self.svg) and os.path.getsize(self.svg) > 0:
            clean_svg(self.svg)
            return None
        first = next((ln for ln in said.splitlines() if ln.startswith("Error")), said[-300:])
        return f"py-spy exited with {self.proc.returncode}: {first or 'no output'}"


class Profiler:
    """Records every process of each broker it is shown, until ``finish``."""

    def __init__(self, pyspy: str, out_dir: str, rate: int, duration: float, idle: bool = False):
        self.pyspy, self.out_dir, self.rate, self.duration = pyspy, out_dir, rate, duration
        self.idle = idle
        self.recordings: list[Recording] = []
        self.bosses: set[int] = set()
        self.not_recorded: list[tuple[str, int]] = []

    def attach(self, boss: int) -> None:
        """Record every process of the broker whose boss is ``boss``; returns once
        each sampler has begun, so load sent after it is seen."""
        if boss in self.bosses:
            return
        self.bosses.add(boss)
        # The ready line can come before the services process has named
        # itself (with no NameServer to register with, nothing waits for it)
        deadline = time.monotonic() + SETTLE_S
        while True:
            roles, others = broker_processes(boss)
            if {"flusher", "services"} <= {r for r, _ in roles} or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        self.not_recorded += others
        started = [Recording(self.pyspy, role, pid, self.out_dir, self.rate, self.duration,
                             self.idle) for role, pid in roles]
        self.recordings += started
        for r in started:
            r.sampling(30.0)

    def watch(self, ctx) -> None:
        """Attach to each broker the benches start, before they send it anything."""
        ctx.broker_watchers.append(lambda b: self.attach(b.proc.pid))

    def finish(self) -> list[tuple[Recording, str | None]]:
        """Stop recording; (recording, error or None) each."""
        for r in self.recordings:
            r.stop()
        return [(r, r.wait(60)) for r in self.recordings]


# ------------------------------------------------------------------ the command
def _report(prof: Profiler, done: list, facts: dict, prog: str) -> int:
    ok = [(r, e) for r, e in done if e is None]
    print(f"# {len(done)} broker processes recorded, {len(ok)} flame graphs"
          f"{' (idle time sampled: the share of each one spent waiting)' if prof.idle else ''}:")
    for r, err in done:
        if err is None:
            shares = r.waits() if prof.idle else None
            said = ("  (no samples: idle throughout)" if r.idle() else
                    "" if shares is None else
                    "  " + ", ".join(f"{name} {v:.1%}" for name, v in shares.items()))
            print(f"{r.role:<12} pid {r.pid:<8} {r.svg}{said}")
        else:
            print(f"{r.role:<12} pid {r.pid:<8} FAILED: {err}", file=sys.stderr)
    for name, pid in prof.not_recorded:
        print(f"# not recorded: {name} pid {pid} (a child of the boss that is not a shmq role)")
    if len(ok) < len(done):
        print(f"{prog}: {ptrace_problem(facts) or 'py-spy could not record every process'}. "
              f"{ptrace_advice(facts)}", file=sys.stderr)
        return 1
    return 0 if done else 1


def _profile(args, prog: str) -> int:
    from perf.__main__ import check_broker, run, select
    from perf.table import Printer

    pyspy = find_pyspy()
    if pyspy is None:
        print(f"{prog}: py-spy not found: pip install py-spy (it is in shmq's dev extra: "
              "pip install -e '.[dev]')", file=sys.stderr)
        return 2
    if args.pid is not None and proc_stat(args.pid) is None:
        print(f"{prog}: no process {args.pid}", file=sys.stderr)
        return 2
    if args.pid is not None and args.bench and not args.broker:
        print(f"{prog}: with --pid, give --broker HOST:PORT to run a bench against that "
              "broker, or no bench to record its own load for --duration", file=sys.stderr)
        return 2
    facts = ptrace_facts()
    out_dir = os.path.abspath(args.out)
    os.makedirs(out_dir, exist_ok=True)
    prof = Profiler(pyspy, out_dir, args.rate, args.duration, args.idle)
    if args.pid is not None and not args.bench:
        prof.attach(args.pid)
        print(f"# recording broker {args.pid} for {args.duration:g} s", file=sys.stderr)
        time.sleep(args.duration)
        return _report(prof, prof.finish(), facts, prog)
    try:
        chosen = select([args.bench or "broker_produce"])
    except ValueError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    why = check_broker(args.broker if args.pid is not None else None)
    if why:
        print(f"{prog}: {why}", file=sys.stderr)
        return 1
    printer = Printer(None, table=True, keep=True, results=out_dir)   # the bench's JSON lines beside the SVGs

    def setup(ctx):
        if args.pid is not None:
            prof.attach(args.pid)
        else:
            prof.watch(ctx)

    done = None

    def before_close():
        nonlocal done
        done = prof.finish()          # the SVGs are written before the brokers stop

    try:
        run(chosen, args.quick, printer, args.broker if args.pid is not None else None,
            setup=setup, before_close=before_close)
    finally:
        printer.close()
        if done is None:
            done = prof.finish()
    if not done:
        print(f"{prog}: {' '.join(chosen)} started no broker to record; profile a broker "
              "bench (broker_*, client_*)", file=sys.stderr)
        return 1
    return _report(prof, done, facts, prog)


def main(argv=None) -> int:
    from perf.__main__ import launcher_prog

    argv = sys.argv[1:] if argv is None else list(argv)
    ap = argparse.ArgumentParser(prog=launcher_prog(argv, "python -m perf.profile"),
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("bench", nargs="?", help="the benchmark to run (prefix; default broker_produce; "
                                             "with --pid: none, record the broker's own load)")
    ap.add_argument("--duration", type=float, default=30.0, metavar="S",
                    help="record at most this many seconds (default 30; the bench's end stops it sooner)")
    ap.add_argument("--out", default="profile", metavar="DIR",
                    help="directory for <role>-<pid>.svg (default ./profile)")
    ap.add_argument("--rate", type=int, default=100, metavar="HZ", help="samples per second (default 100)")
    ap.add_argument("--quick", action="store_true", help="the bench's small (CI) sizes")
    ap.add_argument("--idle", action="store_true",
                    help="sample waiting time too, and say each process's share of it waiting for "
                         "the append lock, its turn to publish, and in its poll")
    ap.add_argument("--pid", type=int, help="record the running broker whose boss has this pid")
    ap.add_argument("--broker", metavar="HOST:PORT", help="with --pid: that broker's address, to run "
                                                          "the bench against it")
    ap.add_argument("--prog", help=argparse.SUPPRESS)     # the name a launcher (`shmq profile`) gives
    return _profile(ap.parse_args(argv), ap.prog)


if __name__ == "__main__":
    sys.exit(main())
