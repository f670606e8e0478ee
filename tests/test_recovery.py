"""Recovery: simulated power loss (seeded) and damaged stores on real files.

The simulated file layer loses, keeps or tears every page written since its
last sync. Whatever it does, recovery must give back a prefix of what was
appended that holds every record that was flushed, intact, with dense queue
offsets and ConsumeQueues that agree with the CommitLog.
"""
from __future__ import annotations

import json
import os
import random
import shutil

import numpy as np
import pytest

from conftest import SMALL_SEGMENT, small_config, stress_rounds
from shmq.core import layout as L
from shmq.core.files import SimFileLayer
from shmq.core.records import encode, properties_bytes
from shmq.core.recovery import RecoveryError
from shmq.core.store import GetMessageStatus, close_clean, flush_all, open_local

TOPICS = ("Alpha", "Beta")
SIM_ROOT = "/sim/store"


def _append_random(store, rng, log, seq):
    topic, qid = rng.choice(TOPICS), rng.randrange(3)
    n = rng.randint(1, 6)
    bodies = [f"{seq + i}:".encode() + os.urandom(rng.randint(0, 700)) for i in range(n)]
    sysflag = [L.SYSFLAG_TRANSACTION_PREPARED if rng.random() < 0.05 else 0 for _ in range(n)]
    r = store.append(encode(topic, bodies, queue_ids=qid, sysflag=sysflag,
                            properties=[properties_bytes(tags=rng.choice(["a", "b", None]),
                                                         keys=f"k{seq + i}") for i in range(n)]))
    for i, body in enumerate(bodies):
        end = int(r.rec_phy[i + 1]) if i + 1 < n else r.end
        log.append((int(r.rec_phy[i]), end, topic, qid, body, sysflag[i] == 0))
    return seq + n


def _recovered_records(store):
    """Every record reachable through the ConsumeQueues, checked for density
    and agreement with the CommitLog."""
    out = {}
    for topic in TOPICS:
        for qid in range(3):
            msgs = store.read_queue(topic, qid)
            assert [m.queue_offset for m in msgs] == list(range(len(msgs))), (topic, qid)
            assert store.max_offset(topic, qid) == len(msgs)
            for m in msgs:
                assert (m.topic, m.queue_id) == (topic, qid)
                out[m.phy_offset] = m
    return out


@pytest.mark.parametrize("seed", range(stress_rounds(150)))
def test_power_loss_keeps_a_prefix_with_everything_flushed(seed):
    rng = random.Random(seed)
    files = SimFileLayer()
    cfg = small_config(SIM_ROOT, mappedFileSizeCommitLog=40 * 1024, mappedFileSizeConsumeQueue=20 * 40,
                       maxMessageSize=4096)
    store, _ = open_local(cfg, files)
    log, seq, flushed = [], 0, 0
    for _ in range(rng.randint(1, 80)):
        op = rng.random()
        if op < 0.8:
            seq = _append_random(store, rng, log, seq)
        elif op < 0.93:
            flushed = store.flush_commitlog()          # a SYNC_FLUSH ack point
        else:
            flush_all(store)                           # ConsumeQueues + checkpoint too
            flushed = store.state.flushed_pos
    files.crash(seed)
    store, report = open_local(cfg, files)
    assert report.offset_anomalies == 0 and report.flushed_lost_bytes == 0
    got = _recovered_records(store)
    end = report.end
    assert end >= flushed
    for phy, rec_end, topic, qid, body, has_unit in log:
        if rec_end <= end:        # inside the recovered prefix: present and intact
            if has_unit:
                m = got.pop(phy)
                assert (m.topic, m.queue_id, m.body) == (topic, qid, body)
            else:
                assert store.read_message(phy).body == body
        else:
            assert phy >= flushed or rec_end > flushed
    assert not got, "records recovered that were never appended, or twice"
    # the recovered store takes appends again where it ended
    r = store.append(encode("Alpha", [b"after"], properties=b""))
    assert r.phy_offset >= end
    assert store.read_queue("Alpha", 0)[-1].body == b"after"


