"""A slave's CommitLog: the master's bytes written at the offsets they have there.

What replication (``broker/ha/``) hands this module is raw CommitLog: slices
of the master's segments that may begin or end inside a record.
``Replica.receive`` writes each slice where it lies on the master (a read's
slices one write each, never joined); ``dispatch``, once per slice or per
batch of them (``append`` does both), dispatches every record now whole, as
recovery does (``recovery._Dispatcher``: the ConsumeQueue unit
at the queue offset the master stamped in the record, PAD records as padding
units, the broker's tags-code rules), and publishes the new end in the
``StoreState`` like an append's publish: bytes and units first, then
``write_pos``, each queue's ``next_offset``, ``queue_pos``. Readers (pulls,
the IndexFile builder, the flusher) then see it as any appended record::

    cl_min ......... write_pos (published: whole records) .... received
                     └ dispatched up to here ┘ └ a record's head, waiting ┘

Invariants: ``received`` only grows and the bytes below it are the
master's; ``write_pos`` is a record boundary (or a segment's end, once the
BLANK that ends it and every byte after it arrived); nothing else appends to
a slave's store (the broker refuses writes; ``broker/ha``). After a restart
``received`` starts at the recovered end: recovery zeroed any tail past it,
and the master sends those bytes again.

An empty store (nothing ever written) takes the master's first offset, which
must start a segment (the master sends from a segment's start: its first
retained one, or RocketMQ's last); its queues then begin at the offsets of
their first records, as on a master whose old segments expired.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np

from . import _kernels as K
from . import layout as L
from .recovery import RecoveryReport, TagsCodeRule, _Dispatcher, _emit, _TAGS_KEY
from .store import MessageStore

log = logging.getLogger("shmq.store")
SCAN_ROWS = 4096


class ReplicaError(RuntimeError):
    """What the master sent does not continue this store: the connection
    is dropped (RocketMQ: "master pushed offset not equal the max phy offset
    in slave") and made again."""


class _Replay(_Dispatcher):
    """recovery's dispatcher, noting each queue's first offset seen."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.first: dict[tuple[str, int], int] = {}

    def _arrive(self, key, q0, phy):
        self.first.setdefault(key, q0)
        super()._arrive(key, q0, phy)


class Replica:
    def __init__(self, store: MessageStore,
                 tags_code_rules: Mapping[str, TagsCodeRule] | None = None):
        self.store = store
        self.seg = store.config.mappedFileSizeCommitLog
        self.received = self.dispatched = store.state.write_pos
        self.rep = RecoveryReport()
        self.replay = _Replay(store.cqs, {}, self.rep, dict(tags_code_rules or {}))
        self.published: dict[tuple[str, int], int] = {}
        self.out = np.empty((SCAN_ROWS, K.N_SCAN), dtype=np.int64)

    @property
    def empty(self) -> bool:
        st = self.store.state
        return self.received == st.write_pos == st.get("cl_min_offset") and not st.used_slots().size

    def append(self, phy: int, data) -> int:
        """Write ``data`` (the master's bytes at ``phy``), dispatch and
        publish what is whole; returns the new published end."""
        self.receive(phy, [data])
        return self.dispatch()

    def receive(self, phy: int, pieces) -> None:
        """Write ``pieces``, the master's bytes from ``phy`` on, back to back
        (a read's frame bodies: one write each, no joining copy), where they
        lie; ``dispatch`` then makes them visible. ``ReplicaError`` when
        ``phy`` is not where this store ends."""
        if phy != self.received:
            if not (self.empty and phy % self.seg == 0 and phy >= self.received):
                raise ReplicaError(f"the master sent offset {phy}; this store ends at "
                                   f"{self.received}")
            self._start_at(phy)
        cl = self.store.cl
        pos = phy
        for piece in pieces:
            data = memoryview(piece).cast("B")
            end, at = pos + len(data), pos
            while at < end:
                s = cl.segment_start(at)
                n = min(end, s + self.seg) - at
                cl.ensure_segment(s)
                cl.write(at, data[at - pos:at - pos + n])
                at += n
            pos = end
        self.received = pos

    def _start_at(self, phy: int) -> None:
        """An empty store begins at ``phy`` (a segment start): the empty
        segments before it go, and every position moves there."""
        st = self.store.state
        cl = self.store.cl
        for s in cl.list_segments():
            if s < phy:
                cl.delete_segment(s)
        with st.locked():
            for name in ("cl_min_offset", "claim_pos", "write_pos", "queue_pos", "flushed_pos",
                         "flush_request_pos", "cq_flushed_pos"):
                st.set(name, phy)
        log.info("replica: an empty store starts at the master's offset %d", phy)
        self.received = self.dispatched = phy

    def dispatch(self) -> int:
        """Dispatch and publish every record now whole (the module doc);
        returns the published end. ``ReplicaError`` when the bytes received
        are no records."""
        cl, out, replay = self.store.cl, self.out, self.replay
        pos, last_ts = self.dispatched, 0
        while pos < self.received:
            s = cl.segment_start(pos)
            buf = cl.map(s)
            lim = min(self.received, s + self.seg) - s
            n, p, status = K.scan_records(buf, pos - s, lim, s, False, K.CRC_TABLES, _TAGS_KEY, out)
            _emit(buf, s, out[:n], pos - s, p, replay.chunk, replay.pad, self.rep)
            if n:
                last_ts = int(out[n - 1, K.S_STORE_TS])
            pos = s + p
            if status == K.SCAN_FULL:
                continue
            if status == K.SCAN_BLANK:
                if self.received < s + self.seg:
                    break          # the segment's tail after the BLANK is still coming
                pos = s + self.seg
                continue
            if self._waiting(buf, p, lim, status):
                break
            raise ReplicaError(f"the master's bytes at {pos} are no record (scan status "
                               f"{status}); the slave's store ends at {pos}")
        if pos > self.dispatched:
            self._publish(pos, last_ts)
        return pos

    def _waiting(self, buf: np.ndarray, p: int, lim: int, status: int) -> bool:
        """Is the record at ``p`` only cut by the end of what arrived?"""
        if p + 8 > lim:
            return True
        size = int(buf[p:p + 4].view(">i4")[0])
        magic = int(buf[p + 4:p + 8].view(">i4")[0])
        return (status == K.SCAN_CORRUPT and p + size > lim and p + size <= buf.shape[0]
                and magic in (L.MESSAGE_MAGIC_I32, L.PAD_MAGIC_I32))

    def _publish(self, end: int, last_ts: int) -> None:
        """Publish up to ``end`` (the module doc's order)."""
        st = self.store.state
        replay = self.replay
        changed = [(k, v) for k, v in replay.new_max.items() if self.published.get(k) != v]
        with st.locked():
            slots = []
            for key, nxt in changed:
                slot = st.queue_slot(*key)
                if slot < 0:
                    slot = st.queue_slot_create(*key)
                    st.queue_min[slot] = replay.first.get(key, 0)
                    st.queue_cq_flushed[slot] = st.queue_min[slot]
                st.queue_claim[slot] = nxt
                slots.append((slot, nxt))
            if last_ts:
                st.set("last_store_ts", last_ts)
            st.set("claim_pos", end)
            st.set("write_pos", end)
            for slot, nxt in slots:
                st.queue_next[slot] = nxt
            st.set("queue_pos", end)
            if self.store.config.sync_flush:
                st.set("flush_request_pos", end)
        self.published.update(changed)
        self.dispatched = end
        if self.store.on_published is not None:
            self.store.on_published(-1)           # any queue may have moved
        if self.store.config.sync_flush and self.store.on_flush_request is not None:
            self.store.on_flush_request()
