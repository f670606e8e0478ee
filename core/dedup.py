"""Duplicate sends: the window of recent UNIQ_KEYs, shared by every appender.

A producer that loses a reply (a worker killed after the append, a broken
connection, a timeout) sends the same message again, with the same
``UNIQ_KEY`` property (every RocketMQ 4.x client sets it, once per message).
Kafka's idempotent producer and NATS's ``Msg-Id`` window drop such retries;
RocketMQ stores them twice. shmq keeps, in the store's shared state
(``StoreState``), a window of the last ``N`` keyed appends of the whole
store (``sendDedupWindowSize``), and an append whose key is in it, for the
same topic, is not stored: it gets the first append's result.

Why one window for the store and not one per queue: a RocketMQ client whose
send failed retries on *another* queue of the topic (``selectOneMessageQueue``
skips the broker and the queue that failed: with one broker, the next queue),
so a window per queue would miss the very retries it is for. The window
counts appends (a batch is one; single sends a worker appends together in
one claim are one each, ``MessageStore.append``'s ``each``: each entry's
``phy`` is its own record's), so at full load on a small host it spans
seconds of traffic, far more than a reconnect and a resend take.

Structure (int64 words, after the queue table): ``2N`` bucket heads and
``N`` entries ``(hash, prev, phy)``; entry ``p % N`` holds the ``p``-th keyed
append (``dedup_seq`` counts them), ``hash`` is the CRC32 of the key (never
0), ``prev`` the previous position in the same bucket (+1; 0: none), ``phy``
the CommitLog offset of the append's first record. Heads also hold position
+ 1. A lookup walks its bucket's chain from the head while positions are
inside the window ``[dedup_seq - N, dedup_seq)`` (positions fall along a
chain, so the walk ends): LZ77's hash chains, bounded (``MAX_STEPS``
entries, ``MAX_CANDIDATES`` records read back, newest first). All of it
happens under the append lock, inside the claim, so a retry racing its
original on another worker sees the original's entry the moment it is
claimed.

Entries are hints, checked against the store before they count: a hit reads
the record at ``phy`` and compares its topic and ``UNIQ_KEY`` (for a batch,
every record's, in order) with the new append's. So an entry whose append
was rolled back or padded (its writer killed), a CRC32 collision, or a
stale entry after a rollback reused the range, can only cost a read; it
never turns a new message away. An entry is written before its claim is
made (``dedup_seq`` before the head, both before ``claim_seq``): a writer
killed between them leaves an entry that points at nothing, never a claim
without its entry. A hit on a claim not yet published waits until it is
published or gone (repairing a dead writer's claim, as any appender waiting
for its turn does) and looks again.

After a restart the owner refills the window from the store
(``rebuild``): the last ``N`` keyed records of all queues, by CommitLog
offset, so a retry that crosses a broker restart is still caught. Their
keys are hashed in place by a kernel (``K.uniq_hashes``) over ranges read
ahead: 0.1-0.2 s cold for the default 65,536 (read back one by one in
Python it took 1-2 s, issue 20). A clean stop saves the window instead
(``save``: ``<root>/dedup_window``, the words as they are, with the
CommitLog end and the window's length they belong to and a CRC), and the
next start after it takes them back (``restore``) when the store ends where
the file says and the length is the same; otherwise, and after any abnormal
stop, it rebuilds. The file is removed when read, so it is never older than
the stop before the start that reads it (and its entries are hints, checked
before they count, in any case).
"""
from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass

import numpy as np

from . import _kernels as K
from . import layout as L
from . import records as R

UNIQ = b"UNIQ_KEY\x01"
ENT_WORDS = 3            # hash, prev + 1, phy (state.DEDUP_WORDS_PER_ENTRY adds two heads)
# A lookup (append lock held) walks at most this many chain entries and reads
# back at most this many records whose hash matches, newest first.
MAX_STEPS = 256
MAX_CANDIDATES = 8


SNAPSHOT = "dedup_window"
_SNAP_HEAD = struct.Struct(">8sqqqI")     # magic, entries, dedup_seq, CommitLog end, CRC32 of the words
_SNAP_MAGIC = b"SHMQDDW1"


def _window_words(st) -> memoryview:
    """The window's words in the state: the 2N bucket heads, then the N entries."""
    return st.words[st.dedup_heads:st.dedup_ents + st.dedup_entries * ENT_WORDS]