def test_deleted_consumequeues_are_rebuilt_from_the_commitlog(store_dir):
    cfg = small_config(store_dir)
    store, _ = open_local(cfg)
    for i in range(500):
        store.append(encode("Re", [b"m%d" % i], queue_ids=i % 4,
                            properties=properties_bytes(tags="even" if i % 2 == 0 else "odd")))
    close_clean(store)
    shutil.rmtree(os.path.join(store_dir, "consumequeue"))
    store, report = open_local(cfg)
    assert report.units_rebuilt == 500 and report.scan_from == 0
    assert [m.body for m in store.read_queue("Re", 1)] == [b"m%d" % i for i in range(1, 500, 4)]
    even, offset = 0, 0   # tags codes rebuilt from the stored TAGS property
    while offset < store.max_offset("Re", 2):
        r = store.get_message("Re", 2, offset, 64, np.array([L.tags_code("even")]))
        even, offset = even + r.count, r.next_offset
    assert even == 125
    assert store.get_message("Re", 1, 0, 64, np.array([L.tags_code("even")])).count == 0


def test_a_lost_consumequeue_file_triggers_a_full_redispatch(store_dir):
    cfg = small_config(store_dir)
    store, _ = open_local(cfg)
    for i in range(400):                       # 4 ConsumeQueue files of 100 units
        store.append(encode("G", [b"x" * 300], properties=b""))
    close_clean(store)
    os.unlink(os.path.join(store_dir, "consumequeue", "G", "0", f"{2000:020d}"))
    store, report = open_local(cfg)
    assert report.full_redispatch
    assert len(store.read_queue("G", 0)) == 400


def test_recovery_trusts_the_consumequeue_files_the_checkpoint_covers_and_checks_the_last(
        store_dir, capsys):
    """A start reads only the ConsumeQueue files past the last one whose last
    unit lies below the scan start (issue 20: the walk of every unit was
    most of a 100 M store's start). Damage in a file it trusts is left for
    the readers' checks and ``shmq store inspect --verify``; in the files it
    reads, a unit is rewritten from the CommitLog as before."""
    from shmq.tools.cli import main
    cfg = small_config(store_dir)               # 64 KiB segments, 100 units a ConsumeQueue file
    store, _ = open_local(cfg)

    def put(i):
        return int(store.append(encode("T", [b"%03d" % i + b"x" * 300], properties=b"")).phy_offset)

    phys = [put(i) for i in range(420)]         # 3 segments; units in 5 files
    close_clean(store)                          # the checkpoint: record 420 on is not covered
    store, _ = open_local(cfg)
    phys += [put(i) for i in range(420, 450)]
    store.close()                               # as after kill -9: the checkpoint as it was
    scan_from = phys[420]                       # where the checkpoint says, not its segment's start
    assert scan_from % SMALL_SEGMENT and phys[399] < scan_from < phys[430]   # files 0-3 trusted

    def point_into_its_record(offset):          # a flipped bit: one byte into its record
        path = os.path.join(store_dir, "consumequeue", "T", "0", f"{offset // 100 * 2000:020d}")
        with open(path, "r+b") as f:
            f.seek(offset % 100 * 20)
            f.write((phys[offset] + 1).to_bytes(8, "big"))

    point_into_its_record(10)
    point_into_its_record(430)
    store, report = open_local(cfg)
    assert (report.scan_from, report.units_rebuilt, report.full_redispatch) == (scan_from, 1, False)
    assert store.cqs.unit("T", 0, 430)[0] == phys[430]          # read: rewritten
    assert store.cqs.unit("T", 0, 10)[0] == phys[10] + 1        # trusted: not read at start
    close_clean(store)
    assert main(["store", "inspect", store_dir, "--verify", "--json"]) == 1
    bad = json.loads(capsys.readouterr().out)["consumequeue"]["first_bad"]
    assert (bad["topic"], bad["queue_offset"]) == ("T", 10) and f"is at {phys[10]}" in bad["problem"]


