"""Single sends read straight from a connection's bytes: the kernels of
the broker's send lane (``broker/handlers/lane.py``), with the constants
they are called with. What they read and refuse is drawn in
``_kernels/frames.py``; the wire's names (SEND_MESSAGE's field names, the
SUCCESS answer's template) come from the caller, which owns the protocol.
"""
from __future__ import annotations

import re
import struct

import numpy as np

from . import _kernels as K
from . import jit
from ._kernels.frames import (F_BODY_LEN, F_END, F_KEY_HASH, F_NEW_TOPIC, F_NO_WAIT,  # noqa: F401
                              F_OPAQUE, F_QID, F_SIZE, F_TAGS_CODE, F_TOPIC_LEN, F_TOPIC_OFF, N_F,
                              N_P, N_S, P_COMMIT, P_END, P_GROUP_LEN, P_GROUP_OFF, P_HAS_COMMIT,
                              P_MAX, P_NEW, P_OFFSET, P_OPAQUE, P_QID, P_SUB_LEN, P_SUB_OFF,
                              P_SYSFLAG, P_TOPIC_LEN, P_TOPIC_OFF, P_TYPE_LEN, P_TYPE_OFF,
                              S_FRAME, S_KEY, S_POS, S_SIZE, S_TAGS, WORDS)

NEEDLES = (b"DELAY\x01", b"TIMER_", b"TRAN_MSG\x01", b"CLUSTER\x01", b"UNIQ_KEY\x01", b"TAGS",
           b"WAIT\x01false")


# The request code of a JSON header that begins with it, as every RocketMQ
# client writes it (Java's fastjson and the C++ client's jsoncpp sort keys;
# ali-ons writes code first): a frame that says another code is not a
# lane's, and costs no kernel call for that (one that says nothing here goes
# to the kernel, which reads it whole)
_CODE = re.compile(rb'\{\s*"code"\s*:\s*(\d{1,9})\D')
_CODE_AT = 4 + 4                # a frame's header starts after its two lengths


def says_other_code(buf, pos: int, codes) -> bool:
    """Whether the frame at ``buf[pos:]`` says, where its JSON header begins,
    a request code not in ``codes``."""
    m = _CODE.match(buf, pos + _CODE_AT, pos + _CODE_AT + 24)
    return m is not None and int(m.group(1)) not in codes


def u8(data: bytes) -> np.ndarray:
    """``data`` as the read-only uint8 array the kernels take."""
    return jit.readonly(np.frombuffer(bytes(data), np.uint8))


def joined(pieces) -> tuple[np.ndarray, np.ndarray]:
    """``pieces`` joined, with the offsets where each begins (and the end)."""
    offs = np.zeros(len(pieces) + 1, np.int64)
    np.cumsum([len(p) for p in pieces], out=offs[1:])
    return u8(b"".join(pieces)), jit.readonly(offs)


def keys(v1_names) -> tuple:
    """What ``read_sends`` matches: SEND_MESSAGE's (V1) names of the fields
    it reads (producerGroup, topic, queueId, sysFlag, bornTimestamp, flag,
    properties, reconsumeTimes, batch; V2's letters are the kernel's), the
    JSON words, the property needles."""
    names, offs = joined([n.encode() for n in v1_names])
    needles, noffs = joined(NEEDLES)
    return names, offs, u8(WORDS), needles, noffs


def read_sends(view, pos: int, end: int, chunk: int, keys: tuple, cluster, max_body: int,
               out: np.ndarray, scratch: np.ndarray) -> int:
    """How many of the frames at view[pos:end] are single sends the lane
    takes (at most ``chunk``), read into ``out`` and ``scratch``."""
    return K.read_sends(view, pos, end, chunk, keys, cluster, max_body, K.CRC_TABLES, out, scratch)


def pull_keys(names) -> tuple:
    """What ``read_pulls`` matches: PULL_MESSAGE's names of the nine fields
    it reads (consumerGroup, topic, queueId, queueOffset, maxMsgNums,
    sysFlag, commitOffset, subscription, expressionType), the JSON words."""
    joined_names, offs = joined([n.encode() for n in names])
    return joined_names, offs, u8(WORDS)


