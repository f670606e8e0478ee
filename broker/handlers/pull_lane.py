"""The pull lane: the pulls a consumer pipelines, read from a connection's
bytes a chunk at a time by one kernel call, not a ``RemotingCommand`` a
pull (issue 14).

A push consumer keeps a pull in flight on each of its queues, so a worker
serving one reads several PULL_MESSAGE frames in one ``recv``. The way
every request goes (``FrameDecoder`` → ``decode_json_header`` → a
``RemotingCommand`` and its dict → ``handlers/pull.py``) spent a third of
a pipelined pull's ~45–60 µs of worker CPU reading the header and
checking what the chunk's pulls share. Here, when a connection holds two
whole frames or more, ``read_pulls`` (``core/_kernels/frames.py``) reads
every pull it can take whole into a row of integers (the group's, topic's,
subscription's and expressionType's names where ``scratch`` holds them,
queue, offset, maxMsgNums, sysFlag, commitOffset, and whether the names
differ from the pull before's), stopping at the first it cannot. Then, in
Python: the checks a run of pulls with the same names shares, once a run
(``pull.topic_and_sub``: the same remembered answers), and for each pull
the queue's check, its commit, the read and the reply's head
(``pull.read``, ``pull.found_body``: what ``handlers/pull.py`` runs).

The lane answers the pulls that find records (SUCCESS) and those that find
none and do not wait (PULL_RETRY_IMMEDIATELY past records the filter
skipped, PULL_OFFSET_MOVED, PULL_NOT_FOUND without PULL_SUSPEND: the codes
``pull.status_code`` gives the handler). It stops, taking nothing of it, at
a pull that would be refused (a check, the queue id, a commitOffset missing
where it is needed, the subscription's error) or would park (nothing found,
PULL_SUSPEND set), and the way every request goes runs that one and
answers it. The offsets the chunk's pulls commit are written together,
under one hold of the offset table's lock, before that one runs (it may
commit the same offset again). It runs where ``handle`` does nothing
before a pull's handler
(``Handlers.pulls_direct``: no ACL, no DEBUG log). ``tests/test_lane.py``
holds the lane and the usual way to the same answers.
"""
from __future__ import annotations

import logging

import numpy as np

from shmq.core import sends as F
from shmq.core.store import GetMessageStatus
from shmq.ipc.codes import RequestCode as RC
from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.headers import PULL_COMMIT_OFFSET, PULL_HEADER, PULL_SUSPEND
from shmq.ipc.remoting import JSON, pull_reply_head

from ..config import SLAVE
from . import pull as P

log = logging.getLogger("shmq.handlers")

CHUNK = 64                      # pulls a kernel call reads
# the fields read_pulls reads, in its slots' order (core/_kernels/frames.py Y_*)
NAMES = ("consumerGroup", "topic", "queueId", "queueOffset", "maxMsgNums", "sysFlag",
         "commitOffset", "subscription", "expressionType")
assert set(NAMES) <= {f.name for f in PULL_HEADER}
KEYS = F.pull_keys(NAMES)
_FOUND = GetMessageStatus.FOUND
_SUCCESS, _FOUND_REMARK = P.PULL_STATUS_CODE[_FOUND]
_PULLS = frozenset({RC.PULL_MESSAGE})
assert _SUCCESS == R.SUCCESS