def test_a_start_reads_from_the_checkpoints_position_only_when_a_record_bounds_it(store_dir):
    """Issue 20: a start scans from the checkpoint's position, not its
    segment's start, when a valid record starts or ends there (records name
    their own position): after a clean stop nothing is read. A checkpoint
    pointing inside a record (wrong, or from another store) is caught, and
    the scan starts at the segment's start as before, keeping every record."""
    from shmq.core.checkpoint import Checkpoint
    from shmq.core.files import REAL_FILES
    cfg = small_config(store_dir)
    store, _ = open_local(cfg)
    recs = _fill(store, 40, size=400)            # one segment
    close_clean(store)
    store, report = open_local(cfg)
    assert (report.scan_from, report.bytes_scanned, report.end) == (recs[-1][1], 0, recs[-1][1])
    store.close()
    for at, scan_from in ((recs[25][0], recs[25][0]),          # a record starts there
                          (recs[25][0] + 7, 0), (recs[-1][1] - 4, 0)):   # inside a record
        ck = Checkpoint.load(REAL_FILES, store_dir)
        Checkpoint(ck.physic_ts, ck.logics_ts, 0, at, at).save(REAL_FILES, store_dir)
        store, report = open_local(cfg)
        assert (report.scan_from, report.end, report.units_rebuilt) == (scan_from, recs[-1][1], 0)
        assert [m.body for q in range(3) for m in store.read_queue("Cut", q)] == \
            [r[4] for q in range(3) for r in recs if r[2] == q]
        store.close()


def test_a_clean_start_reads_nothing_and_keeps_the_newest_store_timestamp(store_dir):
    """After a clean stop the scan starts at the end (issue 20), so the newest
    record's store time comes from the checkpoint, not from a record read:
    the state and the next checkpoint carry it, never 0."""
    from shmq.core.checkpoint import Checkpoint
    from shmq.core.files import REAL_FILES
    cfg = small_config(store_dir)
    store, _ = open_local(cfg)
    last = [store.append(encode("Ts", [b"m%d" % i], properties=b"")) for i in range(5)][-1]
    close_clean(store)
    store, report = open_local(cfg)
    assert report.bytes_scanned == 0
    assert store.state.get("last_store_ts") == last.store_timestamp > 0
    flush_all(store)
    assert Checkpoint.load(REAL_FILES, store_dir).physic_ts == last.store_timestamp
    close_clean(store)


def test_stale_units_past_the_end_are_dropped(store_dir):
    cfg = small_config(store_dir)
    store, _ = open_local(cfg)
    for i in range(10):
        store.append(encode("S", [b"m%d" % i], properties=b""))
    units = store.cqs.mapped("S", 0, 0, create=False)
    units[200:260] = units[0:60]   # units 10..12 duplicate 0..2: not records of those offsets
    store.close()
    store, report = open_local(cfg)
    assert report.units_dropped == 3 and store.max_offset("S", 0) == 10


def _segment(store_dir, i):
    return os.path.join(store_dir, "commitlog", f"{i * SMALL_SEGMENT:020d}")


def test_a_bad_crc_past_the_flushed_position_is_a_torn_write_and_truncates(store_dir):
    cfg = small_config(store_dir)
    store, _ = open_local(cfg)
    phys = [int(store.append(encode("C", [b"body-%03d" % i], properties=b"")).phy_offset)
            for i in range(50)]
    store.close()                     # no checkpoint: nothing is known to be flushed
    with open(_segment(store_dir, 0), "r+b") as f:   # flip one body byte of record 30
        f.seek(phys[30] + 84 + 4 + 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0xFF]))
    store, report = open_local(cfg)
    assert report.end == phys[30] and report.stop_reason == f"corrupt record at {phys[30]}"
    assert report.bytes_truncated > 0 and report.units_dropped == 20
    assert [m.body for m in store.read_queue("C", 0)] == [b"body-%03d" % i for i in range(30)]
    assert store.get_message("C", 0, 30, 1).status is GetMessageStatus.OFFSET_OVERFLOW_ONE


