#!/usr/bin/env python3
"""shmq OS tuning: check, apply and revert the kernel settings the broker's store depends on.

    python sysctl/tune.py check  [--store DIR] [--root /] [--device NAME] [--json]
    python sysctl/tune.py apply  [--store DIR] [--root /] [--device NAME] [--yes] [--state FILE] [--json]
    python sysctl/tune.py revert [--root /] [--yes] [--state FILE] [--json]

check   reports, without root, every setting that matters for the broker: current value,
        recommended value, status (ok / tune / unknown) and why (one line).
apply   dry run unless --yes: prints what it would write.  With --yes (needs euid 0) it
        saves the previous values to the state file, then writes only what is not right
        yet (a second apply writes nothing).  It only writes /proc/sys/vm, transparent
        huge pages and the queue/ files of the block device(s) under the store; mount
        options and process limits are advice (it never remounts, never edits limits.conf).
revert  dry run unless --yes: restores the saved values, then removes the state file.

Every path goes through --root (default /), so a fake tree can stand in for /proc and /sys:
  <root>/proc/sys/vm/<name>, <root>/sys/kernel/mm/transparent_hugepage/{enabled,defrag},
  <root>/sys/dev/block/MAJ:MIN (symlink to the device's directory, whose basename is its
  name; a 'partition' file there means "use the parent directory's disk"),
  <root>/sys/block/<disk>/queue/{scheduler,read_ahead_kb,nr_requests}, <root>/sys/block/<dm>/slaves/,
  <root>/proc/self/mountinfo, <root>/proc/self/limits, <root>/proc/meminfo.
The store's device is stat(store).st_dev (or --device NAME); a store not made yet is
checked on its nearest existing parent directory (the report says so).

Exit codes: 0 everything ok (check) / done (apply, revert);
            1 check found settings to tune, or apply/revert could not write something;
            2 usage error (message says what: store path not a directory, not root,
              bad --root ...).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

STATE_DEFAULT = "var/lib/shmq-sysctl/saved.json"
# where each setting's reasoning is written out (the "source" of an item)
SRC_WRITEBACK = "sysctl/README.md § Page cache and writeback"
SRC_MEMORY = "sysctl/README.md § Memory"
SRC_DISK = "sysctl/README.md § The disk under the store"
SRC_FS = "sysctl/README.md § File system"
SRC_LIMITS = "sysctl/README.md § Process limits"


class UsageError(Exception):
    pass


# ---------------------------------------------------------------- file helpers

def rp(root: str, rel: str) -> str:
    """<root>/<rel> for a path given relative to the system root."""
    return os.path.join(root, rel.lstrip("/"))


def read_text(path: str) -> str | None:
    try:
        with open(path, "r") as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


def parse_int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text.split()[0])
    except (ValueError, IndexError):
        return None


def parse_choice(text: str | None) -> tuple[str | None, list[str]]:
    """'always [madvise] never' -> ('madvise', [always, madvise, never]).
    A file holding one bare word (a plain file in a fake tree) selects that word."""
    if text is None:
        return None, []
    words = text.split()
    selected, options = None, []
    for w in words:
        if w.startswith("[") and w.endswith("]"):
            w = w[1:-1]
            selected = w
        options.append(w)
    if selected is None and len(words) == 1:
        selected = words[0]
    return selected, options


def write_value(path: str, token: str, kind: str) -> None:
    """Write a value the way `echo token > path` does.  For a multiple-choice file
    ('[none] mq-deadline'), a plain file (a fake tree) that now holds just the word is
    re-rendered in the kernel's format, so reads and revert see it as the kernel shows it."""
    before = read_text(path) if kind == "choice" else None
    with open(path, "w") as f:
        f.write(token + "\n")
    if kind == "choice" and before is not None:
        _, options = parse_choice(before)
        back = read_text(path)
        if back is not None and "[" not in back and back.strip() == token and token in options:
            rendered = " ".join(f"[{o}]" if o == token else o for o in options)
            with open(path, "w") as f:
                f.write(rendered + "\n")


# ---------------------------------------------------------------- system facts