class PullLane:
    """One worker's pull lane (its buffers are reused from chunk to chunk)."""

    def __init__(self, b):
        self.b = b
        self.out = np.zeros((CHUNK, F.N_P), np.int64)
        self.scratch = np.zeros(1 << 14, np.uint8)
        self.taken = 0          # pulls taken (tests, stats)

    def take(self, buf: bytearray, pos: int, window: int = CHUNK) -> tuple[int, list]:
        """Take the pulls at ``buf[pos:]`` that the lane can (at most
        ``window``): run them. Returns (where the pulls taken end, ``pos``
        when none; their answers as (head, body pieces), in order)."""
        if F.says_other_code(buf, pos, _PULLS):     # (a run of sends: no kernel call)
            return pos, []
        end = len(buf)
        if self.scratch.shape[0] < end - pos:
            self.scratch = np.zeros(max(end - pos, 2 * self.scratch.shape[0]), np.uint8)
        view = np.frombuffer(buf, np.uint8)
        view.flags.writeable = False
        try:
            n = F.read_pulls(view, pos, end, window, KEYS, self.out, self.scratch)
        finally:
            del view             # (the decoder's bytearray may grow again)
        if not n:
            return pos, []
        rows = self.out[:n].tolist()
        answers: list = []
        commits: dict = {}
        taken = pos
        try:
            for row in rows:
                if row[F.P_NEW]:
                    names = self._names(row)
                    if names is None:
                        break
                    group, topic, tc, sub = names
                answer = self._one(row, group, topic, tc, sub, commits)
                if answer is None:
                    break
                answers.append(answer)
                taken = row[F.P_END]
        except Exception:     # (an OSError reading, …) the usual way runs it and answers
            log.debug("the pull lane stops at a pull that raised", exc_info=True)
        finally:
            if commits:
                self.b.registry.commit_offsets(commits)
        self.taken += len(answers)
        return taken, answers

    def _names(self, row: list):
        """(group, topic, topic config, subscription) of a run of pulls
        with the same names, or None where the usual way must answer."""
        s = self.scratch
        group = s[row[F.P_GROUP_OFF]:row[F.P_GROUP_OFF] + row[F.P_GROUP_LEN]].tobytes().decode()
        topic = s[row[F.P_TOPIC_OFF]:row[F.P_TOPIC_OFF] + row[F.P_TOPIC_LEN]].tobytes().decode()
        o = row[F.P_SUB_OFF]
        expr = None if o < 0 else s[o:o + row[F.P_SUB_LEN]].tobytes().decode()
        o = row[F.P_TYPE_OFF]
        etype = None if o < 0 else s[o:o + row[F.P_TYPE_LEN]].tobytes().decode()
        try:
            tc, sub = P.topic_and_sub(self.b, group, topic, expr, etype)
        except Exception:               # a refusal (BadRequest): answered the usual way
            return None
        if sub.error is not None:
            return None
        return group, topic, tc, sub

    def _one(self, row: list, group: str, topic: str, tc, sub, commits: dict):
        """One pull's answer (head, pieces), or None where the usual way
        must answer it (a refusal, or a pull that parks). The offset it
        commits goes into ``commits``, committed once the chunk is read
        (before the pull the lane stops at runs: in the order the pulls
        came)."""
        b = self.b
        c = b.config
        qid = row[F.P_QID]
        if not 0 <= qid < tc.read_queue_nums:
            return None
        if row[F.P_SYSFLAG] & PULL_COMMIT_OFFSET and c.brokerRole != SLAVE:
            if not row[F.P_HAS_COMMIT]:
                return None
            commits[topic, group, qid] = row[F.P_COMMIT]
        offset = row[F.P_OFFSET]
        r, cold = P.read(b, topic, qid, offset, row[F.P_MAX], sub)
        if r.status is _FOUND:
            code, remark = _SUCCESS, _FOUND_REMARK
            parts, nbytes = P.found_body(b, r, topic, group, cold)
        else:
            code, remark = P.status_code(r.status, offset)
            if code == R.PULL_NOT_FOUND and row[F.P_SYSFLAG] & PULL_SUSPEND:
                return None          # it parks: the usual way keeps its command
            parts, nbytes = (), 0
        head = pull_reply_head(JSON, row[F.P_OPAQUE], code, remark,
                               P.suggest(b, group, cold) if c.slaveReadEnable else 0,
                               r.next_offset, r.min_offset, r.max_offset, nbytes)
        return head, parts
