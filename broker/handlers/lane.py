"""The send lane: single sends from a connection's bytes to the store and
back in three kernel calls a chunk, not a Python path a send (issue 14).

A producer with sends in flight puts many SEND_MESSAGE(_V2) frames in one
``recv``. The way every request goes (``FrameDecoder`` → ``RemotingCommand``
→ ``send.prepare`` → ``send.append_group``) costs a worker ~45 µs of CPU
a send in Python. Here, before that decoder runs, the worker hands the
bytes it holds to ``read_sends`` (``core/_kernels/frames.py``), which
reads every complete frame it can take whole into a row of integers
(topic, queue, flags, where the body and properties are, the tags code,
the UNIQ_KEY's hash), stopping at the first it cannot. Then, in Python,
once a chunk: each topic's checks (the same remembered ``topic_for_send``
answer the send path keeps, or the chunk stops there), the queue checks;
``encode_sends`` writes the records, each queue's together; the store
appends each queue's run in one claim (``MessageStore.append``, the
duplicate window's check included); ``send_ok_frames`` writes every
answer. Whatever the lane does not take (another request, a batch, a
delay, a topic not yet known, anything unusual in a header) is the next
frame the decoder reads, the usual way, and the lane is tried again after
it when it was a send.

The lane runs only where it answers exactly as the send path would: no
ACL, no DEBUG log (which logs each request), a master that is not
SYNC_MASTER (whose answers wait for a slave), IPv4 hosts (the records'
fixed layout), the disk and the page cache not refusing sends. Under
SYNC_FLUSH a chunk's answers wait together, one parked reply of their
frames, for the flush of the chunk's last byte (a send saying WAIT=false
is answered at once); past syncFlushTimeout each is answered
FLUSH_DISK_TIMEOUT, as the send path answers. Elsewhere
every send goes the usual way. ``tests/test_lane.py`` holds the two ways
to the same stored bytes and answers.
"""
from __future__ import annotations

import logging
import time

import numpy as np

from shmq.core import sends as F
from shmq.core.records import EncodedBatch, group_bytes_limit, runs
from shmq.core.store import DuplicateResult
from shmq.ipc.codes import RequestCode as RC
from shmq.ipc.remoting import JSON, RemotingCommand, encode_head, send_ok_pieces

from ..config import SYNC_MASTER
from .send import _V1_SEND, _refuse_if_busy

log = logging.getLogger("shmq.handlers")

CHUNK = 64                      # frames a kernel call takes (answered before the next chunk)
# the request a chunk's parked answers stand for (Parking's ParkedSend: not oneway)
LANE_SEND = RemotingCommand(RC.SEND_MESSAGE_V2, serialize_type=JSON)
KEYS = F.keys(_V1_SEND)
# remoting.send_ok_head's JSON template, cut at its four fields
TEMPLATE, TEMPLATE_OFFS = F.joined(send_ok_pieces())
assert len(TEMPLATE_OFFS) == 6
_u8 = F.u8


def _spans(cuts: list, rec_pos: np.ndarray, limit: int):
    """Each queue's records (between two ``cuts``) as runs of at most
    ``limit`` bytes (``records.runs``, as the send path cuts a turn's
    sends): (first, end) of each run, in order."""
    for s, e in zip(cuts, cuts[1:]):
        if rec_pos[e] - rec_pos[s] <= limit:
            yield s, e
            continue
        for run in runs(range(s, e), limit, lambda k: int(rec_pos[k + 1] - rec_pos[k]),
                        lambda k: False):
            yield run[0], run[-1] + 1


def _before_a_repeated_key(out: np.ndarray, n: int) -> int:
    """The frames before the first whose UNIQ_KEY (hash) an earlier frame
    of the chunk carries: a chunk's queues are appended one after another,
    so a retry in the same chunk as its first send, to a queue appended
    first, would be stored and the first send taken for its duplicate. It
    starts the next chunk instead, and is answered as the duplicate it is."""
    seen = set()
    for i, k in enumerate(out[:n, F.F_KEY_HASH].tolist()):
        if k:
            if k in seen:
                return i
            seen.add(k)
    return n


