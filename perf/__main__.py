"""The benchmark runner: ``python -m perf [--quick] [--out FILE] [--install-peers] [name ...]``.

Prints one JSON object per result line::

    {"bench": ..., "value": ..., "unit": ..., "limit": ..., "limit_name": ...,
     "ratio": value / limit, ...extra fields}

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
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

from perf import (append, broker, client, features, net_limits, pull_transfer, recovery, redis_peer, sync_flush,
                  write_path)
from perf.limits import fdatasync_rate, memcpy_into_mmap, sequential_write


class Context:
    """Sizes for this run and limits measured once, on first use."""

    def __init__(self, quick: bool, scratch: str, install_peers: bool = False):
        self.quick = quick
        self.scratch = scratch
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
    "broker_timer": features.run_timer,
    "broker_timer_burst": features.run_timer_burst,
    "broker_delay": features.run_delay,
    "broker_sql_filter": features.run_sql_filter,
    "client_send": client.run_send,
    "client_consume": client.run_consume,
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m perf", description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help=f"benchmarks to run (default all): {', '.join(BENCHES)}")
    ap.add_argument("--quick", action="store_true", help="small sizes: the suite in under a minute")
    ap.add_argument("--out", help="also append the JSON lines to this file")
    ap.add_argument("--install-peers", action="store_true",
                    help="as root, apt-get install a missing peer (redis-server); also when $CI is set")
    args = ap.parse_args(argv)
    unknown = [n for n in args.names if not any(b.startswith(n) for b in BENCHES)]
    if unknown:
        ap.error(f"unknown benchmark(s) {unknown}; choose from {list(BENCHES)}")
    chosen = [b for b in BENCHES if not args.names or any(b.startswith(n) for n in args.names)]
    base = os.environ.get("SHMQ_PERF_DIR", os.path.join(os.getcwd(), ".perf-scratch"))
    os.makedirs(base, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="run-", dir=base)
    ctx = Context(args.quick, scratch, install_peers=args.install_peers)
    out = open(args.out, "a") if args.out else None
    t0 = time.perf_counter()
    try:
        for name in chosen:
            for r in BENCHES[name](ctx, result):
                line = json.dumps(r)
                print(line, flush=True)
                if out:
                    out.write(line + "\n")
    finally:
        try:
            ctx.close()
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        if out:
            out.close()
    print(f"# {len(chosen)} benchmarks in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
