"""A run's lines as a table: the terminal table of ``shmq bench`` and the
Markdown of ``--results FILE`` (perf/RESULTS.md), from the same cells.

Every figure is shown with the limit measured in the same run and, where
the bench has one, its peer measured in the same run (Redis, the C++
client): the peers are the result fields listed in ``PEERS``. A skipped bench
keeps its row, with the reason. The Markdown starts with the machine record
(perf.machine) so a reader knows what was measured, and says when the run
was a ``--quick`` one (every size shrunk for CI: the shape, not the
full-size figures).
"""
from __future__ import annotations

import os

# result field holding a peer's figure (same unit as the value) -> what the
# peer is, and the field with value ÷ peer
PEERS = {
    "redis_xadd_same_batch": ("Redis XADD pipelined, same batch, AOF everysec", "over_redis"),
    "redis_always_same_load": ("Redis appendfsync always, same load", "over_redis"),
    "cpp_client": ("C++ core client (rocketmq 0.4.4), same load", "vs_cpp"),
}
# further peers a line may carry (what a user could pick instead, same host,
# same messages, none of them durable), shown after the first
ALSO = {
    "mp_queue": "multiprocessing.Queue",
    "pyzmq_ipc": "pyzmq PUSH/PULL ipc",
    "nats_core": "NATS core",
}


def num(v: float) -> str:
    if abs(v) >= 1e6:
        return f"{v / 1e6:.2f} M"
    if abs(v) >= 1e4:
        return f"{v / 1e3:.1f} k"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def figure(v, unit: str) -> str:
    if v is None:
        return "—"
    if unit == "B":
        return f"{v / 1024:.0f} KiB" if v >= 1024 and v % 1024 == 0 else f"{v:,.0f} B"
    if unit == "B/s":
        return f"{v / 1e9:.2f} GB/s" if v >= 1e8 else f"{v / 1e6:.1f} MB/s"
    return f"{num(v)} {unit}"


def cells(line: dict) -> dict[str, str]:
    """bench, result, limit, limit_name, ratio, peer, peer_name of one result line."""
    for what in ("skipped", "failed"):
        if what in line:
            return {"bench": line["bench"], "result": what, "limit": "", "limit_name": "",
                    "ratio": "", "peer": "", "peer_name": line[what]}
    unit = line["unit"]
    ratio = line.get("ratio")
    out = {"bench": line["bench"], "result": figure(line["value"], unit),
           "limit": figure(line["limit"] or None, unit), "limit_name": line.get("limit_name") or "",
           "ratio": "—" if ratio is None else f"{ratio:.3g}", "peer": "—", "peer_name": ""}
    for field, (name, over) in PEERS.items():
        if field in line:
            if line[field] is None:
                out["peer_name"] = f"{name}: not measured in this run"
            else:
                out["peer"] = figure(line[field], unit)
                out["peer_name"] = name + (f"; ÷ peer {line[over]:.3g}" if line.get(over) else "")
            break
    also = [f"{name} {figure(line[f], unit)}" if line[f] is not None else f"{name}: not installed"
            for f, name in ALSO.items() if f in line]
    if also:
        out["peer_name"] = "; ".join(filter(None, [out["peer_name"], "also " + ", ".join(also)]))
    return out


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _machine_md(m: dict) -> list[str]:
    scr = m.get("scratch") or {}
    mem = m.get("memory_kb")
    rows = [("run", f"`{m['run']}` ({m['time']})"),
            ("CPU", m["cpu"] + (" (virtual machine)" if m.get("virtual") else "")),
            ("cores", f"{m['cores']} online, {m['cores_usable']} usable by the run"),
            ("load average at the start", " / ".join(map(str, m.get("loadavg_1m_5m_15m", ()))) +
             " (1, 5, 15 min: other work on the machine)"),
            ("kernel", f"{m['kernel']} ({m['arch']})"),
            ("memory", f"{mem / 1048576:.1f} GiB" if mem else "?"),
            ("scratch (stores, limits)", (f"`{scr.get('path')}`: {scr.get('filesystem')} on "
                                          f"{scr.get('source')} (device {scr.get('device')}, "
                                          f"mounted at {scr.get('mountpoint')})")),
            ("broker", m["broker"]),
            ("commit", f"`{m.get('commit')}`"),
            ("Python", m["python"])]
    if "broker_store" in m:
        bs = m["broker_store"]
        rows.insert(6, ("named broker's store", f"`{bs['path']}`: {bs['filesystem']} on {bs['source']}"))
    out = ["| | |", "| --- | --- |"] + [f"| {k} | {_md(v)} |" for k, v in rows]
    if m.get("sysctl") is None:
        return out + ["", m.get("sysctl_note", "OS settings not recorded")]
    tune = set(m.get("sysctl_to_tune", ()))
    out += ["", "OS settings that matter (read by `sysctl/tune.py`; `sysctl/check` explains each):", "",
            "| setting | value | |", "| --- | --- | --- |"]
    out += [f"| {_md(k)} | {_md('—' if v is None else v)} | {'sysctl/check: tune' if k in tune else ''} |"
            for k, v in m["sysctl"].items()]
    return out


def markdown(lines: list[dict], command: str) -> str:
    m = next(line["machine"] for line in lines if "machine" in line and "bench" not in line)
    md = ["# Benchmark results", "",
          (f"Written by `{command}` on {m['time']} (`shmq bench --results perf/RESULTS.md` "
           "regenerates it at full size). Every figure sits beside its limit and, "
           "where the bench has one, its peer, both measured in the same run; the JSON lines "
           "of the run carry every other field."), ""]
    if m["quick"]:
        md += [("**A `--quick` run**: every size is shrunk for CI, so these figures show the "
                "shape (what is bound by what), not the full-size numbers. Run it without "
                "`--quick` for those."), ""]
    load, cores = (m.get("loadavg_1m_5m_15m") or [0])[0], m["cores_usable"]
    if load >= cores:
        md += [(f"**A busy machine**: the load average was {load} on {cores} cores when the run "
                "began (other work sharing the CPUs), so rates are lower and latencies higher "
                "than on a quiet one."), ""]
    md += ["## Machine", ""] + _machine_md(m) + ["", "## Results", "",
           "| benchmark | result | limit (same run) | ratio | peer (same run) |",
           "| --- | --- | --- | --- | --- |"]
    for line in lines:
        if "bench" not in line:
            continue
        c = cells(line)
        if c["result"] in ("skipped", "failed"):
            md.append(f"| {_md(c['bench'])} | {c['result']}: {_md(c['peer_name'])} | | | |")
            continue
        peer = f"{c['peer']}: {c['peer_name']}" if c["peer"] != "—" else (c["peer_name"] or "—")
        md.append(f"| {_md(c['bench'])} | {c['result']} | {c['limit']}: {_md(c['limit_name'])} "
                  f"| {c['ratio']} | {_md(peer)} |")
    return "\n".join(md) + "\n"


def write(path: str, lines: list[dict], command: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(markdown(lines, command))
    os.replace(tmp, path)