def _flip(path, at, bit):
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)[0]
        f.seek(at)
        f.write(bytes([b ^ (1 << bit)]))


def _checked_bytes(rec_phy, rec_end, body_len, rng):
    """A byte of a record that recovery's check covers: TOTALSIZE, MAGIC,
    BODYCRC, PHYSICALOFFSET, the body length and the body."""
    blen_at = rec_phy + 48 + 8 + 8 + 8 + 12          # IPv4 hosts
    body = range(blen_at + 4, blen_at + 4 + body_len)
    where = rng.choice(["size", "magic", "crc", "phy", "blen", "body", "body", "body"])
    return {"size": rec_phy + rng.randrange(4), "magic": rec_phy + 4 + rng.randrange(4),
            "crc": rec_phy + 8 + rng.randrange(4), "phy": rec_phy + 28 + rng.randrange(8),
            "blen": blen_at + rng.randrange(4), "body": rng.choice(body)}[where]


def _scrubbed(cfg) -> int:
    """A run of the store during which the scrub (``core/scrub.py``, the
    services process's; here on a clock of its own) makes one pass, then a
    clean stop; returns the damaged ranges it found. A start reads the
    CommitLog only from the checkpoint's position on (issue 20), so damage
    below it, in the segment being written too, is the scrub's to find and
    the next start's to quarantine."""
    from shmq.core.scrub import Scrubber
    store, report = open_local(cfg)
    assert not report.quarantined
    clock = [0.0]
    scrub = Scrubber(store, cfg, clock=lambda: clock[0])
    for _ in range(100):                          # a bounded pass (32 MiB a step)
        clock[0] += 1.0
        scrub.step(0)
        if scrub.pos < 0 and scrub.checked:
            break
    assert scrub.pos < 0 and scrub.resume == store.state.flushed_pos
    close_clean(store)
    return scrub.found


def test_a_flipped_bit_below_the_flushed_position_loses_exactly_that_record(store_dir, caplog):
    """Issue 15's repro: one flipped body bit in the segment being written,
    below the flushed position, used to truncate there and zero every
    acknowledged record behind it, whose queue offsets then went to new
    messages. The scrub finds it; the next start quarantines that record."""
    cfg = small_config(store_dir)
    store, _ = open_local(cfg)
    recs = _fill(store, 50, size=400)
    close_clean(store)                            # flushed and checkpointed
    bad = recs[20]
    seg = _segment(store_dir, 0)
    with open(seg, "rb") as f:
        f.seek(bad[0])
        original = f.read(bad[1] - bad[0])
    _flip(seg, bad[1] - 50, 3)                    # inside its body
    with caplog.at_level("ERROR", logger="shmq.store"):
        assert _scrubbed(cfg) == 1
        store, report = open_local(cfg)
    (q,) = report.quarantined
    assert (q.phy, q.size, q.records) == (bad[0], bad[1] - bad[0], [("Cut", bad[2], bad[3])])
    assert report.records_lost == 1 and report.end == recs[-1][1]
    assert f"quarantined {q.size} bytes at CommitLog offset {bad[0]}" in report.summary()
    # the damaged bytes are kept for the operator, as they were on disk
    with open(q.copy, "rb") as f:
        kept_copy = f.read()
    assert kept_copy != original and len(kept_copy) == len(original)
    assert sum(a != b for a, b in zip(kept_copy, original)) == 1
    assert any(str(bad[0]) in r.getMessage() and q.copy in r.getMessage()
               for r in caplog.records if r.levelname == "ERROR")
    for qid in range(3):
        msgs = store.read_queue("Cut", qid)
        want = [r for r in recs if r[2] == qid and r is not bad]
        assert [(m.queue_offset, m.body) for m in msgs] == [(r[3], r[4]) for r in want]
        r = store.append(encode("Cut", [b"new"], queue_ids=qid, properties=b""))
        assert r.queue_offset == len([k for k in recs if k[2] == qid])   # no offset reused
    close_clean(store)
    store, report = open_local(cfg)               # the quarantine holds across restarts
    assert not report.quarantined and not report.records_lost
    assert [m.queue_offset for m in store.read_queue("Cut", bad[2])] == \
        [r[3] for r in recs if r[2] == bad[2] and r is not bad] + [len([k for k in recs if k[2] == bad[2]])]
    store.close()


