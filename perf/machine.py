"""The machine a run measured, so that two runs' figures can be compared.

One record per run: the runner prints it first as ``{"machine": {...}}`` and
puts it in every result line beside a run id. It holds what changes the
figures: CPU model, cores (online, and usable by this process), kernel,
memory, the load average when the run began, the file system and block device of the scratch directory (where
the stores and limits are measured) and of a named broker's store when that
is on this host, the commit measured, and the value of every OS setting
sysctl/tune.py checks, with the ones it would tune listed.

The settings are read by tune.py's own code (``gather``), loaded from the
checkout's sysctl/ folder beside perf/: there is one reader of those files.
Without that folder the record says so and carries no settings. Reading
never needs root and never writes anything.
"""
from __future__ import annotations

import importlib.util
import os
import platform
import subprocess
import sys
import time

CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TUNE_PATH = os.path.join(CHECKOUT, "sysctl", "tune.py")


def _tune():
    """sysctl/tune.py as a module, or None when the checkout has no sysctl/."""
    if not os.path.exists(TUNE_PATH):
        return None
    mod = sys.modules.get("shmq_sysctl_tune")
    if mod is None:
        spec = importlib.util.spec_from_file_location("shmq_sysctl_tune", TUNE_PATH)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        sys.modules["shmq_sysctl_tune"] = mod
    return mod


def settings(tune, path: str) -> dict:
    """File system, device and OS settings for a directory, from ``tune.gather``."""
    rep = tune.gather("/", path, None)
    values, to_tune = {}, []
    for i in rep["items"]:
        key = i["key"] + (f"[{i['device']}]" if i["device"] and i["key"].startswith("block.") else "")
        values[key] = i["current"]
        if i["status"] == "tune":
            to_tune.append(key)
    mount = rep["mount"] or {}
    return {"path": rep["store"], "filesystem": mount.get("fstype"), "source": mount.get("source"),
            "mountpoint": mount.get("mountpoint"), "device": rep["device"]["node"],
            "disks": rep["device"]["disks"], "sysctl": values, "sysctl_to_tune": to_tune}


def _cpu() -> tuple[str, bool]:
    """(model name, running under a hypervisor)."""
    model, virtual = None, False
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "Model", "cpu model") and model is None:
                    model = value.strip()
                elif key == "flags":
                    virtual = "hypervisor" in value.split()
    except OSError:
        pass
    return model or platform.processor() or platform.machine(), virtual


def _commit() -> str | None:
    try:
        r = subprocess.run(["git", "-C", CHECKOUT, "describe", "--always", "--dirty"],
                           capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return None
    return r.stdout.strip() or None


def record(scratch: str, quick: bool, named=None) -> dict:
    """The run's machine record; ``named`` is the run's NamedBroker, if any."""
    cpu, virtual = _cpu()
    uname = os.uname()
    rec = {"run": time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + os.urandom(2).hex(),
           "time": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
           "host": uname.nodename, "cpu": cpu, "virtual": virtual,
           "cores": os.cpu_count(), "cores_usable": len(os.sched_getaffinity(0)),
           "kernel": uname.release, "arch": uname.machine,
           "python": platform.python_version(), "commit": _commit(), "quick": quick,
           # other work on the machine when the run began (figures from a busy machine are low)
           "loadavg_1m_5m_15m": [round(x, 2) for x in os.getloadavg()],
           "broker": named.tcp if named is not None else "started by the run"}
    tune = _tune()
    if tune is None:
        rec.update(memory_kb=None, scratch={"path": scratch, "filesystem": None},
                   sysctl=None, sysctl_note=f"no {TUNE_PATH}: OS settings not recorded")
        return rec
    rec["memory_kb"] = tune.mem_total_kb("/")
    scr = settings(tune, scratch)
    rec["scratch"] = {k: v for k, v in scr.items() if not k.startswith("sysctl")}
    rec["filesystem"] = scr["filesystem"]
    rec["sysctl"] = scr["sysctl"]
    rec["sysctl_to_tune"] = scr["sysctl_to_tune"]
    if named is not None and named.store:
        st = settings(tune, named.store)
        rec["broker_store"] = {k: v for k, v in st.items() if k != "sysctl_to_tune"}
    return rec
