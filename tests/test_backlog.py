"""A big backlog costs nothing to hold: whole-store scans give back what they
walked (``FileLayer.drop``), so no process's RSS grows with the store, and a
reader far behind reads its own queue's records ahead (``reader.read_ahead``).

RSS is read from /proc/self/smaps: the resident pages of this process's
mappings of the store's CommitLog segments, after the scan — no timing."""
from __future__ import annotations

import os

import numpy as np
import pytest

from brokerproc import until
from conftest import keeps_every_page, small_config
from shmq.core import _kernels as K
from shmq.core.files import PAGE_BYTES, REAL_FILES, SimFileLayer
from shmq.core.index import IndexService
from shmq.core.reader import read_ahead
from shmq.core.records import encode, properties_bytes
from shmq.core.scrub import Scrubber
from shmq.core.store import close_clean, flush_all, open_local

SEGMENT = 1 << 20
WINDOW = 256 << 10
# what a drop may leave mapped: the partial pages at both ends of the range,
# and the pages the kernel's fault-around mapped beside them (64 KiB each)
SLACK = 2 * (64 << 10) + 2 * PAGE_BYTES


def mapped_rss(under: str) -> int:
    """Resident bytes of this process's mappings of files under ``under``."""
    total, mine = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
                mine = len(head) >= 6 and head[5].startswith(under)
            elif mine and line.startswith("Rss:"):
                total += int(head[1]) * 1024
    return total


