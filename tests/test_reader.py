"""core.reader and core.view on real files: the one way records are read back.

The pull's pieces (``body_pieces``), a queue range read unit by unit
(``unit_chunks``, ``unit_records``: padding, a unit that points at another
record, a missing segment or ConsumeQueue file), the CommitLog walk, and a
view taken offline and from published positions."""
from __future__ import annotations

import os

import numpy as np

from conftest import SMALL_CQ_UNITS, SMALL_SEGMENT, small_config
from shmq.core import layout as L
from shmq.core import reader
from shmq.core.commitlog import FileRange
from shmq.core.records import encode, properties_bytes
from shmq.core.store import close_clean, flush_all, open_local
from shmq.core.view import StoreView, published_positions


def put(store, topic, bodies, qid=0):
    return store.append(encode(topic, bodies, queue_ids=qid, properties=properties_bytes(tags="T")))


def piece_bytes(store, piece) -> bytes:
    if isinstance(piece, FileRange):
        return os.pread(piece.fd, piece.n, piece.off)
    return bytes(piece)


def test_a_pull_body_is_one_piece_for_adjacent_records_and_a_run_each_otherwise(store_dir):
    store, _ = open_local(small_config(store_dir))
    a = put(store, "A", [b"a" * 100, b"b" * 100])
    put(store, "B", [b"other"])
    c = put(store, "A", [b"c" * 100])
    r = store.get_message("A", 0, 0, 32)
    assert r.count == 3
    want = [store.cl.read(int(p), int(n)) for p, n in zip(r.phys, r.sizes)]
    assert r.nbytes == sum(map(len, want))                 # the scan's total, as a pull passes it
    for sendfile_min, kind in ((1, FileRange), (1 << 20, memoryview)):
        for given in (-1, r.nbytes):
            parts, nbytes = store.pull_body(r.phys, r.sizes, sendfile_min, given)
            assert nbytes == sum(map(len, want)) and len(parts) == 2      # [a, a'], then [c]
            assert all(isinstance(p, kind) for p in parts)
            assert b"".join(piece_bytes(store, p) for p in parts) == b"".join(want)
    one, n = store.pull_body(r.phys[:2], r.sizes[:2], 1)
    assert len(one) == 1 and one[0].off == a.phy_offset and n == one[0].n
    two = store.get_message("A", 0, 0, 2)
    assert store.pull_body(two.phys, two.sizes, 1, two.nbytes)[1] == n == two.nbytes
    fr = store.pull_body(r.phys[2:], r.sizes[2:], 1)[0][0]
    assert fr.off == c.phy_offset % SMALL_SEGMENT
    close_clean(store)


def test_a_pull_body_in_a_later_segment_is_a_range_of_that_segment_file(store_dir):
    store, _ = open_local(small_config(store_dir))
    for _ in range(80):
        put(store, "Roll", [b"x" * 1000])
    r = store.get_message("Roll", 0, 79, 1)
    phy = int(r.phys[0])
    assert phy >= SMALL_SEGMENT
    (fr,), _ = store.pull_body(r.phys, r.sizes, 1)
    assert fr.off == phy % SMALL_SEGMENT and os.pread(fr.fd, fr.n, fr.off) == store.cl.read(phy, fr.n)
    close_clean(store)


def test_records_read_from_disk_are_checked_run_by_run_and_any_fault_is_said(store_dir):
    """``records_valid``, a cold pull's check: records back to back, in
    runs apart and in two segments pass; a flipped body bit, a unit
    of the wrong size or pointing inside a record does not, even where the
    units add up to the bytes they span (the pull then finds which, record
    by record)."""
    store, _ = open_local(small_config(store_dir))
    for i in range(70):                                  # two segments
        put(store, "Chk", [b"%02d" % i + b"x" * 900, b"y" * 300])
        put(store, "Other", [b"z" * 50])
    got = [store.get_message("Chk", 0, at, 140 - at) for at in (0, SMALL_CQ_UNITS)]
    phys, sizes = (np.concatenate([getattr(r, k) for r in got]) for k in ("phys", "sizes"))
    assert phys.shape[0] == 140 and phys[-1] >= SMALL_SEGMENT
    assert reader.records_valid(store.cl, phys, sizes)
    assert reader.records_valid(store.cl, phys[:0], sizes[:0])
    assert not reader.records_valid(store.cl, phys[5:7], sizes[5:7] + [0, 1])
    assert not reader.records_valid(store.cl, phys[5:7] + [0, 8], sizes[5:7])
    # units one record apart that add up to the bytes they span: a unit inside
    # a record, the gap after it as long as the overlap (the scan's positions
    # say so: they are not the units')
    other = int(phys[2]) - int(phys[1]) - int(sizes[1])          # "Other"'s record between
    fake = np.array([phys[0], phys[0] + 50, phys[1] + sizes[1]], np.int64)
    fake_sizes = np.array([sizes[0], sizes[1], other], np.int64)
    assert int(fake[-1] + fake_sizes[-1] - fake[0]) == int(fake_sizes.sum())
    assert not reader.records_valid(store.cl, fake, fake_sizes)
    assert reader.records_valid(store.cl, np.array([phys[0], phys[1], phys[1] + sizes[1]]),
                                np.array([sizes[0], sizes[1], other]))
    bad = int(phys[-3])                                  # a body byte, in the second segment
    view = store.cl.map(SMALL_SEGMENT)
    view[bad - SMALL_SEGMENT + 100] ^= 0x10
    assert reader.records_valid(store.cl, phys[:-3], sizes[:-3])
    assert not reader.records_valid(store.cl, phys, sizes)
    view[bad - SMALL_SEGMENT + 100] ^= 0x10
    close_clean(store)


