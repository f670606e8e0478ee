"""Disk full without loss (issue 15, point 4): above diskSpaceWarningLevelRatio
percent the flusher publishes ``disk_full`` and sends are refused with
SERVICE_NOT_AVAILABLE and RocketMQ's remark, before the OS says ENOSPC; pulls
go on. No full disk is needed: the ratio is set below what the disk under the
test's temp directory already uses."""
from __future__ import annotations

import errno
import logging
import os
import threading

import pytest

from brokerproc import BrokerProc, broker_conf
from conftest import SMALL_SEGMENT, small_config
from shmq.broker.flusher import PREPARE_RETRY_S, Flusher
from shmq.client.remoting import RemotingClient
from shmq.client.requests import create_topic, decode_records, pull_message, send_batch, send_message
from shmq.core.config import StoreConfig
from shmq.core.records import encode
from shmq.core.retention import disk_full_remark
from shmq.core.store import open_local
from shmq.ipc.codes import RequestCode as RC
from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.remoting import RemotingCommand


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def disk_used_percent(path) -> float:
    st = os.statvfs(path)
    return 100 * (st.f_blocks - st.f_bfree) / st.f_blocks


def test_the_warning_level_is_a_percent_and_the_remark_is_rocketmqs(store_dir):
    for bad in (0, 101):
        with pytest.raises(ValueError, match="diskSpaceWarningLevelRatio"):
            small_config(store_dir, diskSpaceWarningLevelRatio=bad)
    assert StoreConfig(storePathRootDir=store_dir).diskSpaceWarningLevelRatio == 90
    assert StoreConfig(storePathRootDir=store_dir).cleanFileForciblyEnable is False
    assert disk_full_remark(0.912) == (
        "service not available now. It may be caused by one of the following reasons: the "
        "broker's disk is full [CL:  0.91 CQ:  0.91 INDEX:  0.91], messages are put to the slave, "
        "message store has been shut down, etc.")


def test_the_flusher_publishes_disk_full_and_clears_it(store_dir, caplog):
    if disk_used_percent(store_dir) <= 1:
        pytest.skip("the disk under the temp directory is (almost) empty")
    store, _ = open_local(small_config(store_dir, diskSpaceWarningLevelRatio=1))
    f = Flusher(store, cb=None, clock=Clock())
    with caplog.at_level(logging.WARNING, "shmq.flusher"):
        f.step()
    full = store.state.get("disk_full")
    assert full > 100 and abs(full / 100 - disk_used_percent(store_dir)) < 2
    assert "sends are refused" in caplog.text and "diskSpaceWarningLevelRatio 1%" in caplog.text
    store2, _ = open_local(small_config(store_dir + "2", diskSpaceWarningLevelRatio=100))
    f2 = Flusher(store2, cb=None, clock=Clock())
    store2.state.set("disk_full", 9000)             # as a previous flusher left it
    caplog.clear()
    with caplog.at_level(logging.WARNING, "shmq.flusher"):
        f2.step()
    assert store2.state.get("disk_full") == 0 and "accepted again" in caplog.text


