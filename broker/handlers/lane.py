"""The send lane: single sends from a connection's bytes to the store and
back in four kernel calls a chunk, not a Python path a send (issue 14).

A producer with sends in flight puts many SEND_MESSAGE(_V2) frames in one
``recv``. The way every request goes (``FrameDecoder`` → ``RemotingCommand``
→ ``send.prepare`` → ``send.append_group``) costs a worker ~45 µs of CPU
a send in Python. Here, before that decoder runs, the worker hands the
bytes it holds (a whole frame or more) to ``read_sends``
(``core/_kernels/frames.py``),
which reads every complete frame it can take whole into a row of
integers (topic, queue, flags, where the body and properties are, the
tags code, the UNIQ_KEY's hash), stopping at the first it cannot. Then,
in Python, once a chunk: each topic's checks (the same remembered
``topic_for_send`` answer the send path keeps, or the chunk stops there)
and the queue checks; ``encode_sends`` writes the records, each queue's
run together; the store appends each run in one claim
(``MessageStore.append``, the duplicate window's check included; one by
one where the window may hold a key, or where a run is more than a claim
may take, as the send path does); ``place_answers`` and
``send_ok_frames`` write every answer. A chunk of one (a producer
sending one message at a time) skips the chunk's arrays (``_lone``).
Whatever the lane does not take (another request, a batch, a delay, a
topic not yet checked, anything unusual in a header) is the next frame
the decoder reads, the usual way, and the lane is tried again after it
when it was a send.

The lane runs only where it answers exactly as the send path would: no
ACL, no DEBUG log (which logs each request), a SYNC_MASTER only while a
slave is connected, IPv4 hosts (the records' fixed layout), the disk and
the page cache not refusing sends. Under SYNC_FLUSH, and on a SYNC_MASTER,
a chunk's answers wait together, one parked reply of their frames, for
the flush of the chunk's last byte and/or a slave's ack of it (a send
saying WAIT=false is answered at once); past syncFlushTimeout or
slaveTimeout each is answered FLUSH_DISK_TIMEOUT or FLUSH_SLAVE_TIMEOUT,
and a SYNC_MASTER whose slave fell haSlaveFallbehindMax behind answers
SLAVE_NOT_AVAILABLE, as the send path answers. Elsewhere every send goes
the usual way. ``tests/test_lane.py`` holds the two ways to the same
stored records and answers; ``tests/test_kernels.py`` the kernels to the
send path's bytes.
"""
from __future__ import annotations

import logging
import time

import numpy as np

from shmq.core import jit
from shmq.core import sends as F
from shmq.core.records import EncodedBatch, group_bytes_limit
from shmq.core.store import DuplicateResult
from shmq.ipc.codes import RequestCode as RC
from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.remoting import (JSON, RemotingCommand, decode_all, encode_head, send_ok_head,
                                send_ok_pieces)

from ..config import SYNC_MASTER
from .send import _V1_SEND, _refuse_if_busy, answer_wait, park_answer, stored

log = logging.getLogger("shmq.handlers")

CHUNK = 64                      # frames a kernel call takes (answered before the next chunk)
_SENDS = frozenset({RC.SEND_MESSAGE, RC.SEND_MESSAGE_V2})
# the request a chunk's parked answers stand for (Parking's ParkedSend: not oneway)
LANE_SEND = RemotingCommand(RC.SEND_MESSAGE_V2, serialize_type=JSON)
KEYS = F.keys(_V1_SEND)
# remoting.send_ok_head's JSON template, cut at its four fields
TEMPLATE, TEMPLATE_OFFS = F.joined(send_ok_pieces())
assert len(TEMPLATE_OFFS) == 6


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


def _checked(cache: dict, topic: str, epoch: int):
    """``topic``'s remembered checks (the send path's ``topic_for_send``
    answer, ``Broker.send_topics``) when they hold at ``epoch`` and the lane
    may take its sends; None: the usual way checks it."""
    hit = cache.get(topic)
    if hit is None or hit[0] != epoch or topic.startswith(("%RETRY%", "%DLQ%")):
        return None
    return hit[1]


