"""One pull's messages as columns: what a batch listener receives.

A push consumer with a batch listener (``register_batch_listener``) hands
each pull's messages to it as one ``MessageBatch``: the records exactly as
the broker stores and sends them (``data``, RocketMQ's record layout) and a
row per message saying where its fields are, as numpy arrays. No Python
object is made per message unless the listener asks for one (``message``,
``messages``, ``body``), so a listener that works on the arrays (sums,
filters, copies bodies with numpy) costs the consumer a few µs a pull
rather than a few µs a message. It is what a local consumer needs to keep
up with local producers (client/direct.py reads the same records from the
store's mapping).

The rows (``layout.P_*``) come from client/walk.py: numba's walk of the
records where the store's kernels are installed and loaded, else the same
walk in Python (a client installed without the ``broker`` extra). Each
record is checked as the decoder of ``MessageExt``s checks it: its frame,
field lengths adding up to its TOTALSIZE, its body CRC. A damaged record
is left out and described (``skipped``), and a frame that is not a
record ends the walk there.

The batch's arrays are read-only views of one (n, 8) int64 array; ``take``
makes a batch of some of the rows over the same ``data`` (a part the
listener did not acknowledge, kept for its retry).
"""
from __future__ import annotations

import logging
import zlib

import numpy as np

from shmq.core import layout as L
from shmq.core.layout import (P_BODY_LEN, P_BODY_POS, P_QUEUE_OFFSET, P_SIZE, P_START,
                              P_SYSFLAG, P_TOPIC_AT)

from .message import MessageExt, MessageQueue
from .walk import kept, walk

log = logging.getLogger("shmq.client")

_BORN_V6, _STORE_V6 = L.SYSFLAG_BORNHOST_V6, L.SYSFLAG_STOREHOST_V6
_R8 = np.arange(8)