def save(store, root: str) -> None:
    """At a clean stop (no appender left, everything flushed): the window,
    for ``restore`` at the next start."""
    st = store.state
    if not st.dedup_entries:
        return
    words = _window_words(st).tobytes()
    head = _SNAP_HEAD.pack(_SNAP_MAGIC, st.dedup_entries, st.get("dedup_seq"), int(st.write_pos),
                           zlib.crc32(words))
    store.files.write_durable(os.path.join(root, SNAPSHOT), head + words)


def restore(store, root: str, end: int, clean: bool) -> bool:
    """The window a clean stop saved, when the start follows that stop
    (``clean``: recovery found no abort file) and the store ends at ``end``
    with this window length (owner only, before any appender attaches).
    The file is removed either way. Whether it was taken."""
    st = store.state
    path = os.path.join(root, SNAPSHOT)
    data = store.files.read_bytes(path)
    if data is None:
        return False
    store.files.unlink(path)
    if not clean or not st.dedup_entries or len(data) < _SNAP_HEAD.size:
        return False
    magic, n, seq, at, crc = _SNAP_HEAD.unpack_from(data)
    words = data[_SNAP_HEAD.size:]
    dst = _window_words(st)
    if (magic, n, at) != (_SNAP_MAGIC, st.dedup_entries, end) or len(words) != dst.nbytes \
            or zlib.crc32(words) != crc or seq < 0:
        return False
    dst[:] = memoryview(words).cast("q")
    st.set("dedup_seq", seq)
    return True


def hash_of(key: bytes) -> int:
    """A key's hash in the window: its CRC32, never 0 (0 means no key)."""
    return zlib.crc32(key) or 1


def key_of(props) -> bytes | None:
    """The UNIQ_KEY in a properties string (bytes), or None."""
    i = props.find(UNIQ)
    while i > 0 and props[i - 1] != 2:   # a value ending in "UNIQ_KEY": look further
        i = props.find(UNIQ, i + 1)
    if i < 0:
        return None
    i += 9
    j = props.find(b"\x02", i)
    k = props[i:j] if j >= 0 else props[i:]
    return bytes(k) if k else None


def key_hash(props: bytes) -> int:
    """``hash_of`` the UNIQ_KEY in ``props``, or 0 when it has none. Once per
    keyed send: the usual case (the key's name right after a separator) is
    inlined, 0.3 us less than ``hash_of(key_of(props))``."""
    i = props.find(UNIQ)
    if i < 0:
        return 0
    if i and props[i - 1] != 2:
        k = key_of(props)
        return 0 if k is None else hash_of(k)
    i += 9
    j = props.find(b"\x02", i)
    if j == i or i == len(props):
        return 0
    return zlib.crc32(props[i:j] if j >= 0 else props[i:]) or 1


@dataclass(slots=True)
class RecordKey:
    """What a duplicate check reads of a stored record."""
    size: int
    queue_id: int
    queue_offset: int
    sysflag: int
    store_ts: int
    reconsume: int
    topic: bytes
    key: bytes | None


_FIXED = struct.Struct(">iiiiiqqi")   # TOTALSIZE, MAGIC, BODYCRC, QUEUEID, FLAG, QUEUEOFFSET,
                                      # PHYSICALOFFSET, SYSFLAG
_TS = struct.Struct(">q")
_AFTER_HOST = struct.Struct(">iqi")   # RECONSUMETIMES, PREPAREDTRANSACTIONOFFSET, BODYLEN
_PROPS_LEN = struct.Struct(">h")