def test_enospc_preparing_the_next_segment_is_a_warning_and_is_retried(store_dir, caplog,
                                                                      monkeypatch):
    store, _ = open_local(small_config(store_dir))
    clock = Clock()
    f = Flusher(store, cb=None, clock=clock)
    calls = []

    def no_space(path, size, sparse=False):
        calls.append(path)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

    died = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args))
    store.append(encode("F", [b"x" * (SMALL_SEGMENT // 2 + 100)], properties=b""))
    monkeypatch.setattr(store.cl.files, "create_preallocated", no_space)
    with caplog.at_level(logging.WARNING, "shmq.flusher"):
        f.step()
        f._preparing.join()
    nxt = os.path.join(store_dir, "commitlog", f"{SMALL_SEGMENT:020d}")
    assert calls == [nxt] and not died
    rec = [r for r in caplog.records if "next CommitLog segment" in r.getMessage()]
    assert len(rec) == 1 and rec[0].levelno == logging.WARNING
    assert nxt in rec[0].getMessage() and store_dir in rec[0].getMessage()
    assert "No space left on device" in rec[0].getMessage()
    f.step()                                        # not at once ...
    assert len(calls) == 1
    clock.t += PREPARE_RETRY_S
    monkeypatch.undo()
    f.step()                                        # ... but later, and then it works
    f._preparing.join()
    assert os.path.getsize(nxt) == SMALL_SEGMENT


def test_a_full_disk_refuses_sends_with_code_14_serves_pulls_and_recovers(tmp_path):
    if disk_used_percent(str(tmp_path)) <= 1:
        pytest.skip("the disk under the temp directory is (almost) empty")
    conf = broker_conf(tmp_path)
    topic = "DiskFull"
    with BrokerProc(tmp_path, conf).start() as b:
        with RemotingClient(b.addr) as c:
            assert c.invoke(create_topic(topic, 1)).code == R.SUCCESS
            for i in range(3):
                assert c.invoke(send_message(topic, f"m{i}".encode(), queue_id=0)).code == R.SUCCESS
        assert b.stop() == 0
    full = BrokerProc(tmp_path, {**conf, "diskSpaceWarningLevelRatio": "1"})
    with full.start() as b:
        with RemotingClient(b.addr) as c:
            r = c.invoke(send_message(topic, b"refused", queue_id=0))
            assert r.code == R.SERVICE_NOT_AVAILABLE
            assert r.remark.startswith("service not available now. It may be caused by one of "
                                       "the following reasons: the broker's disk is full [CL: ")
            r = c.invoke(send_batch(topic, [(b"b1", ""), (b"b2", "")], queue_id=0))
            assert r.code == R.SERVICE_NOT_AVAILABLE and "disk is full" in r.remark
            r = c.invoke(pull_message(topic, 0, 0))
            assert r.code == R.SUCCESS
            stored = decode_records(r.body)
            assert [m.body for m in stored] == [b"m0", b"m1", b"m2"]
            # a consumer's send-back writes to %RETRY%: refused the same way
            r = c.invoke(RemotingCommand(RC.CONSUMER_SEND_MSG_BACK, ext={
                "group": "DiskFullGroup", "offset": str(stored[0].phy_offset), "delayLevel": "0",
                "originTopic": topic, "maxReconsumeTimes": "16"}))
            assert r.code == R.SERVICE_NOT_AVAILABLE and "disk is full" in r.remark
        assert b.stop() == 0
        log = b.log()
        assert "WARNING" in log and "diskSpaceWarningLevelRatio 1%: sends are refused" in log
    with BrokerProc(tmp_path, conf).start() as b:                     # the setting allows it
        with RemotingClient(b.addr) as c:
            r = c.invoke(send_message(topic, b"m3", queue_id=0))
            assert r.code == R.SUCCESS and r.ext["queueOffset"] == "3"


# a script's lines that take every block of the tmpfs mounted at ``root``
# (the file stays open as ``fd``; unlinking it makes room again)
_FILL_DISK = r'''fd = os.open(root + "/filler", os.O_WRONLY | os.O_CREAT)
try:
    while True:
        os.write(fd, b"\1" * 4096)                  # every block of the file system taken
except OSError as e:
    assert e.errno == errno.ENOSPC, e
'''

_FULL_TMPFS = r'''
import errno, os, sys
from shmq.core.config import StoreConfig
from shmq.core.records import encode
from shmq.core.store import open_local
root = sys.argv[1]
if os.system(f"mount -t tmpfs -o size=4m none {root}") != 0:
    print("no mount"); sys.exit(0)
cfg = StoreConfig(storePathRootDir=root + "/store", mappedFileSizeCommitLog=1 << 20,
                  maxMessageSize=8192, mappedFileSizeConsumeQueue=300_000 * 20)
store, _ = open_local(cfg)
store.append(encode("T", [b"before"], properties=b""))
''' + _FILL_DISK + r'''failed = None
for i in range(3000):                 # past the pages the queue has (a page: 204.8 units)
    try:
        store.append(encode("T", [b"m%d" % i], properties=b""))
    except OSError as e:
        failed = (i, errno.errorcode[e.errno])
        break
os.close(fd)
os.unlink(root + "/filler")                         # room again: the next append is stored
store.append(encode("T", [b"after"], properties=b""))
bodies = [m.body for m in store.read_queue("T", 0)]
print("failed", failed, "stored", len(bodies), bodies[0], bodies[-1], flush=True)
'''


def in_full_tmpfs(tmp_path, script: str, *args) -> str:
    """Run ``script`` (python -c) with a mount point (argv[1], then
    ``args``) in a mount namespace of its own, where it mounts its tiny
    tmpfs; its stdout. Skipped where there is no unshare or no mount."""
    import shutil
    import subprocess
    import sys
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed: no mount namespace for a tiny tmpfs")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    p = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, "-c",
                        script, str(mnt), *map(str, args)],
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0 and "unshare failed" in p.stderr or "no mount" in p.stdout:
        pytest.skip(f"no mount namespace with a tmpfs here: {p.stderr.strip() or p.stdout.strip()}")
    assert p.returncode == 0, f"exit {p.returncode} (-7 or 135: SIGBUS)\n{p.stdout}\n{p.stderr}"
    return p.stdout


def test_a_full_disk_under_the_consumequeue_is_enospc_not_a_bus_error(tmp_path):
    """ConsumeQueue files are sparse and written through their mapping: a
    unit stored into a page with no block on a full disk was a SIGBUS that
    killed the writer (a worker, the HA slave) with no message. Pages get
    their blocks ahead (fallocate), so the append is refused with ENOSPC, its
    claim rolled back, and the store goes on once there is room. A real full
    file system: a 4 MiB tmpfs in a mount namespace of the test's own."""
    out = in_full_tmpfs(tmp_path, _FULL_TMPFS)
    failed, stored = out.split(" stored ")
    i = int(failed.split("(")[1].split(",")[0])
    assert failed.endswith("'ENOSPC')") and 0 < i < 3000, out   # refused, not killed
    # every append before it, and the one after the room came back, stored once, in order
    assert stored.strip() == f"{i + 2} b'before' b'after'", out


_FULL_TMPFS_SLAVE = r'''
import errno, os, sys
from shmq.core.config import StoreConfig
from shmq.core.records import encode
from shmq.core.replica import Replica
from shmq.core.store import open_local
root, master_root = sys.argv[1], sys.argv[2]
def cfg(path):
    return StoreConfig(storePathRootDir=path, mappedFileSizeCommitLog=1 << 20, maxMessageSize=8192,
                       mappedFileSizeConsumeQueue=300_000 * 20)
m, _ = open_local(cfg(master_root))
for i in range(3000):
    m.append(encode("T", [b"m%d" % i], properties=b""))
end = m.state.write_pos
if os.system(f"mount -t tmpfs -o size=4m none {root}") != 0:
    print("no mount"); sys.exit(0)
s, _ = open_local(cfg(root + "/store"))
r = Replica(s)
pos = 0
while pos < 4096:                       # a few records first: the queue's file and first page
    r.append(pos, m.cl.read(pos, 512))
    pos += 512
''' + _FILL_DISK + r'''failed = None
while pos < end:                                    # as a slave catching up: 4 KiB reads
    n = min(4096, end - pos)
    try:
        r.append(pos, m.cl.read(pos, n))
    except OSError as e:
        failed = (pos, errno.errorcode[e.errno])
        break
    pos += n
os.close(fd)
os.unlink(root + "/filler")                         # room again: what arrived is dispatched
if failed is not None:
    r.dispatch()
    while r.received < end:
        n = min(4096, end - r.received)
        r.append(r.received, m.cl.read(r.received, n))
bodies = [x.body for x in s.read_queue("T", 0)]
print("failed", failed, "stored", len(bodies), bodies[0], bodies[-1], s.state.write_pos == end,
      flush=True)
'''


def test_a_slave_on_a_full_disk_gets_enospc_dispatching_not_a_bus_error(tmp_path):
    """A slave (``core.replica``) writes the units of the records it
    receives as recovery does, through the ConsumeQueue mapping: on a full
    disk a unit stored into a hole page killed the HA process with SIGBUS.
    Now its pages get blocks first: ENOSPC, which the HA client answers by
    dropping the connection and trying again later (``broker/ha/slave.py``);
    once there is room, what arrived is dispatched and the slave goes on."""
    out = in_full_tmpfs(tmp_path, _FULL_TMPFS_SLAVE, tmp_path / "master")
    failed, stored = out.split(" stored ")
    at = int(failed.split("(")[1].split(",")[0])
    assert failed.endswith("'ENOSPC')") and at > 4096, out      # refused, not killed
    assert stored.strip() == "3000 b'm0' b'm2999' True", out


_FULL_TMPFS_INDEX = r'''
import errno, os, sys
from shmq.core.config import StoreConfig
from shmq.core.index import IndexService
from shmq.core.records import encode
from shmq.core.store import open_local
root = sys.argv[1]
if os.system(f"mount -t tmpfs -o size=4m none {root}") != 0:
    print("no mount"); sys.exit(0)
cfg = StoreConfig(storePathRootDir=root + "/store", mappedFileSizeCommitLog=1 << 20,
                  maxMessageSize=8192, mappedFileSizeConsumeQueue=300_000 * 20,
                  maxHashSlotNum=1000, maxIndexNum=100_000)
store, _ = open_local(cfg)
svc = IndexService(cfg)
N = 3000
for i in range(5):
    store.append(encode("T", [b"m%d" % i], properties=b"KEYS\x01k%d" % i))
svc.build(store)                          # the file, its slots and a page of entries
for i in range(5, N):
    store.append(encode("T", [b"m%d" % i], properties=b"KEYS\x01k%d" % i))
''' + _FILL_DISK + r'''failed = None
try:
    svc.build(store)                      # past the entries' page: the disk has no room
except OSError as e:
    failed = errno.errorcode[e.errno]
os.close(fd)
os.unlink(root + "/filler")               # room again: the build goes on where it stopped
svc.build(store)
hits = [len(svc.query("T", "k%d" % i, 64, 0, 1 << 62)) for i in range(N)]
print("failed", failed, "indexed", sum(h == 1 for h in hits), "twice", sum(h > 1 for h in hits),
      flush=True)
'''


def test_a_full_disk_under_the_index_is_enospc_not_a_bus_error(tmp_path):
    """IndexFiles are sparse and written through their mapping: an entry or
    a slot stored into a page with no block on a full disk was a SIGBUS that
    killed the services process. Pages get their blocks first, so the build
    says ENOSPC and keeps its place; once there is room every key is indexed,
    none twice. A real full file system: a 4 MiB tmpfs in a mount namespace
    of the test's own."""
    out = in_full_tmpfs(tmp_path, _FULL_TMPFS_INDEX)
    assert out.split() == ["failed", "ENOSPC", "indexed", "3000", "twice", "0"], out


def test_the_index_builder_waits_out_a_full_disk_with_one_warning(store_dir, caplog):
    """What the services process does with the build's ENOSPC: one WARNING
    naming the index directory, no build for INDEX_RETRY_S, then on; the
    process does not die of it (the boss stopped a broker whose services
    process kept dying)."""
    from shmq.broker.logs import DISK_RETRY_S as INDEX_RETRY_S
    from shmq.broker.services import IndexBuilder
    from shmq.core.index import IndexService
    cfg = small_config(store_dir)
    store, _ = open_local(cfg)
    svc = IndexService(cfg)
    builder = IndexBuilder(svc, store)
    store.append(encode("T", [b"x"], properties=b"KEYS\x01k"))
    calls = []

    def full(s, limit_bytes=None):
        calls.append(1)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    build, svc.build = svc.build, full
    with caplog.at_level(logging.INFO, "shmq.services"):
        assert builder.step(1_000) == 0 and builder.step(1_001) == 0
        assert len(calls) == 1                      # paused after the failure
        assert builder.step(1_000 + int(INDEX_RETRY_S * 1000)) == 0 and len(calls) == 2
        svc.build = build                           # room again
        assert builder.step(1_000 + int(2 * INDEX_RETRY_S * 1000)) > 0
    warned = [r.getMessage() for r in caplog.records
              if r.levelno >= logging.WARNING and r.name == "shmq.services"]
    assert warned == [f"cannot write the IndexFile under {svc.dir}: No space left on "
                      f"device; messages stored meanwhile are indexed once there is room "
                      f"(trying again every 10 s)"], warned
    assert svc.query("T", "k", 64, 0, 1 << 62)
    with pytest.raises(OSError, match="Bad file descriptor"):   # not the disk's: a bug, raised
        svc.build = lambda s, limit_bytes=None: (_ for _ in ()).throw(
            OSError(errno.EBADF, os.strerror(errno.EBADF)))
        builder.step(10_000_000)
    svc.close()
    store.close()


_FULL_TMPFS_TIMER = r"""
import errno, os, sys
import numpy as np
from shmq.core.timer import TimerWheel
root = sys.argv[1]
if os.system(f"mount -t tmpfs -o size=4m none {root}") != 0:
    print("no mount"); sys.exit(0)
w = TimerWheel(root, file_entries=1 << 16)      # 2 MiB files, sparse
w.open(0, 0)
def add(first, n):
    q = np.arange(first, first + n, dtype=np.int64)
    w.add(q, q * 100, np.full(n, 100, np.int64), q % 7 + 10, 0)
add(0, 10)                                      # the file and its first page
""" + _FILL_DISK + r"""failed = None
n = 10
try:
    while n < 1 << 16:                          # past the page: the disk has no room
        add(n, 128)
        n += 128
except OSError as e:
    failed = errno.errorcode[e.errno]
got = w.next_cq_offset                          # what got in before the refusal
os.close(fd)
os.unlink(root + "/filler")
add(got, 1000)
w.close()
w = TimerWheel(root, file_entries=1 << 16)      # reopened: the log is whole
w.open(0, 0)
print("failed", failed, "kept", w.pending == got + 1000, w.next_cq_offset == got + 1000,
      got > 10, flush=True)
"""


def test_a_full_disk_under_the_timer_log_is_enospc_not_a_bus_error(tmp_path):
    """The timer log's files are sparse and written through their mapping:
    an entry stored into a page with no block on a full disk was a SIGBUS
    that killed the services process. Pages get their blocks first, so
    ``add`` raises ENOSPC with what got in kept (``next_cq_offset``), and
    the log goes on from there once there is room. A real full file system:
    a 4 MiB tmpfs in a mount namespace of the test's own."""
    out = in_full_tmpfs(tmp_path, _FULL_TMPFS_TIMER)
    assert out.split() == ["failed", "ENOSPC", "kept", "True", "True", "True"], out