def _store(store_dir, segments: int = 5, **kw):
    """A store of ``segments`` 1 MiB segments of ~300-byte records, keys
    and tags set, two queues written in turns of 32 records."""
    cfg = small_config(store_dir, mappedFileSizeCommitLog=SEGMENT, backgroundScanWindowBytes=WINDOW,
                       **kw)
    store, _ = open_local(cfg)
    i = 0
    while store.state.write_pos < segments * SEGMENT - SEGMENT // 2:
        store.append(encode("B", [b"%06d:" % (i + j) + b"x" * 200 for j in range(32)],
                            queue_ids=(i // 32) % 2,
                            properties=properties_bytes(tags="t", keys="k%d" % i)))
        i += 32
    return cfg, store


def test_drop_gives_back_a_mappings_pages_and_keeps_its_bytes(tmp_path):
    path = str(tmp_path / "f")
    with open(path, "wb") as f:
        f.write(bytes(range(256)) * (8 << 12))          # 8 MiB
    h = REAL_FILES.open(path, writable=True)
    try:
        a = REAL_FILES.map(h)
        a[5] = 7                                         # a dirty page: it must survive the drop
        assert int(a.sum(dtype=np.int64)) > 0
        assert mapped_rss(path) >= 8 << 20
        REAL_FILES.drop(h, PAGE_BYTES + 1, 4 << 20)      # whole pages inside the range only
        assert (4 << 20) - 2 * PAGE_BYTES <= mapped_rss(path) <= (4 << 20) + 2 * PAGE_BYTES
        REAL_FILES.drop(h, 0, h.size)
        assert mapped_rss(path) == 0
        assert a[5] == 7 and a[6] == 6 and a[(4 << 20) + 3] == 3   # faulted back, same bytes
    finally:
        REAL_FILES.close(h)
    with open(path, "rb") as f:
        assert f.read(8)[5] == 7


def test_the_index_backfill_holds_one_window_of_the_commitlog(store_dir):
    cfg, store = _store(store_dir)
    try:
        commitlog = os.path.join(store_dir, "commitlog")
        store.cl.drop(0, store.state.write_pos)          # whatever the appends mapped
        svc = IndexService(cfg)
        advanced = 0
        while True:
            n = svc.build(store)
            assert n <= WINDOW + SEGMENT                  # a window a call (whole scan chunks)
            advanced += n
            assert mapped_rss(commitlog) <= SLACK
            if not n:
                break
        assert advanced == store.state.write_pos
        assert svc.query("B", "k0", 4, 0, 1 << 62)       # it indexed what it walked
        svc.close()
    finally:
        close_clean(store)


def test_the_scrub_gives_back_each_window_it_checked(store_dir):
    cfg, store = _store(store_dir, scrubBytesPerSecond=WINDOW // 2)
    try:
        commitlog = os.path.join(store_dir, "commitlog")
        store.cl.drop(0, store.state.write_pos)
        clock = [0.0]
        scrub = Scrubber(store, cfg, clock=lambda: clock[0])
        peak = 0
        for _ in range(200):
            clock[0] += 1.0                               # half a window a step
            scrub.step(0)
            peak = max(peak, mapped_rss(commitlog))
            if scrub.pos < 0 and scrub.checked:
                break
        assert scrub.checked >= 4 * SEGMENT and scrub.found == 0
        # a window, and what the step that crossed it checked (rows of ~300 B
        # for each 256 B of the step's budget): never the 4 MiB it walked
        assert peak <= WINDOW + 2 * (WINDOW // 2) + SLACK
        assert mapped_rss(commitlog) <= SLACK
    finally:
        close_clean(store)


def test_the_scrub_leaves_the_page_cache_as_it_found_it(store_dir):
    """A pass reads the whole CommitLog: the pages it brought into the page
    cache leave it again, and the pages another reader had cached stay
    (mincore before and after, the file's own descriptor evicting and
    reading as another process would); a damaged record on the way (its
    search for the next valid record reads what was not read ahead) too."""
    if keeps_every_page(store_dir):     # tmpfs: its pages are the file, nothing evicts them
        pytest.skip("the store's file system keeps every page in memory (tmpfs): there is no "
                    "page cache for the scrub to leave as it found it")
    cfg, store = _store(store_dir, segments=3, scrubBytesPerSecond=WINDOW // 2)
    try:
        bad = next(m for m in store.read_queue("B", 0) if m.phy_offset > 600 << 10)
        fd = os.open(store.cl.path(0), os.O_WRONLY)
        try:
            os.pwrite(fd, b"\xff", bad.phy_offset + bad.total_size // 2)   # in its body
        finally:
            os.close(fd)
        flush_all(store)
        store.cl.drop(0, store.state.write_pos)                  # unmapped: the cache may let go
        segments = [store.cl.path(s) for s in (0, SEGMENT)]      # the sealed ones
        for path in segments:                                    # cold, then a reader's pages
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)     # its pages, none around them
                for off in (0, 300 << 10, SEGMENT - (40 << 10)):
                    os.pread(fd, 24 << 10, off)
            finally:
                os.close(fd)
        before = [_cached(p) for p in segments]
        assert all(0 < c.sum() < c.size // 4 for c in before)    # the reader's pages, no more
        clock = [0.0]
        scrub = Scrubber(store, cfg, clock=lambda: clock[0])
        for _ in range(200):
            clock[0] += 1.0                               # half a window a step
            scrub.step(0)
            if scrub.pos < 0 and scrub.checked:
                break
        assert scrub.checked >= 2 * SEGMENT and scrub.found == 1
        for path, was in zip(segments, before):
            now = _cached(path)
            assert (now == was).all(), (path, np.flatnonzero(now != was)[:20])
    finally:
        close_clean(store)


def _cached(path: str) -> np.ndarray:
    """mincore of the whole file, through a mapping of its own."""
    h = REAL_FILES.open(path, writable=False)
    try:
        return REAL_FILES.cached(h, 0, h.size).copy()
    finally:
        REAL_FILES.close(h)


class _Advised(SimFileLayer):
    """Records each will_need: (path, begin, end)."""

    def __init__(self):
        super().__init__()
        self.advised: list[tuple[str, int, int]] = []

    def will_need(self, h, begin, end):
        self.advised.append((h.path, begin, end))


def test_read_ahead_advises_the_queues_own_runs_and_its_units():
    files = _Advised()
    cfg = small_config("/sim/store", mappedFileSizeCommitLog=SEGMENT)
    store, _ = open_local(cfg, files)
    for i in range(24):                                    # queue 0 and 1 in turns of 8 records
        store.append(encode("R", [b"%04d" % (i * 8 + j) + b"y" * 200 for j in range(8)],
                            queue_ids=i % 2, properties=b""))
    store.cqs.put_padding("R", 0, 96, 2)                   # padding units are not read ahead
    msgs = store.read_queue("R", 0)
    runs = []                                             # queue 0's records, joined when adjacent
    for m in msgs:
        end = m.phy_offset + m.total_size
        if runs and runs[-1][1] == m.phy_offset:
            runs[-1][1] = end
        else:
            runs.append([m.phy_offset, end])
    files.advised.clear()
    upto = read_ahead(store.cl, store.cqs, "R", 0, 0, 1000, gap_max=0)
    assert upto == min(1000, cfg.cq_units_per_file)
    cq = [(b, e) for p, b, e in files.advised if "consumequeue" in p]
    cl = [(b, e) for p, b, e in files.advised if "commitlog" in p]
    assert cq == [(0, min(1000, cfg.cq_units_per_file) * 20)]
    assert cl == [tuple(r) for r in runs] and len(cl) == 12
    files.advised.clear()                                 # runs closer than gap_max are one
    read_ahead(store.cl, store.cqs, "R", 0, 0, 1000, gap_max=SEGMENT)
    assert [(b, e) for p, b, e in files.advised if "commitlog" in p] == [(runs[0][0], runs[-1][1])]
    files.advised.clear()                                 # at most runs_max requests
    read_ahead(store.cl, store.cqs, "R", 0, 0, 1000, gap_max=0, runs_max=3)
    assert [(b, e) for p, b, e in files.advised if "commitlog" in p] == [tuple(r) for r in runs[:3]]
    assert read_ahead(store.cl, store.cqs, "R", 5, 0, 10, gap_max=0) == 0     # no such queue
    assert K.CQ_PAD_SIZE == store.cqs.unit("R", 0, 96)[1]


def test_a_worker_serving_a_reader_far_behind_holds_a_window_of_what_it_read(tmp_path):
    """Pulls through a whole queue that lies outside the page-cache window
    (accessMessageInMemoryMaxRatio=0): the worker gives back what it served
    each time it reads ahead, so its mapped CommitLog stays a couple of
    read-ahead windows, not the 12 MB of records the queue holds."""
    from brokerproc import routed_topic, start_broker
    from shmq.client.remoting import RemotingClient
    from shmq.client.requests import decode_records, pull_message, send_batch
    from shmq.ipc.codes import ResponseCode as R

    per_queue, body = 40_000, b"z" * 200
    with start_broker(tmp_path, workerProcessNums=1, accessMessageInMemoryMaxRatio=0,
                      mappedFileSizeCommitLog=4 << 20) as b:
        topic = routed_topic(b, "Behind", 2)
        with RemotingClient(b.addr) as c:
            for off in range(0, per_queue, 500):
                for q in range(2):
                    r = c.invoke(send_batch(topic, [(body, "")] * 500, queue_id=q), timeout=60)
                    assert r.code == R.SUCCESS and int(r.ext["queueOffset"]) == off
            off = 0
            while off < per_queue:
                r = c.invoke(pull_message(topic, 0, off, max_msgs=32), timeout=60)
                assert r.code == R.SUCCESS, r.remark
                recs = decode_records(r.body)
                assert [m.queue_offset for m in recs] == list(range(off, off + len(recs)))
                off += len(recs)
        worker = next(pid for name, pid in b.children().items() if name.startswith("shmq-worker"))
        store_cl = os.path.join(str(tmp_path), "store", "commitlog")
        held = _mapped_rss_of(worker, store_cl)
        record = recs[0].total_size
        window = 4096 * record * 2                          # a read-ahead window's span: 2 queues
        assert held <= 2 * window + (1 << 20) < per_queue * record, (held, window)


def _mapped_rss_of(pid: int, under: str) -> int:
    total, mine = 0, False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and not head[0].endswith(":"):
                mine = len(head) >= 6 and head[5].startswith(under)
            elif mine and line.startswith("Rss:"):
                total += int(head[1]) * 1024
    return total


def test_a_reader_at_the_head_holds_the_hot_tail_not_everything_it_read(store_dir, monkeypatch):
    """A consumer keeping up for days: its process gives back the pages it
    read further than HOT_BYTES behind the write position."""
    from shmq.core import store as S
    monkeypatch.setattr(S, "HOT_BYTES", 1 << 20)
    monkeypatch.setattr(S, "GIVE_BACK_EVERY_BYTES", 256 << 10)
    cfg = small_config(store_dir, mappedFileSizeCommitLog=SEGMENT)
    store, _ = open_local(cfg)
    try:
        offset = 0
        while store.state.write_pos < 6 * SEGMENT:
            store.append(encode("H", [b"h" * 500] * 32, properties=b""))
            got = store.read_queue("H", 0, offset)               # maps what it reads
            assert [m.queue_offset for m in got] == list(range(offset, offset + 32))
            offset += 32
        assert mapped_rss(os.path.join(store_dir, "commitlog")) <= (1 << 20) + (256 << 10) + SLACK
    finally:
        close_clean(store)


def test_what_lies_past_the_end_is_found_without_reading_a_preallocated_segment(store_dir):
    """Recovery's look for bytes past the end (``CommitLog.last_nonzero``)
    reads only what the file system says may hold data — never a
    fallocate'd segment's never-written extents, nor the zero pages a
    read-around would cache after what it read (which made the rest of a
    1 GiB segment data, read at every start) — and holds one window."""
    from shmq.core.commitlog import CommitLog
    commitlog = os.path.join(store_dir, "commitlog")
    cl = CommitLog(REAL_FILES, commitlog, 8 * SEGMENT)
    try:
        cl.ensure_segment(0)                             # fallocate'd: 8 MiB never written
        assert cl.last_nonzero(0, 8 * SEGMENT) == (-1, 0)
        assert mapped_rss(commitlog) <= SLACK
        cl.write(5 * SEGMENT + 7, b"\x01\x02")          # in the page cache, not yet written back
        assert cl.last_nonzero(0, 8 * SEGMENT) == (5 * SEGMENT + 8, PAGE_BYTES)   # its page alone
        assert cl.last_nonzero(5 * SEGMENT + 9, 8 * SEGMENT) == (-1, PAGE_BYTES - 9)
        assert cl.last_nonzero(0, 8 * SEGMENT) == (5 * SEGMENT + 8, PAGE_BYTES)   # nothing cached
        assert mapped_rss(commitlog) <= SLACK
    finally:
        cl.close()
    files = SimFileLayer()                               # no holes known: every byte is read
    sim = CommitLog(files, "/sim/store/commitlog", SEGMENT)
    sim.ensure_segment(0)
    sim.write(SEGMENT - 1, b"\x09")
    assert sim.last_nonzero(0, SEGMENT) == (SEGMENT - 1, SEGMENT)


def _cold(store_dir: str) -> None:
    """Empty the page cache of the store's CommitLog (clean pages nobody maps)."""
    commitlog = os.path.join(store_dir, "commitlog")
    for name in os.listdir(commitlog):
        fd = os.open(os.path.join(commitlog, name), os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def test_a_start_reads_past_the_end_only_what_a_crash_can_have_written(store_dir):
    """After a clean stop a start reads, past the end, at most the rest of
    the end's own page (the recovery report's ``bytes_read_past_end``, in
    its logged summary): not the megabytes of preallocated zeros after it,
    nor the empty next segment. After a crash that left bytes past the end
    (a torn append), it reads their pages and zeroes them."""
    from shmq.core.checkpoint import abort_path
    segment = 8 * SEGMENT
    cfg = small_config(store_dir, mappedFileSizeCommitLog=segment)
    store, _ = open_local(cfg)
    for i in range(40):                                    # about 1.3 MiB of the 8 MiB segment
        store.append(encode("E", [b"e" * 1000] * 32, queue_ids=i % 2, properties=b""))
    end = store.state.write_pos
    store.cl.ensure_segment(segment)                       # the flusher's preallocated next one
    close_clean(store)
    _cold(store_dir)
    store, rep = open_local(cfg)
    assert (rep.mode, rep.end, rep.records_scanned, rep.bytes_truncated) == ("normal", end, 0, 0)
    assert rep.bytes_read_past_end < PAGE_BYTES, rep.summary()
    assert f"({rep.bytes_read_past_end} read past the end)" in rep.summary()
    # a crash: an append's first bytes written, never published; the abort marker stays
    store.cl.write(end + 100_000, b"\xee" * 300)
    store.close()                                          # no flush, no checkpoint
    assert os.path.exists(abort_path(store_dir))
    store, rep = open_local(cfg)
    try:
        assert (rep.mode, rep.end, rep.bytes_truncated) == ("abnormal", end, 100_300)
        # the page the end lies in, and the pages of what the crash left
        assert rep.bytes_read_past_end <= 3 * PAGE_BYTES, rep.summary()
        assert store.cl.last_nonzero(end, segment)[0] == -1
    finally:
        close_clean(store)


def test_an_appender_holds_the_consumequeue_file_it_writes_not_the_ones_it_filled(store_dir):
    cfg = small_config(store_dir, mappedFileSizeCommitLog=8 * SEGMENT,
                       mappedFileSizeConsumeQueue=50_000 * 20)
    store, _ = open_local(cfg)
    try:
        for _ in range(250):                              # 250,000 units: 5 files of 1 MB
            store.append(encode("Q", [b"q"] * 1000, properties=b""))
        assert store.max_offset("Q", 0) == 250_000
        held = mapped_rss(os.path.join(store_dir, "consumequeue"))
        assert held <= (1 << 20) + SLACK, held            # the file being written, at most
        assert store.read_queue("Q", 0, 49_999, 2)[1].queue_offset == 50_000   # all still there
    finally:
        close_clean(store)


def test_will_need_reads_the_whole_range_ahead_beyond_the_kernels_limit_of_one_call(tmp_path):
    """The kernel reads at most read_ahead_kb of one WILLNEED (8 MiB on this
    VM's disk): a cold 32 MiB window advised through ``FileLayer.will_need``
    (the reader's walk window, recovery's scan-ahead) comes into the page
    cache past that (mincore counts a page once its read is done: polled)."""
    if keeps_every_page(tmp_path):
        pytest.skip("the file system keeps every page in memory (tmpfs): nothing is cold")
    path, window = str(tmp_path / "cold"), 32 << 20
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for _ in range(window >> 20):
            os.write(fd, b"x" * (1 << 20))
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    h = REAL_FILES.open(path, writable=False)
    try:
        assert REAL_FILES.cached(h, 0, window).sum() * PAGE_BYTES < 1 << 20     # cold
        REAL_FILES.will_need(h, 0, window)
        limit = max(8 << 20, REAL_FILES.read_ahead_bytes(h.dev))
        until(lambda: int(REAL_FILES.cached(h, 0, window).sum()) * PAGE_BYTES > limit,
              f"more than {limit >> 20} MiB of the {window >> 20} MiB read ahead")
    finally:
        REAL_FILES.close(h)