class MessageBatch:
    """The messages of one pull of ``queue``, in queue order (see the module).

    ``len(batch)`` messages; ``data`` holds their records; the arrays
    ``queue_offsets``, ``body_offsets`` (where each body starts in ``data``),
    ``body_lengths``, ``sysflags`` and ``store_sizes`` (the record's
    TOTALSIZE) have one entry a message. A body the producer compressed
    (``sysflags & 1``) is stored compressed: ``body``/``bodies`` inflate it,
    the offsets point at it as stored. ``store_timestamps``,
    ``born_timestamps``, ``commit_log_offsets`` and ``reconsume_times`` are
    read on first use. ``message(i)``/``messages()`` give ``MessageExt``s
    for the listener that needs every field of a few (from a %RETRY% queue,
    with their original topic)."""

    __slots__ = ("queue", "data", "rows", "_pull", "retry_group", "_reconsume", "_fixed",
                 "_body_bytes")

    def __init__(self, queue: MessageQueue, data: bytes, rows: np.ndarray,
                 pull: tuple[str, str] | None = None):
        self.queue = queue
        self.data = data
        rows.flags.writeable = False
        self.rows = rows
        self._pull = pull                    # (MIN_OFFSET, MAX_OFFSET) of the pull
        self.retry_group: str | None = None  # set for a %RETRY% queue's batch: messages() restore
        self._reconsume: np.ndarray | None = None
        self._fixed: dict[str, np.ndarray] = {}
        self._body_bytes = -1

    def __len__(self) -> int:
        return self.rows.shape[0]

    def __repr__(self) -> str:
        offs = self.queue_offsets
        span = f"{offs[0]}..{offs[-1]}" if len(offs) else "none"
        return f"MessageBatch({self.queue}, {len(offs)} messages, queue offsets {span})"

    # ------------------------------------------------------------ columns
    @property
    def queue_offsets(self) -> np.ndarray:
        return self.rows[:, P_QUEUE_OFFSET]

    @property
    def body_offsets(self) -> np.ndarray:
        return self.rows[:, P_BODY_POS]

    @property
    def body_lengths(self) -> np.ndarray:
        return self.rows[:, P_BODY_LEN]

    @property
    def body_bytes(self) -> int:
        """The bodies' bytes as stored (``body_lengths``' sum), summed once:
        the process queue asks it as it holds the batch and as it lets go."""
        if self._body_bytes < 0:
            self._body_bytes = int(self.body_lengths.sum())
        return self._body_bytes

    @property
    def sysflags(self) -> np.ndarray:
        return self.rows[:, P_SYSFLAG]

    @property
    def store_sizes(self) -> np.ndarray:
        return self.rows[:, P_SIZE]

    def _i64_at(self, name: str, at: np.ndarray) -> np.ndarray:
        col = self._fixed.get(name)
        if col is None:
            a = np.frombuffer(self.data, np.uint8)
            col = a[at[:, None] + _R8].view(">i8").ravel().astype(np.int64)
            col.flags.writeable = False
            self._fixed[name] = col
        return col

    def _born_bytes(self) -> np.ndarray:
        return np.where(self.sysflags & _BORN_V6, 20, 8)

    @property
    def born_timestamps(self) -> np.ndarray:
        return self._i64_at("born", self.rows[:, P_START] + L.OFF_BORNTIMESTAMP)

    @property
    def store_timestamps(self) -> np.ndarray:
        return self._i64_at("store", self.rows[:, P_START] + L.OFF_BORNHOST + self._born_bytes())

    @property
    def commit_log_offsets(self) -> np.ndarray:
        return self._i64_at("phy", self.rows[:, P_START] + L.OFF_PHYSICALOFFSET)

    @property
    def reconsume_times(self) -> np.ndarray:
        """How many times each message was consumed before (writable: the
        consumer counts a retry it keeps here)."""
        if self._reconsume is None:
            a = np.frombuffer(self.data, np.uint8)
            at = self.rows[:, P_START] + 56 + self._born_bytes() + \
                np.where(self.sysflags & _STORE_V6, 20, 8)
            self._reconsume = a[at[:, None] + _R8[:4]].view(">i4").ravel().astype(np.int64)
        return self._reconsume

    # ------------------------------------------------------------ per message
    def body(self, i: int) -> bytes:
        r = self.rows[i]
        raw = self.data[r[P_BODY_POS]:r[P_BODY_POS] + r[P_BODY_LEN]]
        return _inflated(raw, int(r[P_SYSFLAG]), self, i)

    def bodies(self) -> list[bytes]:
        data = self.data
        starts = self.body_offsets.tolist()
        out = [data[s:s + n] for s, n in zip(starts, self.body_lengths.tolist())]
        if (self.sysflags & L.SYSFLAG_COMPRESSED).any():
            for i in np.flatnonzero(self.sysflags & L.SYSFLAG_COMPRESSED).tolist():
                out[i] = _inflated(out[i], L.SYSFLAG_COMPRESSED, self, i)
        return out

    def message(self, i: int) -> MessageExt:
        r = self.rows[i].tolist()
        start = r[P_START]
        m = MessageExt(self.data, start, self.queue.broker_name, r[P_SIZE], r[P_QUEUE_OFFSET],
                       r[P_SYSFLAG], r[P_BODY_LEN], r[P_TOPIC_AT] - start, self._pull)
        if r[P_SYSFLAG] & L.SYSFLAG_COMPRESSED:
            m.body = self.body(i)
        if self._reconsume is not None:
            m.reconsume_times = int(self._reconsume[i])
        if self.retry_group is not None:
            from .retry import restore_retry_topic
            restore_retry_topic([m], self.retry_group)
        return m

    def messages(self) -> list[MessageExt]:
        return [self.message(i) for i in range(len(self))]

    def take(self, which) -> "MessageBatch":
        """A batch of the rows ``which`` (indexes or a mask) over the same data."""
        b = MessageBatch(self.queue, self.data, self.rows[which], self._pull)
        b.retry_group = self.retry_group
        if self._reconsume is not None:
            b._reconsume = self._reconsume[which].copy()
        return b


def _inflated(raw: bytes, sysflag: int, batch: MessageBatch, i: int) -> bytes:
    if not sysflag & L.SYSFLAG_COMPRESSED:
        return raw
    try:
        return zlib.decompress(raw)
    except zlib.error as e:
        log.warning("message at %s:%d: body not zlib (%s); kept as stored", batch.queue,
                    int(batch.queue_offsets[i]), e)
        return raw


# ---------------------------------------------------------------- a pull's batch
def build_batch(data: bytes, queue: MessageQueue, pull: tuple[str, str] | None = None,
                check_crc: bool = True, skipped: list | None = None) -> MessageBatch:
    """The batch of a pull's records ``data``. A damaged record is left out
    and described in ``skipped`` as (its queue offset or None, why, framed),
    as ``decode_messages`` describes it; without ``skipped`` it raises
    CorruptMessage."""
    if not isinstance(data, bytes):
        data = bytes(data)
    rows, stop = walk(data, check_crc)
    return MessageBatch(queue, data, kept(data, rows, stop, skipped), pull)


__all__ = ["MessageBatch", "build_batch"]
