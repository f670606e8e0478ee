"""The benchmark runner: ``python -m perf [--quick] [--table] [--out FILE] [--results FILE]
[--broker HOST:PORT] [--install-peers] [name ...]`` (``shmq bench`` runs it from
the checkout with ``--table``: a table on the terminal, ``perf.table``).

Prints one JSON object per line: first the machine the run measured
(perf.machine: CPU, cores, kernel, the scratch directory's file system, the
OS settings sysctl/tune.py checks) as ``{"machine": {...}}``, then one per
result::

    {"bench": ..., "value": ..., "unit": ..., "limit": ..., "limit_name": ...,
     "ratio": value / limit, ...extra fields, "run": id, "machine": {...}}

Limits are measured in the same run (``perf.limits``, ``perf.net_limits``),
once, before the benchmarks that use them. Every benchmark checks its own
result (counts, offsets, read-back) and fails loudly rather than print a
number for work it did not do. A bench whose peer is missing prints
``{"bench": ..., "skipped": reason}`` instead. ``--quick`` shrinks every size
for CI (the store benches in under a minute; the network, peer and broker
benches together in under a minute more); names select benchmarks (prefix
match: ``broker`` runs every broker bench). Peer figures (Redis) are printed
beside the broker's when the peer bench ran earlier in the same run.

Scratch files go to $SHMQ_PERF_DIR or ./.perf-scratch: keep it on the disk
you want measured (a tmpfs makes fdatasync free and the numbers meaningless).

``--broker HOST:PORT`` (or $SHMQ_PERF_BROKER) runs the broker and client
benches against a broker that is already running instead of ones started
here (perf.broker.NamedBroker); benches that open, crash and recover a store
of their own in this process have nothing to measure there and print a
``skipped`` line. ``--results FILE`` writes the run as a Markdown table
(perf.report), the machine record on top.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import traceback

from perf import (Skipped, append, backlog, broker, client, features, local_ipc, machine, net_limits,
                  pull_transfer, recovery, redis_peer, replication, report, spark, sync_flush, table,
                  worker_cpu, write_path)
from perf.limits import fdatasync_rate, memcpy_into_mmap, sequential_write


class Context:
    """Sizes for this run and limits measured once, on first use."""

    def __init__(self, quick: bool, scratch: str, install_peers: bool = False,
                 named_broker: broker.NamedBroker | None = None):
        self.quick = quick
        self.scratch = scratch
        # a running broker to measure instead of starting one (--broker)
        self.named_broker = named_broker
        # may the harness install a missing peer (redis-server) with apt-get?
        self.install_peers = install_peers
        self._memcpy = None
        self._fsync = None
        self._seqwrite: dict[int, float] = {}
        self._rtt: dict[str, dict] = {}
        self._bulk: dict[str, dict] = {}
        # peer figures measured in this run (redis_peer), for the benches that
        # print them beside their own
        self.peers: dict[str, float] = {}
        # things several benches share (a running broker), by name
        self.shared: dict[str, object] = {}
        self._closers: list = []
        # called with each broker this run starts, once it serves and before a
        # bench loads it (``shmq profile`` attaches its samplers here)
        self.broker_watchers: list = []

    def on_close(self, fn) -> None:
        """Run ``fn`` when the run ends (stop a broker started for several benches)."""
        self._closers.append(fn)

    def close(self) -> None:
        errors = []
        while self._closers:
            try:
                self._closers.pop()()
            except Exception as e:   # stop the others, then report
                errors.append(e)
        if errors:
            raise errors[0]

    def net_rtt(self, transport: str) -> dict:
        """Raw request/response round trip over ``transport`` (one measurement per run)."""
        if transport not in self._rtt:
            self._rtt[transport] = net_limits.best_of_placements(
                lambda cpus: net_limits.round_trip(transport, self.scratch,
                                                   0.4 if self.quick else 2.0, cpus=cpus), "rate",
                also=("p50_us", "p99_us"))
        return self._rtt[transport]

    def net_bulk(self, transport: str) -> dict:
        """Raw one-way socket bandwidth over ``transport`` (one measurement per run)."""
        if transport not in self._bulk:
            self._bulk[transport] = net_limits.best_of_placements(
                lambda cpus: net_limits.bulk(transport, self.scratch,
                                             (256 if self.quick else 2048) << 20,
                                             rounds=3 if self.quick else 5, cpus=cpus), "bps")
        return self._bulk[transport]

    def sub(self, name: str) -> str:
        d = tempfile.mkdtemp(prefix=f"{name}-", dir=self.scratch)
        return d

    def memcpy_bps(self) -> float:
        if self._memcpy is None:
            self._memcpy = memcpy_into_mmap(self.scratch, (64 if self.quick else 512) << 20)
        return self._memcpy

    def disk_write_bps(self, nbytes: int) -> float:
        """Sustained write rate for a run of ``nbytes`` (one measurement per size)."""
        if nbytes not in self._seqwrite:
            self._seqwrite[nbytes] = sequential_write(self.scratch, nbytes)
        return self._seqwrite[nbytes]

    def fdatasync(self) -> tuple[float, float]:
        if self._fsync is None:
            self._fsync = fdatasync_rate(self.scratch, 1.0 if self.quick else 3.0)
        return self._fsync


def result(bench: str, value: float, unit: str, limit: float, limit_name: str, **extra) -> dict:
    return {"bench": bench, "value": round(value, 3), "unit": unit, "limit": round(limit, 3),
            "limit_name": limit_name, "ratio": round(value / limit, 4) if limit else None, **extra}


BENCHES = {
    # Spark first: its store and JVM heap want the page cache and memory the
    # later benches fill (run after them, with GBs of their scratch files
    # cached, the same ingest measured 30% slower: allocations reclaimed
    # pages). It frees both when its last bench ends.
    "spark_decode": spark.run_decode,
    "spark_count": spark.run_count,
    "spark_parquet": spark.run_parquet,
    "append": append.run_append,
    "queues": append.run_queues,
    "sync_flush": sync_flush.run,
    "recovery": recovery.run,
    "flush_write_path": write_path.run,
    "net_limits": net_limits.run,
    "pull_transfer": pull_transfer.run,
    "redis_peer": redis_peer.run,
    "broker_send": broker.run_send,
    "broker_produce": broker.run_produce,
    "broker_consume": broker.run_consume,
    "broker_latency": broker.run_latency,
    "broker_sync_flush": broker.run_sync_flush,
    "broker_scaling": broker.run_scaling,
    "broker_cpu": worker_cpu.run,
    "broker_timer": features.run_timer,
    "broker_timer_burst": features.run_timer_burst,
    "broker_delay": features.run_delay,
    "broker_sql_filter": features.run_sql_filter,
    "client_send": client.run_send,
    "client_consume": client.run_consume,
    "local_ipc": local_ipc.run,
    "backlog": backlog.run,
    "ha": replication.run,
    "ha_sync_master": replication.run_sync_master,
}


# Benches that open, write, crash and recover a store in this process: with a
# named broker (--broker) they would not measure it, so they are skipped.
OWN_STORE = ("append", "queues", "sync_flush", "recovery", "flush_write_path", "spark_decode", "spark_count",
             "spark_parquet")


def select(names: list[str]) -> list[str]:
    """The benches ``names`` choose (prefix match; none: all), in suite order."""
    unknown = [n for n in names if not any(b.startswith(n) for b in BENCHES)]
    if unknown:
        raise ValueError(f"unknown benchmark(s) {unknown}; choose from {list(BENCHES)}")
    return [b for b in BENCHES if not names or any(b.startswith(n) for n in names)]


def scratch_base() -> str:
    return os.environ.get("SHMQ_PERF_DIR", os.path.join(os.getcwd(), ".perf-scratch"))


def run_one(ctx: Context, name: str):
    """The lines of one bench: its results, or a ``skipped`` line with the
    reason; a bench that fails (its checks, or an error) ends with a
    ``failed`` line naming why, its traceback on stderr, and the run goes on
    to the next bench (the run's exit status then says it failed)."""
    if ctx.named_broker is not None and name in OWN_STORE:
        yield {"bench": name, "skipped": f"opens and recovers a store of its own in this process; "
                                          f"nothing to measure on the named broker {ctx.named_broker.tcp}"}
        return
    try:
        yield from BENCHES[name](ctx, result)
    except Skipped as e:
        yield {"bench": name, "skipped": str(e)}
    except Exception as e:
        traceback.print_exc()
        yield {"bench": name, "failed": f"{type(e).__name__}: {e}"}


def run(chosen: list[str], quick: bool, emit, broker_addr: str | None = None,
        install_peers: bool = False, setup=None, before_close=None) -> list[dict]:
    """Run the benches ``chosen``: ``emit(line)`` gets the machine line first, then
    every result line (with the run id and the machine record) as it comes;
    returns them all. ``setup(ctx)`` runs before the first bench and
    ``before_close()`` after the last, before the brokers stop (``shmq profile``
    adds to ``ctx.broker_watchers`` to record each broker the benches start
    before any load reaches it, and stops recording before the brokers go)."""
    base = scratch_base()
    os.makedirs(base, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="run-", dir=base)
    lines: list[dict] = []
    try:
        named = broker.NamedBroker(broker_addr) if broker_addr else None
        ctx = Context(quick, scratch, install_peers=install_peers, named_broker=named)
        rec = machine.record(scratch, quick, named)
        lines.append({"machine": rec})
        emit(lines[-1])
        if setup is not None:
            setup(ctx)
        try:
            for name in chosen:
                for r in run_one(ctx, name):
                    lines.append({**r, "run": rec["run"], "machine": rec})
                    emit(lines[-1])
        finally:
            try:
                if before_close is not None:
                    before_close()
            finally:
                ctx.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return lines


def launcher_prog(argv: list[str], default: str) -> str:
    """The name to answer under: ``--prog=NAME`` when a launcher (``shmq bench``) gave one."""
    return next((a.split("=", 1)[1] for a in argv if a.startswith("--prog=")), default)


def check_broker(addr: str | None) -> str | None:
    """Why the named broker cannot be measured (unreachable), or None."""
    if addr is None:
        return None
    try:
        broker.NamedBroker(addr)
    except RuntimeError as e:
        return str(e)
    return None


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = argparse.ArgumentParser(prog=launcher_prog(argv, "python -m perf"), description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help=f"benchmarks to run (default all; by prefix: `broker` "
                                             f"runs every broker bench): {', '.join(BENCHES)}")
    ap.add_argument("--quick", action="store_true", help="small sizes, for CI (about three minutes)")
    ap.add_argument("--table", action="store_true",
                    help="print a table as results arrive instead of the JSON lines, which then go "
                         "to --out, else to perf/results/<run id>.jsonl (what `shmq bench` runs)")
    ap.add_argument("--out", metavar="FILE", help="also append the JSON lines to this file")
    ap.add_argument("--results", metavar="FILE",
                    help="write the run as a Markdown table with limits and peers (perf/RESULTS.md)")
    ap.add_argument("--broker", default=os.environ.get("SHMQ_PERF_BROKER"), metavar="HOST:PORT",
                    help="measure this running broker instead of starting one; benches that need "
                         "their own store or settings it lacks are skipped ($SHMQ_PERF_BROKER)")
    ap.add_argument("--install-peers", action="store_true",
                    help="as root, apt-get install a missing peer (redis-server); also when $CI is set")
    ap.add_argument("--prog", help=argparse.SUPPRESS)     # the name a launcher (`shmq bench`) gives
    args = ap.parse_args(argv)
    try:
        chosen = select(args.names)
    except ValueError as e:
        ap.error(str(e))
    why = check_broker(args.broker)
    if why:
        print(f"{ap.prog}: {why}", file=sys.stderr)
        return 1
    printer = table.Printer(args.out, table=args.table, keep=args.table)
    t0 = time.perf_counter()
    try:
        lines = run(chosen, args.quick, printer, args.broker, args.install_peers)
    finally:
        printer.close()
    if args.results:
        shown = [a for a in argv if not a.startswith("--prog=") and not (args.prog and a == "--table")]
        report.write(args.results, lines, " ".join([ap.prog, *shown]))
    done = sum(1 for line in lines if "value" in line)
    skipped = sum(1 for line in lines if "skipped" in line)
    failed = [line["bench"] for line in lines if "failed" in line]
    print(f"# {len(chosen)} benchmarks, {done} results, {skipped} skipped"
          + (f", {len(failed)} FAILED ({', '.join(failed)})" if failed else "") + " in "
          f"{time.perf_counter() - t0:.1f} s" + (f"; JSON lines in {printer.out_path}" if printer.out_path else "")
          + (f"; table in {args.results}" if args.results else ""), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
