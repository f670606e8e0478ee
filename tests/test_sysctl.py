"""sysctl/tune.py against a fake /proc + /sys tree (no root needed), and `check` for real."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TUNE = REPO / "sysctl" / "tune.py"

spec = importlib.util.spec_from_file_location("shmq_sysctl_tune", TUNE)
tune = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tune)

SETTINGS = {
    "vm.dirty_background_ratio", "vm.dirty_ratio", "vm.dirty_writeback_centisecs",
    "vm.dirty_expire_centisecs", "vm.swappiness", "vm.max_map_count", "vm.overcommit_memory",
    "vm.min_free_kbytes", "vm.zone_reclaim_mode", "thp.enabled", "thp.defrag",
    "block.scheduler", "block.read_ahead_kb", "block.nr_requests", "fs.type", "fs.atime",
    "fs.journal", "limits.nofile", "limits.memlock",
}

VM = {"dirty_background_ratio": "50", "dirty_ratio": "20", "dirty_writeback_centisecs": "500",
      "dirty_expire_centisecs": "3000", "swappiness": "60", "max_map_count": "65530",
      "overcommit_memory": "2", "min_free_kbytes": "67584", "zone_reclaim_mode": "1"}
QUEUE = {"scheduler": "[none] mq-deadline kyber bfq", "read_ahead_kb": "4096",
         "nr_requests": "64"}

# what apply must leave behind, relative to the fake root
EXPECTED = {
    "proc/sys/vm/dirty_background_ratio": "10\n",
    "proc/sys/vm/swappiness": "1\n",
    "proc/sys/vm/max_map_count": "655360\n",
    "proc/sys/vm/overcommit_memory": "1\n",
    "proc/sys/vm/min_free_kbytes": "160000\n",   # 1% of MemTotal 16000000 kB
    "proc/sys/vm/zone_reclaim_mode": "0\n",
    "proc/sys/vm/dirty_ratio": "40\n",
    "sys/kernel/mm/transparent_hugepage/enabled": "always [madvise] never\n",
    "sys/kernel/mm/transparent_hugepage/defrag": "always defer defer+madvise [madvise] never\n",
    "sys/block/vda/queue/scheduler": "none [mq-deadline] kyber bfq\n",
    "sys/block/vda/queue/read_ahead_kb": "128\n",
    "sys/block/vda/queue/nr_requests": "256\n",
}


def w(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def majmin(p: Path) -> str:
    st = os.stat(p)
    return f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"


def make_queue(root: Path, disk: str) -> None:
    for k, v in QUEUE.items():
        w(root / f"sys/block/{disk}/queue/{k}", v + "\n")


@pytest.fixture
def fake(tmp_path):
    """A fake system: the store sits on partition vda1 of disk vda (ext4, relatime);
    an unrelated disk vdb (mounted on /) has the same untuned queue settings."""
    root, store = tmp_path / "root", tmp_path / "store"
    store.mkdir()
    for k, v in VM.items():
        w(root / f"proc/sys/vm/{k}", v + "\n")
    w(root / "proc/meminfo", "MemTotal:       16000000 kB\nMemFree:  1000 kB\n")
    w(root / "sys/kernel/mm/transparent_hugepage/enabled", "[always] madvise never\n")
    w(root / "sys/kernel/mm/transparent_hugepage/defrag",
      "[always] defer defer+madvise madvise never\n")
    make_queue(root, "vda")
    make_queue(root, "vdb")
    w(root / "sys/block/vda/vda1/partition", "1\n")
    (root / "sys/dev/block").mkdir(parents=True)
    os.symlink("../../block/vda/vda1", root / f"sys/dev/block/{majmin(store)}")
    w(root / "proc/self/mountinfo",
      "1 0 253:16 / / rw,noatime shared:1 - ext4 /dev/vdb rw,data=journal\n"
      f"27 1 {majmin(store)} / {store} rw,relatime shared:2 - ext4 /dev/vda1 rw,data=ordered\n"
      "28 1 253:17 / /other rw,noatime - xfs /dev/vdc rw\n")
    w(root / "proc/self/limits",
      "Limit                     Soft Limit           Hard Limit           Units\n"
      "Max open files            1024                 4096                 files\n"
      "Max locked memory         65536                65536                bytes\n")
    return root, store


def run(*args, root=None, store=None, check=None):
    cmd = [sys.executable, str(TUNE), *args]
    if root is not None:
        cmd += ["--root", str(root)]
    if store is not None:
        cmd += ["--store", str(store)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if check is not None:
        assert p.returncode == check, (p.returncode, p.stdout, p.stderr)
    return p


def snapshot(root: Path) -> dict[str, bytes]:
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = Path(dirpath) / f
            if not p.is_symlink():
                out[str(p.relative_to(root))] = p.read_bytes()
    return out


def by_key(report):
    return {i["key"]: i for i in report["items"]}


def test_check_reports_every_setting(fake):
    root, store = fake
    before = snapshot(root)
    p = run("check", "--json", root=root, store=store, check=1)   # 1: settings to tune
    rep = json.loads(p.stdout)
    items = by_key(rep)
    assert set(items) == SETTINGS
    readme = (REPO / "sysctl" / "README.md").read_text()
    for i in rep["items"]:
        assert i["status"] in ("ok", "tune", "unknown")
        assert i["recommended"] is not None and i["why"] and i["source"]
        # every source is a section of a file in this repository
        path, _, section = i["source"].partition(" § ")
        assert path == "sysctl/README.md" and f"### {section}\n" in readme, i["source"]
        assert "§" not in i["why"], i["why"]
    assert rep["device"]["node"] == "vda1" and rep["device"]["disks"] == ["vda"]
    assert rep["mount"]["mountpoint"] == str(store)
    assert items["vm.swappiness"] == {**items["vm.swappiness"], "current": 60,
                                      "recommended": 1, "status": "tune"}
    assert items["vm.dirty_writeback_centisecs"]["status"] == "ok"
    assert items["vm.min_free_kbytes"]["recommended"] == 160000
    assert items["thp.enabled"]["current"] == "always"
    s = items["block.scheduler"]
    assert (s["current"], s["recommended"], s["status"], s["device"]) == \
        ("none", "mq-deadline", "tune", "vda")
    assert (items["block.read_ahead_kb"]["current"], items["block.nr_requests"]["current"]) \
        == (4096, 64)
    assert (items["fs.type"]["current"], items["fs.type"]["status"]) == ("ext4", "ok")
    assert (items["fs.atime"]["current"], items["fs.atime"]["status"]) == ("relatime", "tune")
    # the journal mode is the store's mount's (ordered), not / 's (journal, on vdb)
    assert (items["fs.journal"]["current"], items["fs.journal"]["status"]) == \
        ("data=ordered", "ok")
    assert (items["limits.nofile"]["current"], items["limits.nofile"]["status"]) == \
        ("1024/4096", "tune")
    assert items["limits.memlock"]["current"] == "65536/65536"
    assert snapshot(root) == before

    human = run("check", root=root, store=store, check=1).stdout
    for key in SETTINGS:
        assert key in human


def test_dry_run_writes_nothing(fake):
    root, store = fake
    before = snapshot(root)
    p = run("apply", "--json", root=root, store=store, check=0)
    out = json.loads(p.stdout)
    assert out["mode"] == "dry-run"
    planned = {os.path.relpath(x["path"], root): x["to"] for x in out["writes"]}
    assert planned == {k: v.split("[")[-1].split("]")[0].strip() if "[" in v else v.strip()
                       for k, v in EXPECTED.items()}
    assert {a["key"] for a in out["advice"]} == {"fs.atime", "limits.nofile"}
    assert snapshot(root) == before
    assert not (root / tune.STATE_DEFAULT).exists()
    assert "would write" in run("apply", root=root, store=store, check=0).stdout


def test_apply_is_exact_idempotent_and_revert_restores_bytes(fake):
    root, store = fake
    before = snapshot(root)
    p = run("apply", "--yes", "--assume-root", "--json", root=root, store=store, check=0)
    out = json.loads(p.stdout)
    assert out["errors"] == []
    after = snapshot(root)
    state_rel = tune.STATE_DEFAULT
    changed = {k for k in after if after[k] != before.get(k)} - {state_rel}
    assert changed == set(EXPECTED)                      # exactly the recommended files
    for rel, text in EXPECTED.items():
        assert (root / rel).read_text() == text, rel
    for k in QUEUE:                                      # vdb does not hold the store
        assert after[f"sys/block/vdb/queue/{k}"] == before[f"sys/block/vdb/queue/{k}"]
    state = json.loads((root / state_rel).read_text())
    saved = {e["path"]: e for e in state["saved"]}
    assert set(saved) == set(EXPECTED)
    for rel, e in saved.items():
        assert e["raw"].encode() == before[rel]
    assert saved["sys/block/vda/queue/scheduler"]["value"] == "none"

    # the store's settings now check out (only advice items remain)
    items = by_key(json.loads(run("check", "--json", root=root, store=store).stdout))
    assert {k for k, i in items.items() if i["status"] == "tune"} == {"fs.atime", "limits.nofile"}

    # second apply: writes nothing, keeps the first saved values
    p2 = run("apply", "--yes", "--assume-root", "--json", root=root, store=store, check=0)
    assert json.loads(p2.stdout)["writes"] == []
    assert snapshot(root) == after

    # revert dry run writes nothing; revert --yes restores every byte and drops the state
    assert len(json.loads(run("revert", "--json", root=root, check=0).stdout)["writes"]) == 12
    assert snapshot(root) == after
    p3 = run("revert", "--yes", "--assume-root", "--json", root=root, check=0)
    assert len(json.loads(p3.stdout)["writes"]) == 12
    assert not (root / state_rel).exists()
    final = snapshot(root)
    assert final == before
    # revert again: nothing to do
    p4 = run("revert", "--yes", "--assume-root", root=root, check=0)
    assert "nothing to revert" in p4.stdout
    assert snapshot(root) == before


def test_explicit_state_path_and_partial_tuning(fake, tmp_path):
    root, store = fake
    (root / "proc/sys/vm/swappiness").write_text("1\n")   # already right: not saved
    state = tmp_path / "elsewhere" / "s.json"
    run("apply", "--yes", "--assume-root", "--state", str(state), root=root, store=store,
        check=0)
    saved = {e["path"] for e in json.loads(state.read_text())["saved"]}
    assert "proc/sys/vm/swappiness" not in saved and "proc/sys/vm/dirty_ratio" in saved
    assert not (root / tune.STATE_DEFAULT).exists()
    run("revert", "--yes", "--assume-root", "--state", str(state), root=root, check=0)
    assert (root / "proc/sys/vm/dirty_ratio").read_text() == "20\n"
    assert (root / "proc/sys/vm/swappiness").read_text() == "1\n"


def test_a_store_not_made_yet_is_checked_on_its_nearest_parent(fake):
    root, store = fake
    missing = store / "not" / "yet"
    rep = json.loads(run("check", "--json", root=root, store=missing, check=1).stdout)
    assert (rep["store"], rep["checked"]) == (str(missing), str(store))
    assert str(store) in rep["note"] and "does not exist" in rep["note"]
    assert rep["device"]["node"] == "vda1" and rep["mount"]["mountpoint"] == str(store)
    human = run("check", root=root, store=missing, check=1).stdout
    assert human.splitlines()[0] == rep["note"]
    assert "block.scheduler" in human
    # the default store, ~/store, before the broker's first start
    home = store.parent / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "SHMQ_STORE"}
    p = subprocess.run([sys.executable, str(TUNE), "check", "--json", "--root", str(root)],
                       capture_output=True, text=True, timeout=60, env={**env, "HOME": str(home)})
    assert p.returncode == 1, p.stderr
    rep = json.loads(p.stdout)
    assert (rep["store"], rep["checked"]) == (str(home / "store"), str(home))


def test_usage_errors(fake, tmp_path):
    root, store = fake
    (tmp_path / "a-file").write_text("")
    for bad in (tmp_path / "a-file", tmp_path / "a-file" / "store"):
        p = run("check", root=root, store=bad, check=2)
        assert "a-file is not a directory" in p.stderr
    p = run("apply", "--yes", "--assume-root", root="/", store=store, check=2)
    assert "--assume-root" in p.stderr
    p = run("revert", "--yes", "--assume-root", root="/", check=2)
    assert "--assume-root" in p.stderr
    if os.geteuid() != 0:
        p = run("apply", "--yes", root=root, store=store, check=2)
        assert "root" in p.stderr
    p = run("check", "--device", "nope", root=root, store=store, check=2)
    assert "nope" in p.stderr
    p = run("frobnicate", check=2)


def test_scheduler_choice_parsing():
    assert tune.parse_choice("[none] mq-deadline kyber bfq\n") == \
        ("none", ["none", "mq-deadline", "kyber", "bfq"])
    assert tune.parse_choice("mq-deadline\n")[0] == "mq-deadline"
    assert tune.parse_choice(None) == (None, [])


@pytest.mark.parametrize("line,want", [
    ("[none] mq-deadline", "mq-deadline"),
    ("mq-deadline kyber [none]", "mq-deadline"),
    ("noop [cfq] deadline", "deadline"),            # legacy single-queue kernels
])
def test_scheduler_prefers_deadline(fake, line, want):
    root, store = fake
    (root / "sys/block/vda/queue/scheduler").write_text(line + "\n")
    s = by_key(json.loads(run("check", "--json", root=root, store=store).stdout))
    assert (s["block.scheduler"]["status"], s["block.scheduler"]["recommended"]) == ("tune", want)
    run("apply", "--yes", "--assume-root", root=root, store=store, check=0)
    assert tune.parse_choice((root / "sys/block/vda/queue/scheduler").read_text())[0] == want


def test_no_deadline_offered_is_left_alone(fake):
    root, store = fake
    (root / "sys/block/vda/queue/scheduler").write_text("[none]\n")
    items = by_key(json.loads(run("check", "--json", root=root, store=store).stdout))
    assert items["block.scheduler"]["status"] == "ok"
    out = json.loads(run("apply", "--json", root=root, store=store).stdout)
    assert not any(x["key"] == "block.scheduler" for x in out["writes"])


def test_device_mapper_and_nvme(fake):
    root, store = fake
    link = root / f"sys/dev/block/{majmin(store)}"
    # store on dm-0 built on nvme0n1p2: read-ahead of dm-0, scheduler/nr_requests of nvme0n1
    make_queue(root, "nvme0n1")
    w(root / "sys/block/nvme0n1/nvme0n1p2/partition", "2\n")
    make_queue(root, "dm-0")
    (root / "sys/block/dm-0/slaves").mkdir()
    os.symlink(root / "sys/block/nvme0n1/nvme0n1p2", root / "sys/block/dm-0/slaves/nvme0n1p2")
    link.unlink()
    os.symlink("../../block/dm-0", link)
    rep = json.loads(run("check", "--json", root=root, store=store).stdout)
    assert rep["device"]["top"] == "dm-0" and rep["device"]["disks"] == ["nvme0n1"]
    devs = {(i["key"], i["device"]) for i in rep["items"] if i["key"].startswith("block.")}
    assert devs == {("block.scheduler", "nvme0n1"), ("block.read_ahead_kb", "dm-0"),
                    ("block.nr_requests", "nvme0n1")}
    before = snapshot(root)
    run("apply", "--yes", "--assume-root", root=root, store=store, check=0)
    after = snapshot(root)
    changed = {k for k in after if after[k] != before.get(k)}
    assert {k for k in changed if k.startswith("sys/block/")} == {
        "sys/block/nvme0n1/queue/scheduler", "sys/block/nvme0n1/queue/nr_requests",
        "sys/block/dm-0/queue/read_ahead_kb"}
    # --device overrides stat(store): only vdb is looked at then
    rep = json.loads(run("check", "--json", "--device", "vdb", root=root, store=store).stdout)
    assert rep["device"]["disks"] == ["vdb"]


def test_no_block_device_is_unknown_not_a_crash(fake):
    """tmpfs/overlay: no <root>/sys/dev/block entry and no mount line for the store."""
    root, store = fake
    (root / f"sys/dev/block/{majmin(store)}").unlink()
    (root / "proc/self/mountinfo").write_text("")
    (root / "proc/self/limits").unlink()
    (root / "sys/kernel/mm/transparent_hugepage/defrag").unlink()
    before = snapshot(root)
    rep = json.loads(run("check", "--json", root=root, store=store).stdout)
    items = by_key(rep)
    assert set(items) == SETTINGS
    for k in ("block.scheduler", "block.read_ahead_kb", "block.nr_requests", "fs.type",
              "limits.nofile", "thp.defrag"):
        assert items[k]["status"] == "unknown" and items[k]["current"] is None, k
    run("apply", "--yes", "--assume-root", root=root, store=store, check=0)
    after = snapshot(root)
    assert not any(k.startswith("sys/block/") and after[k] != before[k] for k in before)


def test_check_for_real_against_this_machine():
    """Whatever this machine has: no crash, every setting reported, nothing written."""
    p = run("check", "--json", root="/", store=REPO)
    assert p.returncode in (0, 1), p.stderr
    rep = json.loads(p.stdout)
    assert set(by_key(rep)) >= SETTINGS
    for i in rep["items"]:
        assert i["status"] in ("ok", "tune", "unknown") and i["why"]
    assert p.returncode == (1 if rep["summary"]["tune"] else 0)
    human = run("check", root="/", store=REPO)
    assert human.returncode == p.returncode and "block.scheduler" in human.stdout


def test_apply_yes_needs_root(fake, monkeypatch, capsys):
    root, store = fake
    before = snapshot(root)
    monkeypatch.setattr(tune.os, "geteuid", lambda: 1000)
    assert tune.main(["apply", "--yes", "--root", str(root), "--store", str(store)]) == 2
    assert tune.main(["revert", "--yes", "--root", str(root)]) == 2
    assert "needs root (euid 0)" in capsys.readouterr().err
    assert snapshot(root) == before