def read_record_key(mv: memoryview, pos: int) -> RecordKey | None:
    """The record at ``pos`` of ``mv`` (bytes of a CommitLog segment or of a
    batch), or None when no whole message record is there (a BLANK, a PAD,
    zeros, the middle of a record)."""
    end = len(mv)
    if pos + L.RECORD_FIXED_BYTES > end:
        return None
    size, magic, _, qid, _, qoff, _, sysflag = _FIXED.unpack_from(mv, pos)
    if magic != L.MESSAGE_MAGIC_I32 or size < L.RECORD_FIXED_BYTES or pos + size > end:
        return None
    p = pos + L.OFF_BORNHOST + (L.HOST_V6_BYTES if sysflag & L.SYSFLAG_BORNHOST_V6 else
                                L.HOST_V4_BYTES)
    store_ts = _TS.unpack_from(mv, p)[0]
    p += 8 + (L.HOST_V6_BYTES if sysflag & L.SYSFLAG_STOREHOST_V6 else L.HOST_V4_BYTES)
    reconsume, _, blen = _AFTER_HOST.unpack_from(mv, p)
    p += 16 + blen
    rec_end = pos + size
    if blen < 0 or p + 3 > rec_end:
        return None
    tlen = mv[p]
    topic = bytes(mv[p + 1:p + 1 + tlen])
    p += 1 + tlen
    if p + 2 > rec_end:
        return None
    plen = _PROPS_LEN.unpack_from(mv, p)[0]
    if plen < 0 or p + 2 + plen != rec_end:
        return None
    key = key_of(bytes(mv[p + 2:rec_end]))
    return RecordKey(size, qid, qoff, sysflag, store_ts, reconsume, topic, key)


def dedupable_topic(topic: str) -> bool:
    """Topics whose sends are checked: not a consumer's %RETRY% or %DLQ%
    topic, where one message is rightly stored again each time it fails."""
    return not (topic.startswith("%RETRY%") or topic.startswith("%DLQ%"))


def rebuild(store) -> int:
    """Refill the window of a freshly recovered store from the last
    ``dedup_entries`` keyed records of its queues, oldest first (owner
    only, before any appender attaches). Returns the entries made.

    The candidates are the last ``N`` units of each queue (read ahead, all
    queues' at once), newest first by CommitLog offset; their keys are
    hashed in the mapped segments by ``K.uniq_hashes`` (no Python step per
    record), a stretch at a time, each stretch no longer than the entries
    still missing, read ahead first (``CommitLog.will_need``: one large
    read, not a fault a page): the newest ``N`` records are usually all it
    reads."""
    st = store.state
    n = st.dedup_entries
    if not n:
        return 0
    spans = [(topic, qid, max(int(st.queue_min[slot]), int(st.queue_next[slot]) - n),
              int(st.queue_next[slot]))
             for slot, topic, qid in st.iter_queues() if dedupable_topic(topic)]
    upf = store.cqs.units_per_file
    for topic, qid, lo, mx in spans:                          # every queue's reads at once
        for at in range(lo - lo % upf, mx, upf):
            store.cqs.will_need(topic, qid, max(at, lo), min(mx, at + upf) - max(at, lo))
    phys, sizes = [], []
    for topic, qid, lo, mx in spans:
        while lo < mx:
            units = store.cqs.units(topic, qid, lo, mx - lo)
            if units is None or not units.shape[0]:
                break
            lo += units.shape[0]
            keep = units["size"] != K.CQ_PAD_SIZE             # not padding units
            phys.append(units["phy_offset"][keep].astype(np.int64))
            sizes.append(units["size"][keep].astype(np.int64))
    if not phys:
        return 0
    allp, first = np.unique(np.concatenate(phys), return_index=True)
    alls = np.concatenate(sizes)[first]
    inside = (allp >= st.get("cl_min_offset")) & (allp < st.write_pos)
    allp = np.ascontiguousarray(allp[inside][::-1])            # newest first
    alls = np.ascontiguousarray(alls[inside][::-1])
    seg = store.config.mappedFileSizeCommitLog
    picked_p, picked_h = [], []
    got = i = 0
    while i < allp.shape[0] and got < n:
        j = min(allp.shape[0], i + n - got)
        store.cl.will_need(int(allp[j - 1]), int(allp[i] + alls[i]))
        starts = allp[i:j] - allp[i:j] % seg
        cuts = [0, *(np.flatnonzero(starts[1:] != starts[:-1]) + 1).tolist(), j - i]
        for a, b in zip(cuts, cuts[1:]):                      # one segment at a time
            p, sz = allp[i + a:i + b], alls[i + a:i + b]
            h = R.uniq_hashes(store.cl.map(int(starts[a])), int(starts[a]), p, sz)
            keyed = h != 0
            picked_p.append(p[keyed])
            picked_h.append(h[keyed])
            got += int(keyed.sum())
        i = j
    if not got:
        return 0
    phy_new = np.concatenate(picked_p)[:n][::-1].tolist()      # inserted oldest first
    h_new = np.concatenate(picked_h)[:n][::-1].tolist()
    for h, phy in zip(h_new, phy_new):
        store.dedup_add(h, phy)
    return len(phy_new)