def unescape_mount(s: str) -> str:
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\" and i + 4 <= len(s) and s[i + 1:i + 4].isdigit():
            out.append(chr(int(s[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def read_mountinfo(root: str) -> list[dict]:
    text = read_text(rp(root, "proc/self/mountinfo"))
    entries = []
    for line in (text or "").splitlines():
        parts = line.split()
        if " - " not in line or len(parts) < 10:
            continue
        sep = parts.index("-")
        if sep + 3 > len(parts):
            continue
        entries.append({
            "majmin": parts[2],
            "mountpoint": unescape_mount(parts[4]),
            "options": parts[5].split(","),
            "fstype": parts[sep + 1],
            "source": unescape_mount(parts[sep + 2]),
            "super": parts[sep + 3].split(",") if sep + 3 < len(parts) else [],
        })
    return entries


def find_mount(entries: list[dict], store: str) -> dict | None:
    """The mount holding the store: the longest mount point that is a prefix of it
    (the last one mounted wins when several are stacked on the same point)."""
    best = None
    for e in entries:
        mp = e["mountpoint"]
        if store == mp or store.startswith(mp.rstrip("/") + "/") or mp == "/":
            if best is None or len(mp) >= len(best["mountpoint"]):
                best = e
    return best


def _disk_of(root: str, devdir: str) -> str:
    """Directory of a block device -> directory of its whole disk (partitions -> parent)."""
    real = os.path.realpath(devdir)
    if os.path.exists(os.path.join(real, "partition")):
        real = os.path.dirname(real)
    return real


def _leaves(root: str, diskdir: str, depth: int = 0) -> list[str]:
    """Whole disks under a device: itself, or (dm / md) the disks under its slaves/."""
    slaves = os.path.join(diskdir, "slaves")
    names = sorted(os.listdir(slaves)) if os.path.isdir(slaves) else []
    if not names or depth > 8:
        return [os.path.basename(diskdir)]
    out: list[str] = []
    for n in names:
        for leaf in _leaves(root, _disk_of(root, os.path.join(slaves, n)), depth + 1):
            if leaf not in out:
                out.append(leaf)
    return out


def resolve_device(root: str, store: str, mount: dict | None, override: str | None) -> dict:
    """Which block device(s) hold the store.  Returns {majmin, node, top, disks, note}:
    'top' is the device the file system sits on (its read_ahead_kb governs the store's
    reads); 'disks' are the real disks below it (scheduler, nr_requests)."""
    info = {"majmin": None, "node": None, "top": None, "disks": [], "note": None}
    if override:
        d = rp(root, f"sys/block/{override}")
        if not os.path.isdir(d):
            raise UsageError(f"--device {override}: no {d}")
        diskdir = _disk_of(root, d)
        info.update(node=override, top=os.path.basename(diskdir), disks=_leaves(root, diskdir))
        return info
    st = os.stat(store)
    maj, mnr = os.major(st.st_dev), os.minor(st.st_dev)
    info["majmin"] = f"{maj}:{mnr}"
    devdir = rp(root, f"sys/dev/block/{maj}:{mnr}")
    if maj == 0 or not os.path.exists(devdir):
        # anonymous device (tmpfs, overlay, btrfs, NFS...): try the mount's source /dev/X
        src = (mount or {}).get("source", "")
        if src.startswith("/dev/"):
            name = os.path.basename(os.path.realpath(src) if root == "/" else src)
            cand = rp(root, f"sys/class/block/{name}")
            if os.path.exists(cand):
                devdir = cand
        if not os.path.exists(devdir):
            fs = (mount or {}).get("fstype", "?")
            info["note"] = (f"no block device for {maj}:{mnr} (file system {fs}: "
                            "tmpfs/overlay/network or not visible under <root>/sys)")
            return info
    info["node"] = os.path.basename(os.path.realpath(devdir))
    diskdir = _disk_of(root, devdir)
    info["top"] = os.path.basename(diskdir)
    info["disks"] = _leaves(root, diskdir)
    return info


def read_limits(root: str) -> dict[str, tuple[str, str]]:
    """{'nofile': (soft, hard), 'memlock': (soft, hard)} from <root>/proc/self/limits
    (the limits this process inherited, i.e. what a broker started from here gets)."""
    out = {}
    text = read_text(rp(root, "proc/self/limits"))
    for line in (text or "").splitlines():
        for key, label in (("nofile", "Max open files"), ("memlock", "Max locked memory")):
            if line.startswith(label):
                parts = line[len(label):].split()
                if len(parts) >= 2:
                    out[key] = (parts[0], parts[1])
    if not out and os.path.abspath(root) == "/":
        import resource

        def fmt(v):
            return "unlimited" if v == resource.RLIM_INFINITY else str(v)
        for key, r in (("nofile", resource.RLIMIT_NOFILE), ("memlock", resource.RLIMIT_MEMLOCK)):
            try:
                s, h = resource.getrlimit(r)
                out[key] = (fmt(s), fmt(h))
            except (OSError, ValueError):
                pass
    return out


def mem_total_kb(root: str) -> int | None:
    for line in (read_text(rp(root, "proc/meminfo")) or "").splitlines():
        if line.startswith("MemTotal:"):
            return parse_int(line.split(":", 1)[1])
    return None


# ---------------------------------------------------------------- the settings

def item(key, current, recommended, status, why, source, **kw) -> dict:
    d = {"key": key, "current": current, "recommended": recommended, "status": status,
         "why": why, "source": source, "path": None, "device": None, "action": "advice",
         "write": None, "kind": None}
    d.update(kw)
    return d


def _min_free_target(root: str) -> int:
    mem = mem_total_kb(root)
    if not mem:
        return 65536
    return max(65536, min(mem // 100, 1048576))


# (name, recommended, ok(value) , why, source); recommended may be a function of root
VM = [
    ("dirty_background_ratio", 10, lambda v, r: 1 <= v <= 10,
     "kernel writeback starts at this dirty share; start early, in small batches: dirty "
     "pages are memory only and lost on power failure until written", SRC_WRITEBACK),
    ("dirty_ratio", 40, lambda v, r: 30 <= v <= 60,
     "writers block in the page cache at this dirty share (with no clean pages to reclaim, "
     "a write waits while the kernel flushes); keep it well above background", SRC_WRITEBACK),
    ("dirty_writeback_centisecs", 500, lambda v, r: 100 <= v <= 1500,
     "how often the kernel flusher wakes; short periods write steady small batches instead "
     "of bursts that stall the broker's fdatasync", SRC_WRITEBACK),
    ("dirty_expire_centisecs", 3000, lambda v, r: 500 <= v <= 3000,
     "age at which a dirty page must be written: bounds how long data the broker has not "
     "flushed itself lives only in the page cache, which a power cut loses", SRC_WRITEBACK),
    ("swappiness", 1, lambda v, r: 0 <= v <= 10,
     "hot messages must stay in memory (pulls should hit the page cache); swapping turns "
     "pulls into disk faults. 1, not 0: swap stays a last resort", SRC_MEMORY),
    ("max_map_count", 655360, lambda v, r: v >= 262144,
     "every mapped segment file is a memory map in every worker; 65530 makes mmap fail with "
     "ENOMEM on big stores", SRC_MEMORY),
    ("overcommit_memory", 1, lambda v, r: v in (0, 1),
     "mode 2 (strict accounting) refuses large mappings and worker spawns once the commit "
     "limit is hit; 0 (heuristic) or 1 (always) let the broker map its segments", SRC_MEMORY),
    ("min_free_kbytes", _min_free_target, lambda v, r: v >= _min_free_target(r),
     "reserve that makes kswapd reclaim page cache before allocations stall in direct reclaim "
     "(when memory is short, page-cache writes first drop clean pages); ~1% of RAM",
     SRC_MEMORY),
    ("zone_reclaim_mode", 0, lambda v, r: v == 0,
     "non-zero makes a NUMA node evict its own page cache rather than use another node's "
     "free memory: hot messages drop out of the page cache, which pulls should hit",
     SRC_MEMORY),
]

THP = [
    ("enabled", "madvise", ("madvise", "never"),
     "'always' backs the broker's heap with huge pages via khugepaged/compaction stalls; the "
     "store's file mappings gain nothing from THP"),
    ("defrag", "madvise", ("madvise", "never", "defer", "defer+madvise"),
     "'always' compacts memory synchronously on huge-page faults: latency spikes in the "
     "single-threaded reactors"),
]


def vm_items(root: str) -> list[dict]:
    out = []
    for name, rec, ok, why, source in VM:
        rel = f"proc/sys/vm/{name}"
        recv = rec(root) if callable(rec) else rec
        cur = parse_int(read_text(rp(root, rel)))
        status = "unknown" if cur is None else ("ok" if ok(cur, root) else "tune")
        out.append(item(f"vm.{name}", cur, recv, status, why, source, path=rel,
                        action="write", write=str(recv), kind="int"))
    return out


def thp_items(root: str) -> list[dict]:
    out = []
    for name, rec, good, why in THP:
        rel = f"sys/kernel/mm/transparent_hugepage/{name}"
        cur, options = parse_choice(read_text(rp(root, rel)))
        status = "unknown" if cur is None else ("ok" if cur in good else "tune")
        if status == "tune" and options and rec not in options:
            status, why = "unknown", why + f" ({rec} not offered here)"
        out.append(item(f"thp.{name}", cur, rec, status, why, SRC_MEMORY, path=rel,
                        action="write", write=rec, kind="choice"))
    return out


SCHED_WHY = ("deadline sorts and merges the CommitLog's random reads into sequential jumps, "
             "raising read throughput, on SSDs too")
RA_WHY = ("ConsumeQueue and catching-up consumers read sequentially and live off read-ahead; "
          "a huge window wastes I/O and cache on random CommitLog reads")
NR_WHY = ("requests the scheduler can hold to sort and merge; a shallow queue leaves "
          "deadline little to merge")


def block_items(root: str, dev: dict) -> list[dict]:
    if not dev["disks"]:
        note = dev["note"] or "device unknown"
        return [item("block.scheduler", None, "mq-deadline", "unknown", SCHED_WHY + "; " + note,
                     SRC_DISK),
                item("block.read_ahead_kb", None, 128, "unknown", RA_WHY + "; " + note, SRC_DISK),
                item("block.nr_requests", None, 256, "unknown", NR_WHY + "; " + note, SRC_DISK)]
    out = []
    for disk in dev["disks"]:
        rel = f"sys/block/{disk}/queue/scheduler"
        cur, options = parse_choice(read_text(rp(root, rel)))
        want = next((w for w in ("mq-deadline", "deadline") if w in options), None)
        why = SCHED_WHY
        if cur is None:
            status = "unknown"
        elif cur in ("mq-deadline", "deadline"):
            status = "ok"
        elif want:
            status = "tune"
        else:
            status, why = "ok", why + f"; this device offers no deadline ({' '.join(options)})"
        out.append(item("block.scheduler", cur, want or "mq-deadline", status, why, SRC_DISK,
                        path=rel, device=disk, action="write" if want else "advice",
                        write=want, kind="choice"))
    # read-ahead of the device the file system sits on (a dm device's own value counts)
    for disk in [dev["top"]]:
        rel = f"sys/block/{disk}/queue/read_ahead_kb"
        cur = parse_int(read_text(rp(root, rel)))
        status = "unknown" if cur is None else ("ok" if 64 <= cur <= 1024 else "tune")
        out.append(item("block.read_ahead_kb", cur, 128, status, RA_WHY, SRC_DISK, path=rel,
                        device=disk, action="write", write="128", kind="int"))
    for disk in dev["disks"]:
        rel = f"sys/block/{disk}/queue/nr_requests"
        cur = parse_int(read_text(rp(root, rel)))
        status = "unknown" if cur is None else ("ok" if cur >= 128 else "tune")
        out.append(item("block.nr_requests", cur, 256, status, NR_WHY, SRC_DISK, path=rel,
                        device=disk, action="write", write="256", kind="int"))
    return out


def fs_items(mount: dict | None) -> list[dict]:
    why_type = ("ext4 (extents) deletes a 1 GiB expired segment quickly where ext3 (block maps) "
                "spends heavy I/O that times writes out; tmpfs is not durable")
    why_atime = ("without noatime, reading segments dirties inodes (atime): metadata writes and "
                 "journal traffic on a read-heavy store; advice only: remount/fstab")
    why_journal = ("data=journal writes every message twice (journal, then segment); ordered "
                   "(default) or writeback journal metadata only; advice only: fstab")
    if mount is None:
        return [item("fs.type", None, "ext4", "unknown", why_type + "; no mount found", SRC_FS),
                item("fs.atime", None, "noatime", "unknown", why_atime, SRC_FS),
                item("fs.journal", None, "data=ordered", "unknown", why_journal, SRC_FS)]
    fstype = mount["fstype"]
    if fstype in ("ext4", "xfs"):
        st = "ok"
    elif fstype in ("overlay", "fuse", "autofs") or fstype.startswith("fuse."):
        st = "unknown"
    else:
        st = "tune"
    out = [item("fs.type", fstype, "ext4", st, why_type, SRC_FS, device=mount["source"])]
    opts = mount["options"] + mount["super"]
    atime = next((o for o in ("noatime", "relatime", "strictatime") if o in opts), "atime")
    out.append(item("fs.atime", atime, "noatime", "ok" if atime == "noatime" else "tune",
                    why_atime, SRC_FS, device=mount["source"]))
    if fstype == "ext4":
        data = next((o.split("=", 1)[1] for o in opts if o.startswith("data=")), "ordered")
        out.append(item("fs.journal", f"data={data}", "data=ordered",
                        "tune" if data == "journal" else "ok", why_journal, SRC_FS,
                        device=mount["source"]))
    else:
        out.append(item("fs.journal", None, "data=ordered", "unknown",
                        why_journal + f"; {fstype} has no data= modes", SRC_FS))
    return out


def limit_items(root: str) -> list[dict]:
    lim = read_limits(root)
    out = []
    nof = lim.get("nofile")
    if nof is None:
        st, cur = "unknown", None
    else:
        soft = nof[0]
        st = "ok" if soft == "unlimited" or int(soft) >= 65536 else "tune"
        cur = f"{nof[0]}/{nof[1]}"
    out.append(item("limits.nofile", cur, "65536", st,
                    "each connection, open segment and index file takes a descriptor; at 1024 the "
                    "acceptor fails with EMFILE (soft/hard; raise with ulimit -n / LimitNOFILE)",
                    SRC_LIMITS))
    ml = lim.get("memlock")
    out.append(item("limits.memlock", None if ml is None else f"{ml[0]}/{ml[1]}",
                    "unlimited only to lock segments", "unknown" if ml is None else "ok",
                    "shmq never mlocks (no MAP_LOCKED), so any value works; RocketMQ's os.sh sets "
                    "unlimited for its segment warm-up; raise it only to lock segments in RAM",
                    SRC_LIMITS))
    return out


def where_store_goes(store: str) -> tuple[str, str | None]:
    """(the directory whose disk and mount are checked, a note or None).
    A store not made yet (the broker makes it at its first start) is checked
    on the disk that would hold it: its nearest existing parent directory."""
    path = os.path.abspath(store)
    parent = path
    while not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise UsageError(f"--store {store!r}: {parent} is not a directory")
    if parent == path:
        return os.path.realpath(path), None
    parent = os.path.realpath(parent)
    return parent, (f"store {path} does not exist yet: checking {parent}, its nearest "
                    f"existing parent directory, whose disk would hold it")


def gather(root: str, store: str, device: str | None) -> dict:
    if not os.path.isdir(root):
        raise UsageError(f"--root {root!r} is not a directory")
    checked, note = where_store_goes(store)
    mount = find_mount(read_mountinfo(root), checked)
    dev = resolve_device(root, checked, mount, device)
    items = vm_items(root) + thp_items(root) + block_items(root, dev) + fs_items(mount) \
        + limit_items(root)
    summary = {s: sum(1 for i in items if i["status"] == s) for s in ("ok", "tune", "unknown")}
    return {"root": root, "store": checked if note is None else os.path.abspath(store),
            "checked": checked, "note": note, "device": dev,
            "mount": None if mount is None else {k: mount[k] for k in
                                                 ("mountpoint", "fstype", "source", "majmin")},
            "items": items, "summary": summary}


# ---------------------------------------------------------------- commands

def _fmt(v) -> str:
    return "-" if v is None else str(v)


def print_table(report: dict) -> None:
    dev = report["device"]
    if report["note"]:
        print(report["note"])
    print(f"store {report['store']}  root {report['root']}  "
          f"device {dev['node'] or '?'} (disks {','.join(dev['disks']) or '?'})  "
          f"mount {(report['mount'] or {}).get('mountpoint', '?')}")
    rows = [(i["key"] + (f"[{i['device']}]" if i["device"] and i["key"].startswith("block.")
                         else ""), _fmt(i["current"]), _fmt(i["recommended"]), i["status"],
             i["why"]) for i in report["items"]]
    w = [max(len(r[c]) for r in rows + [("setting", "current", "recommended", "status", "")])
         for c in range(4)]
    print(f"{'setting':<{w[0]}}  {'current':<{w[1]}}  {'recommended':<{w[2]}}  "
          f"{'status':<{w[3]}}  why")
    for r in rows:
        print(f"{r[0]:<{w[0]}}  {r[1]:<{w[1]}}  {r[2]:<{w[2]}}  {r[3]:<{w[3]}}  {r[4]}")
    s = report["summary"]
    print(f"{s['ok']} ok, {s['tune']} to tune, {s['unknown']} unknown")


def cmd_check(args) -> int:
    report = gather(args.root, args.store, args.device)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_table(report)
    return 1 if report["summary"]["tune"] else 0


def state_path(args) -> str:
    return args.state or rp(args.root, STATE_DEFAULT)


def require_root(args) -> None:
    if args.assume_root:
        if os.path.abspath(args.root) == "/":
            raise UsageError("--assume-root is only for fake trees (--root other than /)")
        return
    if os.geteuid() != 0:
        raise UsageError(f"{args.cmd} --yes needs root (euid 0); run it with sudo, "
                         "or leave out --yes for a dry run")


def load_state(path: str) -> dict | None:
    text = read_text(path)
    if text is None:
        return None
    try:
        st = json.loads(text)
        assert isinstance(st.get("saved"), list)
        return st
    except (ValueError, AssertionError, AttributeError):
        raise UsageError(f"state file {path} is not a shmq-sysctl state file")


def save_state(path: str, state: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(state, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


ALLOWED = ("proc/sys/vm/", "sys/kernel/mm/transparent_hugepage/", "sys/block/")


def cmd_apply(args) -> int:
    report = gather(args.root, args.store, args.device)
    plan = [i for i in report["items"] if i["status"] == "tune" and i["action"] == "write"]
    advice = [i for i in report["items"] if i["status"] == "tune" and i["action"] == "advice"]
    out = {"mode": "apply" if args.yes else "dry-run", "state": state_path(args),
           "writes": [], "errors": [],
           "advice": [{"key": i["key"], "current": i["current"],
                       "recommended": i["recommended"], "why": i["why"]} for i in advice]}
    if args.yes:
        require_root(args)
        spath = state_path(args)
        state = load_state(spath) or {"version": 1, "root_note": "paths are relative to --root",
                                      "saved": []}
        known = {e["path"] for e in state["saved"]}
        for i in plan:  # save the previous values before writing anything
            if i["path"] not in known:
                raw = read_text(rp(args.root, i["path"]))
                prev = parse_choice(raw)[0] if i["kind"] == "choice" else (raw or "").strip()
                state["saved"].append({"key": i["key"], "path": i["path"], "kind": i["kind"],
                                       "raw": raw, "value": prev})
        if plan:
            save_state(spath, state)
    for i in plan:
        path = rp(args.root, i["path"])
        entry = {"key": i["key"], "device": i["device"], "path": path,
                 "from": i["current"], "to": i["write"]}
        if args.yes:
            # re-read: an earlier write (the scheduler) may already have changed it
            raw = read_text(path)
            now = parse_choice(raw)[0] if i["kind"] == "choice" else (raw or "").strip()
            if now == i["write"]:
                continue
            try:
                write_value(path, i["write"], i["kind"])
            except OSError as e:
                entry["error"] = str(e)
                out["errors"].append(entry)
                continue
        out["writes"].append(entry)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        verb = "wrote" if args.yes else "would write"
        for w in out["writes"]:
            print(f"{verb} {w['path']}: {_fmt(w['from'])} -> {w['to']}")
        for e in out["errors"]:
            print(f"FAILED {e['path']}: {e['error']}", file=sys.stderr)
        if not out["writes"] and not out["errors"]:
            print("nothing to write: every setting apply manages is already right")
        for a in out["advice"]:
            print(f"advice (not applied) {a['key']}: {_fmt(a['current'])} -> "
                  f"{a['recommended']}: {a['why']}")
        if args.yes and plan:
            print(f"previous values saved in {out['state']}")
        elif not args.yes and plan:
            print("dry run: nothing written; add --yes (as root) to apply")
    return 1 if out["errors"] else 0


def cmd_revert(args) -> int:
    spath = state_path(args)
    state = load_state(spath)
    out = {"mode": "revert" if args.yes else "dry-run", "state": spath, "writes": [],
           "errors": []}
    if args.yes:
        require_root(args)
    for e in (state or {"saved": []})["saved"]:
        rel = e["path"]
        if ".." in rel.split("/") or not rel.startswith(ALLOWED):
            out["errors"].append({"path": rel, "error": "not a path shmq-sysctl writes"})
            continue
        path = rp(args.root, rel)
        raw = read_text(path)
        if raw == e["raw"]:
            continue
        now = parse_choice(raw)[0] if e["kind"] == "choice" else (raw or "").strip()
        entry = {"key": e["key"], "path": path, "from": now, "to": e["value"]}
        if args.yes and now != e["value"]:
            try:
                write_value(path, e["value"], e["kind"])
            except OSError as err:
                entry["error"] = str(err)
                out["errors"].append(entry)
                continue
        if now != e["value"]:
            out["writes"].append(entry)
    if args.yes and state is not None and not out["errors"]:
        os.unlink(spath)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        if state is None:
            print(f"nothing to revert: no state file {spath}")
        verb = "restored" if args.yes else "would restore"
        for w in out["writes"]:
            print(f"{verb} {w['path']}: {_fmt(w['from'])} -> {w['to']}")
        for e in out["errors"]:
            print(f"FAILED {e['path']}: {e['error']}", file=sys.stderr)
        if state is not None and args.yes and not out["errors"]:
            print(f"removed {spath}")
        elif state is not None and not args.yes:
            print("dry run: nothing written; add --yes (as root) to revert")
    return 1 if out["errors"] else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tune.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    default_store = os.environ.get("SHMQ_STORE", os.path.join(os.path.expanduser("~"), "store"))
    for name in ("check", "apply", "revert"):
        s = sub.add_parser(name)
        s.add_argument("--root", default="/", help="system root prefix (a fake tree in tests)")
        s.add_argument("--json", action="store_true", help="machine-readable output")
        if name != "revert":
            s.add_argument("--store", default=default_store,
                           help="store directory (default $SHMQ_STORE or ~/store)")
            s.add_argument("--device", help="block device name under <root>/sys/block "
                                            "instead of stat(store).st_dev")
        if name != "check":
            s.add_argument("--yes", action="store_true", help="really write (needs root)")
            s.add_argument("--state", help=f"state file (default <root>/{STATE_DEFAULT})")
            s.add_argument("--assume-root", action="store_true",
                           help="skip the euid check; only allowed with --root other than /")
    try:
        args = p.parse_args(argv)
        return {"check": cmd_check, "apply": cmd_apply, "revert": cmd_revert}[args.cmd](args)
    except UsageError as e:
        print(f"tune.py: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