@pytest.mark.parametrize("seed", range(stress_rounds(12)))
def test_a_flipped_bit_anywhere_checked_loses_exactly_the_flipped_record(store_dir, seed):
    """Bit flips in the fields recovery checks, at a random record of the
    segment being written, below the flushed position: the scrub finds
    each; the ConsumeQueues are lost too in some trials before the next
    start (the record's queue then comes from its own header, or from the
    holes after it)."""
    rng = random.Random(seed)
    cfg = small_config(store_dir)
    store, _ = open_local(cfg)
    recs = _fill(store, 120, size=rng.choice([50, 400, 900]))
    close_clean(store)
    last_seg = recs[-1][0] // SMALL_SEGMENT
    scanned = [r for r in recs if r[0] // SMALL_SEGMENT == last_seg]
    # one with a later record of its queue (whose arrival pads its offset
    # when neither its unit nor its header says where it was)
    bad = rng.choice([r for r in scanned if any(k[2] == r[2] and k[0] > r[0] for k in recs)])
    body_len = len(bad[4])
    _flip(_segment(store_dir, last_seg), _checked_bytes(bad[0], bad[1], body_len, rng) - last_seg
          * SMALL_SEGMENT, rng.randrange(8))
    assert _scrubbed(cfg) == 1
    if rng.random() < 0.3:
        shutil.rmtree(os.path.join(store_dir, "consumequeue"))
    store, report = open_local(cfg)
    assert [q.phy for q in report.quarantined] == [bad[0]]
    assert report.end == recs[-1][1]
    for qid in range(3):
        msgs = store.read_queue("Cut", qid)
        want = [r for r in recs if r[2] == qid and r is not bad]
        assert [(m.queue_offset, m.body) for m in msgs] == [(r[3], r[4]) for r in want]
        n = store.append(encode("Cut", [b"new"], queue_ids=qid, properties=b"")).queue_offset
        assert n == len([k for k in recs if k[2] == qid])    # no offset reused
    store.close()


def test_a_torn_last_record_is_truncated(store_dir):
    cfg = small_config(store_dir)
    store, _ = open_local(cfg)
    for i in range(5):
        r = store.append(encode("T", [b"z" * 2000], properties=b""))
    store.close()
    with open(_segment(store_dir, 0), "r+b") as f:
        f.seek(r.phy_offset + 1000)
        f.write(bytes(r.end - r.phy_offset - 1000))
    store, report = open_local(cfg)
    assert report.end == r.phy_offset and store.max_offset("T", 0) == 4


def test_a_missing_middle_segment_stops_recovery_and_changes_nothing(store_dir):
    cfg = small_config(store_dir)
    store, _ = open_local(cfg)
    for i in range(200):
        store.append(encode("M", [b"y" * 1000], properties=b""))
    close_clean(store)
    os.unlink(_segment(store_dir, 1))
    before = sorted(os.listdir(os.path.join(store_dir, "commitlog")))
    with pytest.raises(RecoveryError, match=f"{SMALL_SEGMENT:020d} is missing"):
        open_local(cfg)
    assert sorted(os.listdir(os.path.join(store_dir, "commitlog"))) == before


def test_a_segment_of_the_wrong_size_stops_recovery(store_dir):
    cfg = small_config(store_dir)
    store, _ = open_local(cfg)
    store.append(encode("W", [b"x"], properties=b""))
    close_clean(store)
    with pytest.raises(RecoveryError, match="mappedFileSizeCommitLog"):
        open_local(small_config(store_dir, mappedFileSizeCommitLog=2 * SMALL_SEGMENT))


def test_a_rocketmq5_record_stops_recovery_instead_of_truncating(store_dir):
    cfg = small_config(store_dir)
    store, _ = open_local(cfg)
    r = store.append(encode("V", [b"x"], properties=b""))
    store.close()
    with open(_segment(store_dir, 0), "r+b") as f:
        f.seek(r.phy_offset + 4)
        f.write((0xDAA320AB).to_bytes(4, "big"))
    with pytest.raises(RecoveryError, match="RocketMQ 5"):
        open_local(cfg)


def test_a_segment_left_half_made_by_a_crash_is_removed(store_dir):
    cfg = small_config(store_dir)
    store, _ = open_local(cfg)
    store.append(encode("H", [b"x"], properties=b""))
    store.close()
    stray = os.path.join(store_dir, "commitlog", f"{SMALL_SEGMENT:020d}.4242.1.tmp")
    with open(stray, "wb") as f:
        f.truncate(SMALL_SEGMENT)
    store, report = open_local(cfg)
    assert report.temp_files_removed == 1 and not os.path.exists(stray)
    assert [m.body for m in store.read_queue("H", 0)] == [b"x"]


# ------------------------------------------------- short (truncated) segments

def _fill(store, n, topic="Cut", queues=3, size=900):
    """n records over ``queues`` queues; [(phy, end, qid, queue offset, body)]."""
    out = []
    for i in range(n):
        body = b"%05d:" % i + bytes([i % 251]) * size
        r = store.append(encode(topic, [body], queue_ids=i % queues, properties=b""))
        out.append((int(r.phy_offset), int(r.end), i % queues, int(r.queue_offset), body))
    return out


def test_a_store_stopped_before_its_first_message_keeps_offset_zero(store_dir):
    """The flusher makes the next segment ahead of the writers only once they
    are in one: ahead of an empty store it was the only segment file, and
    the restarted store began there (its first message at the segment
    size, 1 GiB by default, segment 0 never made)."""
    from shmq.broker.flusher import Flusher
    cfg = small_config(store_dir)
    store, _ = open_local(cfg)
    f = Flusher(store, cb=None)
    f.prepare_next_segment()                      # nothing written: nothing made ahead
    assert f._preparing is None and not os.listdir(os.path.join(store_dir, "commitlog"))
    close_clean(store)
    store, _ = open_local(cfg)
    assert store.state.write_pos == 0
    (phy, *_), = _fill(store, 1)
    assert phy == 0
    f = Flusher(store, cb=None)
    f.prepare_next_segment()                      # in segment 0 now: segment 1 made ahead
    f._preparing.join()
    assert os.path.getsize(_segment(store_dir, 1)) == SMALL_SEGMENT
    close_clean(store)
    store, _ = open_local(cfg)
    assert store.state.get("cl_min_offset") == 0 and store.state.write_pos > 0
    close_clean(store)


@pytest.mark.parametrize("made_ahead", [False, True], ids=["alone", "next-made-ahead"])
def test_a_truncated_last_segment_is_repaired_keeps_every_whole_record_and_reuses_no_offset(
        store_dir, caplog, made_ahead):
    """The segment the writers were in, cut: also when the flusher had made
    the next one (empty) ahead of them, as it does from their first append
    to a segment — the cut one is still the last with data."""
    from shmq.broker.flusher import Flusher
    cfg = small_config(store_dir)
    store, _ = open_local(cfg)
    recs = _fill(store, 40)                      # ~37 KiB: one segment of 64 KiB
    if made_ahead:
        f = Flusher(store, cb=None)
        f.prepare_next_segment()
        f._preparing.join()
        assert os.path.getsize(_segment(store_dir, 1)) == SMALL_SEGMENT
    close_clean(store)                           # the checkpoint: all 40 flushed
    cut = recs[29][0] + 333                      # mid-record 29, not a multiple of 4096
    os.truncate(_segment(store_dir, 0), cut)
    with caplog.at_level("ERROR", logger="shmq.store"):
        store, report = open_local(cfg)
    name = f"{0:020d}"
    assert [(r.name, r.old_size, r.new_size, r.last) for r in report.segments_repaired] == \
        [(name, cut, SMALL_SEGMENT, True)]
    assert f"short segment: CommitLog segment {name} was {cut} bytes, extended to {SMALL_SEGMENT}" \
        in report.summary()
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert any(name in m and str(cut) in m and str(SMALL_SEGMENT) in m for m in errors), errors
    assert os.path.getsize(_segment(store_dir, 0)) == SMALL_SEGMENT
    # records 29..39 were flushed, then cut away: lost, and their queue
    # offsets are skipped (a consumer's committed offset stays valid)
    kept, lost = recs[:29], recs[29:]
    (q,) = report.quarantined
    assert q.phy == recs[29][0] and q.size == recs[-1][1] - recs[29][0]
    assert sorted(q.records) == sorted(("Cut", r[2], r[3]) for r in lost)
    assert report.records_lost == len(lost) and report.end == recs[-1][1]
    for qid in range(3):
        msgs = store.read_queue("Cut", qid)
        want = [r for r in kept if r[2] == qid]
        assert [(m.queue_offset, m.body) for m in msgs] == [(r[3], r[4]) for r in want]
    # new appends continue each queue after the offsets of what was lost
    for qid in range(3):
        r = store.append(encode("Cut", [b"after-%d" % qid], queue_ids=qid, properties=b""))
        assert r.queue_offset == len([k for k in recs if k[2] == qid])
        assert store.read_queue("Cut", qid)[-1].body == b"after-%d" % qid
    close_clean(store)
    store, report = open_local(cfg)              # and the repaired store opens cleanly again
    assert not report.segments_repaired and not report.quarantined
    assert store.max_offset("Cut", 2) == len([k for k in recs if k[2] == 2]) + 1


def test_a_truncated_middle_segment_loses_only_what_was_cut_and_reuses_no_offset(store_dir, caplog):
    cfg = small_config(store_dir)
    store, _ = open_local(cfg)
    recs = _fill(store, 150)                     # ~138 KiB: three segments
    close_clean(store)
    seg1 = [r for r in recs if r[0] < SMALL_SEGMENT]
    cut = seg1[50][0] + 100                      # inside record 50 of segment 0
    os.truncate(_segment(store_dir, 0), cut)
    with caplog.at_level("ERROR", logger="shmq.store"):
        store, report = open_local(cfg)
    lost = [r for r in seg1[50:]]
    (rep,) = report.segments_repaired
    assert (rep.old_size, rep.new_size, rep.last) == (cut, SMALL_SEGMENT, False)
    assert rep.records_end == seg1[50][0] and rep.lost_bytes == SMALL_SEGMENT - seg1[50][0]
    assert rep.records_lost == len(lost) == report.records_lost   # every queue has later records
    assert "records lost" in report.summary() and report.full_redispatch
    assert any(str(len(lost)) in r.getMessage() and rep.name in r.getMessage()
               for r in caplog.records if r.levelname == "ERROR")
    lost_phys = {r[0] for r in lost}
    for qid in range(3):
        msgs = store.read_queue("Cut", qid)
        want = [r for r in recs if r[2] == qid and r[0] not in lost_phys]
        # survivors keep their queue offsets; the lost ones' offsets are skipped
        assert [(m.queue_offset, m.body) for m in msgs] == [(r[3], r[4]) for r in want]
        r = store.append(encode("Cut", [b"new"], queue_ids=qid, properties=b""))
        assert r.queue_offset == 50 and store.read_queue("Cut", qid)[-1].body == b"new"
    close_clean(store)
    store, report = open_local(cfg)
    assert not report.segments_repaired and not report.records_lost
    assert len(store.read_queue("Cut", 0)) == 50 - len([r for r in lost if r[2] == 0]) + 1


def test_a_consumequeue_file_of_the_wrong_size_is_rebuilt(store_dir, caplog):
    cfg = small_config(store_dir)
    store, _ = open_local(cfg)
    _fill(store, 30, queues=1, size=10)
    close_clean(store)
    path = os.path.join(store_dir, "consumequeue", "Cut", "0", f"{0:020d}")
    os.truncate(path, 333)
    with caplog.at_level("ERROR", logger="shmq.store"):
        store, report = open_local(cfg)
    assert report.cq_files_rebuilt == [f"Cut/0/{0:020d}"] and "ConsumeQueue" in report.summary()
    assert any(path in r.getMessage() for r in caplog.records if r.levelname == "ERROR")
    assert [m.queue_offset for m in store.read_queue("Cut", 0)] == list(range(30))


def test_a_truncated_segment_in_the_simulated_layer_is_repaired():
    files = SimFileLayer()
    cfg = small_config(SIM_ROOT)
    store, _ = open_local(cfg, files)
    recs = _fill(store, 10)
    close_clean(store)
    f = files.files[f"{SIM_ROOT}/commitlog/{0:020d}"]
    f.data = bytearray(f.data[:recs[7][0] + 5])
    store, report = open_local(cfg, files)
    assert report.segments_repaired and report.end == recs[-1][1]   # 7..9 flushed: quarantined
    assert report.quarantined[0].records == [("Cut", r[2], r[3]) for r in recs[7:]]
    assert sum(len(store.read_queue("Cut", q)) for q in range(3)) == 7


def test_the_broker_starts_on_a_store_with_a_truncated_last_segment(tmp_path):
    from brokerproc import SMALL, start_broker
    from shmq.core.config import StoreConfig
    root = str(tmp_path / "store")
    seg = int(SMALL["mappedFileSizeCommitLog"])
    cfg = StoreConfig(storePathRootDir=root, mappedFileSizeCommitLog=seg,
                      maxMessageSize=int(SMALL["maxMessageSize"]), maxQueueSlots=4096)
    store, _ = open_local(cfg)
    recs = _fill(store, 20, topic="BrokerCut", queues=1)
    close_clean(store)
    os.truncate(os.path.join(root, "commitlog", f"{0:020d}"), recs[12][0] + 77)
    with start_broker(tmp_path, storePathRootDir=root) as b:
        assert b.store
        log = b.log()
    assert "extended to" in log and f"{0:020d}" in log
    store, report = open_local(cfg)
    assert [m.queue_offset for m in store.read_queue("BrokerCut", 0)] == list(range(12))


def test_units_at_offsets_out_of_order_land_each_at_its_own_offset(store_dir):
    """Re-dispatched records whose queue offsets repeat or jump (a queue's
    offset anomalies) get their units written at their own offsets, the
    later of two at one offset winning, across a ConsumeQueue file's end;
    nothing lands at an offset no record has. (The one-slice fast path
    was once chosen from the first and last offsets alone: [1, 1, 3] put
    the second record's unit at offset 2.)"""
    from shmq.core.layout import CQ_UNIT_DTYPE
    from shmq.core.recovery import _write_units
    store, _ = open_local(small_config(store_dir))
    cqs, upf = store.cqs, store.cqs.units_per_file
    qoffs = np.array([1, 1, 3, upf - 1, upf, upf + 2], np.int64)
    units = np.zeros(qoffs.shape[0], CQ_UNIT_DTYPE)
    units["phy_offset"] = [3000, 4100, 4600, 5000, 6000, 7000]
    units["size"] = 100
    assert _write_units(cqs, ("T", 0), qoffs, units, consecutive=False) == 6
    at = {q: cqs.unit("T", 0, q) for q in (0, 1, 2, 3, upf - 1, upf, upf + 1, upf + 2)}
    assert {q: u[0] for q, u in at.items()} == {0: 0, 1: 4100, 2: 0, 3: 4600, upf - 1: 5000,
                                               upf: 6000, upf + 1: 0, upf + 2: 7000}
    assert _write_units(cqs, ("T", 0), qoffs[2:], units[2:], consecutive=False) == 0  # as on disk
    close_clean(store)