def test_a_queue_range_reads_every_record_skips_padding_and_hands_on_a_wrong_unit_alone(store_dir):
    store, _ = open_local(small_config(store_dir))
    put(store, "Q", [b"m%d" % i for i in range(6)])
    store.cqs.put_padding("Q", 0, 6, 2)                 # offsets 6, 7: a repaired claim's
    slot = store.state.queue_slot("Q", 0)
    store.state.queue_claim[slot] = store.state.queue_next[slot] = 8
    put(store, "Q", [b"m8"])                            # offset 8
    u = store.cqs.unit("Q", 0, 1)
    store.cqs.put_one("Q", 0, 3, u[0], u[1], u[2])      # unit 3 points at record 1
    chunks = list(reader.unit_chunks(store.cqs, "Q", 0, 0, 9, 4))
    assert [(first, n) for first, _, n in chunks] == [(0, 4), (4, 4), (8, 1)]
    got, bad = [], []
    for first, units, _ in chunks:
        for run in reader.unit_records(store.cl, 0, first, units):
            assert run.rows.shape[0] == run.qoffs.shape[0]
            assert (run.rows[:, L.S_QUEUE_OFFSET] == run.qoffs).all()
            got += run.qoffs.tolist()
            if run.bad:
                bad.append((run.bad_qoff, run.bad_phy))
    assert got == [0, 1, 2, 4, 5, 8]
    assert bad == [(3, u[0])]
    _, pads, _ = next(reader.unit_chunks(store.cqs, "Q", 0, 6, 8, 4))
    assert list(reader.unit_records(store.cl, 0, 6, pads)) == []      # padding alone: nothing
    close_clean(store)


def test_a_missing_consumequeue_file_or_segment_is_said_not_raised(store_dir):
    store, _ = open_local(small_config(store_dir))
    for _ in range(SMALL_CQ_UNITS + 10):
        put(store, "M", [b"y" * 600])
    flush_all(store)
    store.cqs.forget("M", 0, 0)
    os.unlink(store.cqs.file_path("M", 0, 0))
    chunks = list(reader.unit_chunks(store.cqs, "M", 0, 5, SMALL_CQ_UNITS + 10, 1000))
    assert [(f, u is None, n) for f, u, n in chunks] == [(5, True, SMALL_CQ_UNITS - 5),
                                                          (SMALL_CQ_UNITS, False, 10)]
    _, units, _ = chunks[1]
    seg = int(units["phy_offset"][0]) // SMALL_SEGMENT * SMALL_SEGMENT
    store.cl.close_segment(seg)
    os.unlink(store.cl.path(seg))
    runs = list(reader.unit_records(store.cl, 0, SMALL_CQ_UNITS, units))
    assert runs[0].buf is None and runs[0].base == seg and runs[0].qoffs[0] == SMALL_CQ_UNITS
    store.close()


def test_the_walk_finds_every_record_and_the_record_at_a_position(store_dir):
    store, _ = open_local(small_config(store_dir))
    r = put(store, "W", [b"w" * 50] * 10)
    buf = store.cl.map(0)
    seen = []
    w = reader.walk(buf, 0, 0, r.end, True, reader.scan_out(3), lambda _, rows: seen.append(len(rows)))
    assert (w.records, w.pos, w.status) == (10, r.end, L.SCAN_END) and seen == [3, 3, 3, 1]
    assert int(w.first[L.S_PHY]) == 0 and int(w.last[L.S_PHY]) == int(r.rec_phy[9])
    row, _ = reader.record_row(buf, 0, int(r.rec_phy[4]), r.end)
    assert int(row[L.S_QUEUE_OFFSET]) == 4
    assert reader.record_row(buf, 0, int(r.rec_phy[4]) + 1, r.end)[0] is None
    close_clean(store)


def test_a_view_from_published_positions_and_from_the_files_agree(store_dir):
    store, _ = open_local(small_config(store_dir))
    for q in range(3):
        put(store, "V", [b"v"] * (q + 2), qid=q)
    flush_all(store)
    live = StoreView.open(store_dir, published=published_positions(store.state))
    assert live.live and live.cl_end == store.state.write_pos
    close_clean(store)
    offline = StoreView.open(store_dir)
    assert not offline.live and offline.cl_end == live.cl_end
    assert {k: (e.min_offset, e.max_offset) for k, e in offline.queues.items()} == \
        {k: (e.min_offset, e.max_offset) for k, e in live.queues.items()} == \
        {("V", q): (0, q + 2) for q in range(3)}
    cqs = offline.consumequeues()
    try:
        r = reader.get_message(cqs, "V", 2, 0, 0, 4, lambda: offline.cl_min, 32, np.zeros(0, np.int64),
                               1 << 20)
    finally:
        cqs.close()
    assert r.status is reader.GetMessageStatus.FOUND and r.count == 4 and r.next_offset == 4