def _coded(frames: bytes, code: int) -> bytes:
    """SUCCESS answer frames with ``code`` instead (a SYNC_MASTER's
    SLAVE_NOT_AVAILABLE: rare, so decoded and encoded again)."""
    replies = decode_all(frames)
    for r in replies:
        r.code = code
    return b"".join(encode_head(r, 0) for r in replies)


def _refusal(peer, opaque: int, ex: Exception) -> bytes:
    """The frame answering send ``opaque`` whose append raised ``ex``, as
    the send path answers it (``handlers._failed``)."""
    from . import _failed
    cmd = RemotingCommand(RC.SEND_MESSAGE_V2, opaque, serialize_type=JSON)
    return encode_head(_failed(peer, cmd, ex), 0)


class SendLane:
    """One worker's lane (its buffers are reused from chunk to chunk)."""

    def __init__(self, b):
        self.b = b
        # an answer may wait (SYNC_FLUSH, a SYNC_MASTER): else the lone send's
        # and the chunk's answers leave at once without a look (``send.answer_wait``)
        self.waits = b.config.store.sync_flush or b.config.brokerRole == SYNC_MASTER
        self.cluster = F.u8(b.cluster_prop.encode())
        self.prefix = F.u8(b.msgid_prefix.encode())
        host, v6 = b.store_host_raw
        self.store_host = None if v6 else F.u8(host)
        self.out = np.zeros((CHUNK, F.N_F), np.int64)
        self.out_ro = jit.readonly(self.out)      # (the kernels' inputs: read-only views)
        self._scratch(1 << 16)
        self.recs = np.zeros(1 << 16, np.uint8)
        self.srt = np.zeros((F.N_S, CHUNK), np.int64)
        self.groups = np.zeros((2, CHUNK + 1), np.int64)
        self.tix = np.zeros(CHUNK, np.int64)          # each frame's topic (an index)
        self.orflags = np.zeros(CHUNK, np.int64)      # each frame's sysFlag bits to add
        self.fields = np.zeros((4, CHUNK), np.int64)  # opaque, phy, queue, queue offset
        self.replies = np.zeros(CHUNK * (len(TEMPLATE) + 96), np.uint8)
        self.taken = 0          # sends taken (tests, stats)

    def _scratch(self, size: int) -> None:
        self.scratch = np.zeros(size, np.uint8)
        self.scratch_ro = jit.readonly(self.scratch)

    def _encode(self, peer, view, n: int, total: int, now: int) -> int:
        """``encode_sends`` of the ``n`` frames read (``total`` bytes of
        records) into ``recs``; the runs' count."""
        if self.recs.shape[0] < total:
            self.recs = np.zeros(max(total, 2 * self.recs.shape[0]), np.uint8)
        born = peer.attrs.get("_lane_born")
        if born is None:
            born = peer.attrs["_lane_born"] = F.u8(peer.born_raw[0])
        return F.encode_sends(view, self.scratch_ro, self.out_ro, n, self.tix, self.orflags,
                              born, self.store_host, now, self.recs, self.srt, self.groups)

    def open(self, peer) -> bool:
        """Whether sends from ``peer`` may take the lane now (see the
        module's header)."""
        b = self.b
        c = b.config
        return (b.acl is None and self.store_host is not None and not peer.born_raw[1]
                and (c.brokerRole != SYNC_MASTER or b.store.state.get("ha_slaves") > 0)
                and not log.isEnabledFor(logging.DEBUG))

    def take(self, peer, buf: bytearray, pos: int) -> tuple[int, list]:
        """Take the single sends at ``buf[pos:]`` that the lane can (at
        most a chunk): append them and answer them. Returns (where the
        frames taken end, ``pos`` when none; answers as (bytes, …) for the
        connection). The broker's permission needs no look here: a topic's
        remembered checks included it, and any change of it moves the
        tables' epoch, which forgets them."""
        b = self.b
        end = len(buf)
        if F.says_other_code(buf, pos, _SENDS):     # (a turn of pulls: no kernel call)
            return pos, []
        try:
            b.check_disk()
            now = int(time.time() * 1000)
            _refuse_if_busy(b, now)
        except Exception:         # (BadRequest) the usual way answers each send
            return pos, []
        need = 2 * (end - pos) + CHUNK * (len(self.cluster) + 1)
        if self.scratch.shape[0] < need:
            self._scratch(max(need, 2 * self.scratch.shape[0]))
        out = self.out
        view = np.frombuffer(buf, np.uint8)
        view.flags.writeable = False
        try:
            n = F.read_sends(view, pos, end, CHUNK, KEYS, self.cluster,
                             b.config.store.maxMessageSize, out, self.scratch)
            if n == 1:
                return self._lone(peer, view, pos, now)
            if n > 1 and b.store.dedup_on:
                n = _before_a_repeated_key(out, n)
            if n:
                n, topics = self._topics(out, n)
            if not n:
                return pos, []
            return int(out[n - 1, F.F_END]), self._append(peer, view, n, topics, now)
        finally:
            del view             # (the decoder's bytearray may grow again)

    def _topics(self, out: np.ndarray, n: int) -> tuple[int, list[str]]:
        """Each topic's remembered checks (the send path's): the frames up
        to the first whose topic or queue the lane cannot take; each
        frame's topic index (``tix``) and sysFlag bits (``orflags``).
        Returns (frames kept, the topics' names)."""
        b = self.b
        epoch = b.store.state.get("config_epoch")
        cache = b.send_topics
        new = out[:n, F.F_NEW_TOPIC]
        starts = [0] if n == 1 or not new[1:].any() else np.flatnonzero(new).tolist()
        topics: list[str] = []
        scratch, tix, orflags = self.scratch, self.tix, self.orflags
        for k, s in enumerate(starts):
            e = starts[k + 1] if k + 1 < len(starts) else n
            off, ln = out[s, F.F_TOPIC_OFF], out[s, F.F_TOPIC_LEN]
            topic = scratch[off:off + ln].tobytes().decode()
            tc = _checked(cache, topic, epoch)
            if tc is None:
                return s, topics
            limit = max(tc.write_queue_nums, tc.read_queue_nums)
            if out[s:e, F.F_QID].max() >= limit:
                e = n = s + int(np.argmax(out[s:e, F.F_QID] >= limit))
            try:
                i = topics.index(topic)
            except ValueError:
                i = len(topics)
                topics.append(topic)
            tix[s:e] = i
            orflags[s:e] = 2 if tc.filter_type == "MULTI_TAG" else 0   # send.MULTI_TAGS_FLAG
            if e >= n:                         # (cut short at a queue out of range)
                break
        return n, topics

    def _lone(self, peer, view, pos: int, now: int) -> tuple[int, list]:
        """The one send ``read_sends`` read (``out[0]``), as a chunk of one
        but without the chunk's arrays: its row read once as Python ints,
        its answer from ``send_ok_head``'s template. A producer sending one
        message at a time gives the worker one frame a turn; this costs it
        a fifth less than the way every request goes (the README's
        "A lone send takes the lane")."""
        b = self.b
        row = self.out[0].tolist()
        off = row[F.F_TOPIC_OFF]
        topic = self.scratch[off:off + row[F.F_TOPIC_LEN]].tobytes().decode()
        tc = _checked(b.send_topics, topic, b.store.state.get("config_epoch"))
        qid = row[F.F_QID]
        if tc is None or qid >= max(tc.write_queue_nums, tc.read_queue_nums):
            return pos, []
        self.tix[0] = 0
        self.orflags[0] = 2 if tc.filter_type == "MULTI_TAG" else 0     # send.MULTI_TAGS_FLAG
        size = row[F.F_SIZE]
        self._encode(peer, view, 1, size, now)
        del view        # (as in _append)
        store = b.store
        self.taken += 1
        try:
            r = store.append_record(topic, qid, self.recs[:size], row[F.F_TAGS_CODE], now,
                                    row[F.F_KEY_HASH] if store.dedup_on else 0)
        except Exception as ex:        # (ENOSPC, …) answered as the send path answers
            return row[F.F_END], [_refusal(peer, row[F.F_OPAQUE], ex)]
        if r.__class__ is DuplicateResult:
            qid = r.queue_id                   # where the first send's message is
        else:
            stored(b, topic, 1, size)
        frame = send_ok_head(JSON, row[F.F_OPAQUE], f"{b.msgid_prefix}{r.phy_offset:016X}", qid,
                             r.queue_offset)
        if row[F.F_NO_WAIT] or not self.waits:
            return row[F.F_END], [frame]
        wait = answer_wait(b, r.end)
        if wait is None:
            return row[F.F_END], [frame]
        return row[F.F_END], self._waits(peer, frame, b"", r.end, *wait)

    def _waits(self, peer, waiting: bytes, now: bytes, end: int, flush: bool, code: int,
               slave: bool) -> list:
        """The answers ``waiting`` (SUCCESS frames of the sends ending by
        ``end`` that wait: ``send.answer_wait``) parked as one reply until
        ``end`` is flushed and/or a slave acked it (SLAVE_NOT_AVAILABLE where
        no slave can take them: after the flush, or at once); ``now`` (those
        saying WAIT=false) answered at once. The answers to write now."""
        if code != R.SUCCESS and waiting:
            waiting = _coded(waiting, code)
        if not (flush or slave):
            return [f for f in (now, waiting) if f]
        if waiting:
            park_answer(self.b, peer, LANE_SEND, waiting, end, flush, slave)
        return [now] if now else []

    def _append(self, peer, view, n: int, topics: list, now: int) -> list:
        """Encode the chunk's records, a run per queue; append each run in
        one claim; answer."""
        b = self.b
        out, srt, groups = self.out, self.srt, self.groups
        ng = self._encode(peer, view, n, int(out[:n, F.F_SIZE].sum()), now)
        # No error's traceback may keep the decoder's buffer exported: a
        # failed append's exception, kept in ``failed`` below, is in a cycle
        # with this frame, and the next read that grows the buffer raised
        # BufferError until the garbage collector ran.
        del view
        starts, at = groups[:, :ng + 1].tolist()
        frames = srt[F.S_FRAME, :n].tolist()
        gphy, gq, gqid = [-1] * ng, [0] * ng, [0] * ng
        odd: list = []           # (frame, phy, queue, queue offset) answered one by one
        failed: dict[int, Exception] = {}
        store = b.store
        dedup = store.dedup_on
        limit = group_bytes_limit(b.config.store.mappedFileSizeCommitLog)
        last = 0                 # the end of the chunk's last byte (SYNC_FLUSH)
        for g in range(ng):
            s, e, a, z = starts[g], starts[g + 1], at[g], at[g + 1]
            f = frames[s]
            topic, qid = topics[int(self.tix[f])], int(out[f, F.F_QID])
            try:
                r = self._run(topic, qid, s, e, a, z, now, dedup) if z - a <= limit else None
                if r is None:    # one by one: a key the window may hold, or too many bytes
                    for k in range(s, e):
                        last = max(last, self._one(topic, qid, k, frames[k], a, now, dedup, odd))
                    continue
                last = max(last, r.end)
                if r.__class__ is DuplicateResult:     # (a run of one)
                    odd.append((f, r.phy_offset, r.queue_id, r.queue_offset))
                else:
                    gphy[g], gq[g], gqid[g] = r.phy_offset, r.queue_offset, qid
            except Exception as ex:       # (ENOSPC, …) answered as the send path answers
                for k in range(s, e):
                    failed.setdefault(frames[k], ex)
        self.taken += n
        return self._answers(peer, ng, gphy, gq, gqid, odd, failed, last)

    def _run(self, topic: str, qid: int, s: int, e: int, a: int, z: int, now: int, dedup: bool):
        """Append the run of records srt[:, s:e] (recs[a:z]) to one queue in
        one claim: its AppendResult, a DuplicateResult (a run of one), or
        None (one by one instead)."""
        srt, recs = self.srt, self.recs
        if e - s == 1:
            r = self.b.store.append_record(topic, qid, recs[a:z], int(srt[F.S_TAGS, s]), now,
                                           int(srt[F.S_KEY, s]) if dedup else 0)
        else:
            batch = EncodedBatch(topic=topic, buf=recs[a:z], rec_pos=srt[F.S_POS, s:e],
                                 sizes=srt[F.S_SIZE, s:e], queue_id=qid,
                                 tags_codes=srt[F.S_TAGS, s:e], store_timestamp=now,
                                 single_queue=True)
            r = self.b.store.append(batch, 0, srt[F.S_KEY, s:e].tolist() if dedup else None)
        if r is not None and r.__class__ is not DuplicateResult:
            stored(self.b, topic, e - s, z - a)
        return r

    def _one(self, topic: str, qid: int, k: int, f: int, a: int, now: int, dedup: bool,
             odd: list) -> int:
        """Append record srt[:, k] of the run starting at byte ``a`` alone;
        note its answer in ``odd``; its end."""
        srt = self.srt
        p = a + int(srt[F.S_POS, k])
        rec = self.recs[p:p + int(srt[F.S_SIZE, k])]
        r = self.b.store.append_record(topic, qid, rec, int(srt[F.S_TAGS, k]), now,
                                       int(srt[F.S_KEY, k]) if dedup else 0)
        if r.__class__ is DuplicateResult:
            qid = r.queue_id                   # where the first send's message is
        else:
            stored(self.b, topic, 1, len(rec))
        odd.append((f, r.phy_offset, qid, r.queue_offset))
        return r.end

    def _answers(self, peer, ng: int, gphy, gq, gqid, odd: list, failed: dict,
                 end: int) -> list:
        """The chunk's answers for the connection: SUCCESS frames (under
        SYNC_FLUSH or on a SYNC_MASTER, those not saying WAIT=false parked
        together until ``end``, the chunk's last byte, is flushed and/or a
        slave acked it, as one reply: ``_waits``), then the refusals."""
        runs = (np.array(gphy, np.int64), np.array(gq, np.int64), np.array(gqid, np.int64))
        refused = [_refusal(peer, int(self.out[f, F.F_OPAQUE]), ex) for f, ex in failed.items()]
        wait = answer_wait(self.b, end) if self.waits else None
        if wait is not None:
            return self._waits(peer, self._frames(ng, runs, odd, 1),
                               self._frames(ng, runs, odd, 2), end, *wait) + refused
        now = self._frames(ng, runs, odd, 0)
        return ([now] if now else []) + refused

    def _frames(self, ng: int, runs: tuple, odd: list, sel: int) -> bytes:
        """The SUCCESS frames of the sends ``sel`` picks (``place_answers``)."""
        out = self.out
        opaque, phy, qid, qoff = self.fields
        m = F.place_answers(out, self.srt, self.groups, ng, *runs, sel, opaque, phy, qid, qoff)
        for f, p, q, o in odd:
            if sel == 0 or bool(out[f, F.F_NO_WAIT]) == (sel == 2):
                opaque[m], phy[m], qid[m], qoff[m] = out[f, F.F_OPAQUE], p, q, o
                m += 1
        if not m:
            return b""
        size = F.send_ok_frames(TEMPLATE, TEMPLATE_OFFS, self.prefix, opaque, phy, qid, qoff, m,
                                self.replies)
        return self.replies[:size].tobytes()