def read_pulls(view, pos: int, end: int, chunk: int, keys: tuple, out: np.ndarray,
               scratch: np.ndarray) -> int:
    """How many of the frames at view[pos:end] are pulls the pull lane
    takes (at most ``chunk``), read into ``out`` and ``scratch``."""
    return K.read_pulls(view, pos, end, chunk, keys, out, scratch)


def encode_sends(view, scratch, out, n: int, tix, orflags, born, store, now: int, recs, srt,
                 groups) -> int:
    """The records of the ``n`` frames read into ``recs``, each queue's
    run together (``srt``, ``groups``: see the kernel); the runs' count."""
    return K.encode_sends(view, jit.readonly(scratch), jit.readonly(out), n, tix, orflags,
                          born, store, now, K.CRC_TABLES, recs, srt, groups)


def place_answers(out, srt, groups, ng: int, gphy, gq, gqid, sel: int, opaque, phy, qid,
                  qoff) -> int:
    """Each answer's fields, of the runs appended whole (``gphy >= 0``)."""
    return K.place_answers(jit.readonly(out), jit.readonly(srt), jit.readonly(groups), ng, gphy,
                           gq, gqid, sel, opaque, phy, qid, qoff)


def send_ok_frames(template, toffs, prefix, opaque, phy, qid, qoff, n: int, o) -> int:
    """Each send's SUCCESS answer from the template's five pieces, into ``o``."""
    return K.send_ok_frames(template, toffs, prefix, opaque, phy, qid, qoff, n, o)


_WARM_HEADER = (b'{"code":310,"flag":0,"opaque":1,"version":1,"extFields":{"a":"g","b":"warmup",'
                b'"e":"0","f":"0","g":"0","h":"0","i":"TAGS\\u0001t\\u0002UNIQ_KEY\\u0001k"}}')


_WARM_PULL = (b'{"code":11,"flag":0,"opaque":1,"extFields":{"a":"g","b":"warmup","c":"0",'
              b'"d":"0","e":32,"f":"4","g":null,"h":"*"}}')


def warm_up() -> None:
    """The lanes' kernels, once each with their canonical argument types
    (``jit``): a V2 send read, encoded and answered; a pull read."""
    frame = u8(struct.pack(">ii", 4 + len(_WARM_HEADER) + 1, len(_WARM_HEADER))
               + _WARM_HEADER + b"x")
    out = np.zeros((1, N_F), np.int64)
    scratch = np.zeros(2 * frame.shape[0] + 64, np.uint8)
    n = read_sends(frame, 0, frame.shape[0], 1, keys(["producerGroup"] * 9), u8(b"CLUSTER\x01c"),
                   1024, out, scratch)
    assert n == 1, "the lane's warm-up send was not read"
    host = u8(bytes(8))
    recs = np.zeros(int(out[0, F_SIZE]), np.uint8)
    srt = np.zeros((N_S, 1), np.int64)
    groups = np.zeros((2, 2), np.int64)
    ng = encode_sends(frame, scratch, out, 1, np.zeros(1, np.int64), np.zeros(1, np.int64), host,
                      host, 0, recs, srt, groups)
    one = np.zeros(1, np.int64)
    place_answers(out, srt, groups, ng, one, one, one, 0, one, one, one, one)
    template, toffs = joined([b"a"] * 5)
    send_ok_frames(template, toffs, u8(bytes(16)), one, one, one, one, 1, np.zeros(256, np.uint8))
    pull = u8(struct.pack(">ii", 4 + len(_WARM_PULL), len(_WARM_PULL)) + _WARM_PULL)
    out = np.zeros((1, N_P), np.int64)
    n = read_pulls(pull, 0, pull.shape[0], 1, pull_keys([chr(97 + k) for k in range(9)]), out,
                   np.zeros(pull.shape[0], np.uint8))
    assert n == 1, "the lane's warm-up pull was not read"