class SendLane:
    """One worker's lane (its buffers are reused from chunk to chunk)."""

    def __init__(self, b):
        self.b = b
        self.cluster = _u8(b.cluster_prop.encode())
        self.prefix = _u8(b.msgid_prefix.encode())
        host, v6 = b.store_host_raw
        self.store_host = None if v6 else _u8(host)
        self.out = np.zeros((CHUNK, F.N_F), np.int64)
        self.scratch = np.zeros(1 << 16, np.uint8)
        self.recs = np.zeros(1 << 16, np.uint8)
        self.replies = np.zeros(CHUNK * (len(TEMPLATE) + 96), np.uint8)
        self.taken = 0          # sends taken (tests, stats)

    def open(self, peer) -> bool:
        """Whether sends from ``peer`` may take the lane now (see the
        module's header)."""
        b = self.b
        c = b.config
        return (b.acl is None and self.store_host is not None and not peer.born_raw[1]
                and c.brokerRole != SYNC_MASTER and not log.isEnabledFor(logging.DEBUG))

    def take(self, peer, buf: bytearray, pos: int) -> tuple[int, list]:
        """Take the single sends at ``buf[pos:]`` that the lane can (at
        most a chunk): append them and answer them. Returns (where the
        frames taken end, ``pos`` when none; answers as (bytes, …) for the
        connection)."""
        b = self.b
        end = len(buf)
        try:
            b.check_writable()
            b.check_disk()
            now = int(time.time() * 1000)
            _refuse_if_busy(b, now)
        except Exception:         # (BadRequest) the usual way answers each send
            return pos, []
        need = 2 * (end - pos) + CHUNK * (len(self.cluster) + 1)
        if self.scratch.shape[0] < need:
            self.scratch = np.zeros(max(need, 2 * self.scratch.shape[0]), np.uint8)
        out, scratch = self.out, self.scratch
        view = np.frombuffer(buf, np.uint8)
        view.flags.writeable = False
        try:
            n = F.read_sends(view, pos, end, CHUNK, KEYS, self.cluster,
                             b.config.store.maxMessageSize, out, scratch)
            if n and b.store.dedup_on:
                n = _before_a_repeated_key(out, n)
            if n:
                n, topics, tix, orflags = self._topics(out, n)
            if not n:
                return pos, []
            return int(out[n - 1, F.F_END]), self._append(peer, view, n, topics, tix, orflags, now)
        finally:
            del view             # (the decoder's bytearray may grow again)

    def _topics(self, out: np.ndarray, n: int):
        """Each topic's remembered checks (the send path's): the frames up
        to the first whose topic or queue the lane cannot take. Returns
        (frames kept, topic names, each frame's topic index, each frame's
        sysFlag bits to add)."""
        b = self.b
        epoch = b.store.state.get("config_epoch")
        cache = b.send_topics
        starts = np.flatnonzero(out[:n, F.F_NEW_TOPIC]).tolist()
        topics: list[str] = []
        tix = np.zeros(n, np.int64)
        orflags = np.zeros(n, np.int64)
        scratch = self.scratch
        for k, s in enumerate(starts):
            e = starts[k + 1] if k + 1 < len(starts) else n
            off, ln = int(out[s, F.F_TOPIC_OFF]), int(out[s, F.F_TOPIC_LEN])
            topic = scratch[off:off + ln].tobytes().decode()
            hit = cache.get(topic)
            if hit is None or hit[0] != epoch or topic.startswith(("%RETRY%", "%DLQ%")):
                return s, topics, tix, orflags
            tc = hit[1]
            over = np.flatnonzero(out[s:e, F.F_QID] >= max(tc.write_queue_nums,
                                                            tc.read_queue_nums))
            if over.shape[0]:
                e = n = s + int(over[0])
            try:
                i = topics.index(topic)
            except ValueError:
                i = len(topics)
                topics.append(topic)
            tix[s:e] = i
            if tc.filter_type == "MULTI_TAG":
                orflags[s:e] = 2               # send.MULTI_TAGS_FLAG
            if e >= n:                         # (cut short at a queue out of range)
                break
        return n, topics, tix, orflags

    def _append(self, peer, view, n: int, topics: list, tix, orflags, now: int) -> list:
        b = self.b
        out = self.out
        qids = out[:n, F.F_QID]
        keys = (tix[:n] << 32) | qids
        order = np.argsort(keys, kind="stable")
        total = int(out[:n, F.F_SIZE].sum())
        if self.recs.shape[0] < total:
            self.recs = np.zeros(max(total, 2 * self.recs.shape[0]), np.uint8)
        recs = self.recs
        rec_pos = np.empty(n + 1, np.int64)
        rec_pos[n] = total
        born = peer.attrs.get("_lane_born")
        if born is None:
            born = peer.attrs["_lane_born"] = _u8(peer.born_raw[0])
        F.encode_sends(view, self.scratch, out, n, order, orflags, born, self.store_host, now,
                       recs, rec_pos)
        phy = np.empty(n, np.int64)
        qoff = np.empty(n, np.int64)
        rqid = qids.copy()
        failed: dict[int, Exception] = {}
        sk = keys[order]
        cuts = [0] + (np.flatnonzero(sk[1:] != sk[:-1]) + 1).tolist() + [n]
        limit = group_bytes_limit(b.config.store.mappedFileSizeCommitLog)
        store = b.store
        dedup = store.dedup_on
        last = 0                         # the end of the chunk's last byte (SYNC_FLUSH)
        for s, e in _spans(cuts, rec_pos, limit):
            fi = order[s:e]
            first = int(fi[0])
            topic, qid = topics[int(tix[first])], int(qids[first])
            a = int(rec_pos[s])
            try:
                r = None
                if e - s > 1:
                    batch = EncodedBatch(topic=topic, buf=recs[a:int(rec_pos[e])],
                                         rec_pos=rec_pos[s:e] - a, sizes=out[fi, F.F_SIZE],
                                         queue_id=qid, tags_codes=out[fi, F.F_TAGS_CODE],
                                         store_timestamp=now, single_queue=True)
                    r = store.append(batch, 0, out[fi, F.F_KEY_HASH].tolist() if dedup else None)
                    if r is not None:
                        last = max(last, r.end)
                        phy[fi] = r.phy_offset + rec_pos[s:e] - a
                        qoff[fi] = r.queue_offset + np.arange(e - s)
                        self._stored(topic, qid, e - s, int(rec_pos[e]) - a)
                if r is None:            # one at a time: a key the window may hold
                    for k in range(s, e):
                        last = max(last, self._append_one(recs, rec_pos, k, int(order[k]), topic,
                                                          qid, now, dedup, phy, qoff, rqid))
            except Exception as ex:       # (ENOSPC, …) answered as the send path answers
                for f in fi.tolist():
                    failed.setdefault(f, ex)
        self.taken += n
        return self._answers(peer, n, phy, qoff, rqid, failed, last)

    def _append_one(self, recs, rec_pos, k, f, topic, qid, now, dedup, phy, qoff, rqid) -> int:
        out = self.out
        rec = recs[int(rec_pos[k]):int(rec_pos[k + 1])]
        r = self.b.store.append_record(topic, qid, rec, int(out[f, F.F_TAGS_CODE]), now,
                                       int(out[f, F.F_KEY_HASH]) if dedup else 0)
        phy[f], qoff[f] = r.phy_offset, r.queue_offset
        if r.__class__ is DuplicateResult:
            rqid[f] = r.queue_id              # where the first send's message is
        else:
            self._stored(topic, qid, 1, len(rec))
        return r.end

    def _stored(self, topic: str, qid: int, count: int, nbytes: int) -> None:
        """``send._stored``: count the records, wake a pull parked on the queue."""
        b = self.b
        b.put_count += count
        if b.stats.tally is not None:
            b.stats.tally.put(topic, count, nbytes)
        parking = b.parking
        if parking.pulls and (topic, qid) in parking.pulls:
            parking.arrived.add((topic, qid))

    def _answers(self, peer, n: int, phy, qoff, rqid, failed: dict, end: int) -> list:
        """The chunk's answers for the connection: SUCCESS frames (under
        SYNC_FLUSH, those not saying WAIT=false parked together until
        ``end``, the chunk's last byte, is flushed, as one reply), then
        the refusals."""
        b = self.b
        out = self.out
        opaque = np.ascontiguousarray(out[:n, F.F_OPAQUE])
        refused = []
        ok = None
        if failed:
            from . import _failed
            ok = np.array([f not in failed for f in range(n)])
            for f, ex in failed.items():
                cmd = RemotingCommand(RC.SEND_MESSAGE_V2, int(opaque[f]), serialize_type=JSON)
                refused.append(encode_head(_failed(peer, cmd, ex), 0))
        c = b.config
        parking = b.parking
        if c.store.sync_flush and b.store.state.flushed_pos < end:
            no_wait = out[:n, F.F_NO_WAIT] != 0
            wait = ~no_wait if ok is None else ok & ~no_wait
            if wait.any():
                parking.park_send(peer, LANE_SEND, self._frames(opaque, phy, rqid, qoff, wait),
                                  max(end, parking.last_end), c.store.syncFlushTimeout / 1000)
            ok = no_wait if ok is None else ok & no_wait
        answers = [self._frames(opaque, phy, rqid, qoff, ok)] if ok is None or ok.any() else []
        return answers + refused

    def _frames(self, opaque, phy, rqid, qoff, mask) -> bytes:
        """The SUCCESS frames of the sends ``mask`` keeps (None: all)."""
        if mask is not None:
            opaque, phy, rqid, qoff = opaque[mask], phy[mask], rqid[mask], qoff[mask]
        size = F.send_ok_frames(TEMPLATE, TEMPLATE_OFFS, self.prefix, opaque, phy, rqid, qoff,
                                opaque.shape[0], self.replies)
        return self.replies[:size].tobytes()
