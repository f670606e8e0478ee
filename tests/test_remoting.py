"""The sans-I/O remoting codec: round trips, byte-by-byte feeding, what real
clients send, malformed frames, and a fuzz invariant (any bytes decode to
commands or raise RemoteProtocolError, nothing else)."""
from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shmq.ipc.remoting import (FLAG_ONEWAY, FLAG_RESPONSE, JSON, ROCKETMQ, FrameDecoder,
                               LocalProtocolError, RemoteProtocolError, RemotingCommand, encode,
                               encode_head, send_ok_head)


def frame(header: bytes, body: bytes = b"", stype: int = JSON) -> bytes:
    return struct.pack(">ii", 4 + len(header) + len(body), (stype << 24) | len(header)) + header + body


def decode_all(data: bytes, **kw) -> list[RemotingCommand]:
    d = FrameDecoder(**kw)
    d.receive_data(data)
    out = []
    while (cmd := d.next_command()) is not None:
        out.append(cmd)
    return out


TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)
COMMANDS = st.builds(
    RemotingCommand,
    code=st.integers(-2**15, 2**15 - 1), opaque=st.integers(-2**31, 2**31 - 1),
    flag=st.integers(0, 3), remark=st.none() | TEXT.filter(bool),
    ext=st.dictionaries(TEXT.filter(bool), TEXT.filter(bool), max_size=6),
    body=st.binary(max_size=300), language=st.sampled_from(["JAVA", "CPP", "GO", "PYTHON"]),
    version=st.integers(0, 2**15 - 1), serialize_type=st.sampled_from([JSON, ROCKETMQ]))


def same(a: RemotingCommand, b: RemotingCommand) -> bool:
    return (a.code, a.opaque, a.flag, a.remark, a.ext, bytes(a.body), a.language, a.version,
            a.serialize_type) == (b.code, b.opaque, b.flag, b.remark, b.ext, bytes(b.body),
                                  b.language, b.version, b.serialize_type)


@given(cmds=st.lists(COMMANDS, min_size=1, max_size=5))
@settings(max_examples=150, deadline=None)
def test_round_trip_whole_and_byte_by_byte(cmds):
    data = b"".join(encode(c) for c in cmds)
    whole = decode_all(data)
    assert len(whole) == len(cmds) and all(same(a, b) for a, b in zip(cmds, whole))
    d, got = FrameDecoder(), []
    for i in range(len(data)):
        d.receive_data(data[i:i + 1])
        while (cmd := d.next_command()) is not None:
            got.append(cmd)
    assert len(got) == len(cmds) and all(same(a, b) for a, b in zip(cmds, got))
    assert d.buffered_bytes == 0


def test_head_plus_body_is_the_frame():
    cmd = RemotingCommand(code=11, opaque=5, ext={"queueId": "3"}, body=b"x" * 1000)
    assert encode_head(cmd, 1000) + bytes(cmd.body) == encode(cmd)


def test_java_request_header_as_fastjson_writes_it():
    header = (b'{"code":310,"extFields":{"a":"pg","b":"TopicTest","c":"TBW102","d":"4","e":"2",'
              b'"f":"0","g":"1700000000000","h":"0","i":"WAIT\\u0001true\\u0002TAGS\\u0001TagA",'
              b'"j":"0","k":"false","m":"false"},"flag":0,"language":"JAVA","opaque":12,'
              b'"serializeTypeCurrentRPC":"JSON","version":407}')
    [cmd] = decode_all(frame(header, b"Hello RocketMQ"))
    assert (cmd.code, cmd.opaque, cmd.flag, cmd.language, cmd.version) == (310, 12, 0, "JAVA", 407)
    assert cmd.ext["b"] == "TopicTest" and cmd.ext["i"] == "WAIT\x01true\x02TAGS\x01TagA"
    assert cmd.body == b"Hello RocketMQ" and cmd.serialize_type == JSON
    assert not cmd.is_response and not cmd.is_oneway


def test_numbers_booleans_and_nulls_from_node_and_cpp_become_strings():
    header = json.dumps({"code": 11, "language": "CPP", "version": 333, "opaque": 1, "flag": 2,
                         "extFields": {"queueId": 3, "sysFlag": 0, "commitOffset": 12.0,
                                       "isUnitMode": False, "expressionType": None,
                                       "Signature": "", "topic": "T"}}).encode()
    [cmd] = decode_all(frame(header))
    assert cmd.ext == {"queueId": "3", "sysFlag": "0", "commitOffset": "12",
                       "isUnitMode": "false", "Signature": "", "topic": "T"}
    assert cmd.is_oneway and cmd.language == "CPP"


def test_go_binary_header_decodes_and_empty_values_drop():
    remark = b"ok"
    ext = (struct.pack(">h", 5) + b"topic" + struct.pack(">i", 1) + b"T"
           + struct.pack(">h", 5) + b"empty" + struct.pack(">i", 0))
    header = (struct.pack(">hbhiii", 105, 9, 317, 77, 0, len(remark)) + remark
              + struct.pack(">i", len(ext)) + ext)
    [cmd] = decode_all(frame(header, b"body", stype=ROCKETMQ))
    assert (cmd.code, cmd.language, cmd.version, cmd.opaque, cmd.remark) == (105, "GO", 317, 77, "ok")
    assert cmd.ext == {"topic": "T"} and cmd.body == b"body" and cmd.serialize_type == ROCKETMQ


def test_a_reply_keeps_opaque_and_the_requests_serialization():
    req = RemotingCommand(code=11, opaque=99, serialize_type=ROCKETMQ, flag=0)
    r = req.reply(0, remark="FOUND", ext={"nextBeginOffset": "5"})
    assert (r.opaque, r.flag & FLAG_RESPONSE, r.serialize_type) == (99, FLAG_RESPONSE, ROCKETMQ)
    [back] = decode_all(encode(r))
    assert back.is_response and back.ext == {"nextBeginOffset": "5"} and back.remark == "FOUND"


@pytest.mark.parametrize("data, message", [
    (struct.pack(">i", 3) + b"abc", "shorter than"),
    (struct.pack(">ii", 17 * 1024 * 1024, 0), "exceeds the"),
    (struct.pack(">ii", 8, 100) + b"abcd", "header length"),
    (frame(b"{}", stype=7), "serialize type"),
    (frame(b"not json"), "not JSON"),
    (frame(b"[1,2]"), "not an object"),
    (frame(b'{"opaque":1}'), "no 'code'"),
    (frame(b'{"code":"abc"}'), "not an integer"),
    (frame(b'{"code":1.5}'), "not an integer"),
    (frame(b'{"code":1e999}'), "not JSON"),
    (frame(b'{"code":1,"extFields":{"a":{"b":1}}}'), "not a scalar"),
    (frame(b'{"code":99999999999}'), "int32"),
    (frame(struct.pack(">hbhiii", 1, 0, 0, 0, 0, 50), stype=ROCKETMQ), "remark length"),
    (frame(b"\x00\x01", stype=ROCKETMQ), "truncated"),
    (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", "exceeds the"),   # a TLS ClientHello
])
def test_malformed_frames_are_protocol_errors_that_stick(data, message):
    d = FrameDecoder()
    d.receive_data(data)
    with pytest.raises(RemoteProtocolError, match=message):
        d.next_command()
    with pytest.raises(RemoteProtocolError):
        d.next_command()   # framing is lost: the connection must be closed


def test_an_incomplete_frame_waits_without_error():
    data = encode(RemotingCommand(code=1, body=b"x" * 100))
    d = FrameDecoder()
    d.receive_data(data[:-1])
    assert d.next_command() is None
    d.receive_data(data[-1:])
    assert d.next_command().body == b"x" * 100


def test_frames_are_capped_at_the_configured_size():
    d = FrameDecoder(frame_bytes_max=1024)
    d.receive_data(encode(RemotingCommand(code=1, body=b"x" * 2000))[:8])
    with pytest.raises(RemoteProtocolError, match="1024-byte limit"):
        d.next_command()


def test_what_the_protocol_cannot_carry_is_refused_locally():
    with pytest.raises(LocalProtocolError, match="int16"):
        encode(RemotingCommand(code=200050, serialize_type=ROCKETMQ))
    with pytest.raises(LocalProtocolError, match="limit"):
        encode(RemotingCommand(code=1, body=b"x" * 2000), frame_bytes_max=1024)


@given(data=st.binary(max_size=400))
@settings(max_examples=400, deadline=None)
def test_fuzz_any_bytes_give_commands_or_a_protocol_error(data):
    try:
        decode_all(data)
    except RemoteProtocolError:
        pass


@given(cmd=COMMANDS, flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 255)),
                                    min_size=1, max_size=4))
@settings(max_examples=300, deadline=None)
def test_fuzz_corrupted_frames_give_commands_or_a_protocol_error(cmd, flips):
    data = bytearray(encode(cmd))
    for pos, x in flips:
        data[pos % len(data)] ^= x
    try:
        decode_all(bytes(data))
    except RemoteProtocolError:
        pass


PULL_HEAD = b'{"code":11,'


def _next_if_agrees(data: bytes, head: bytes = PULL_HEAD) -> list:
    """``next_if(head)`` on ``data``: each command it gives is the one
    ``next_command`` gives from the same bytes; where it gives None the
    frame is left whole for ``next_command`` (which gives it, or raises
    the same error as a decoder that never tried ``next_if``)."""
    d, ref, got = FrameDecoder(), FrameDecoder(), []
    d.receive_data(data)
    ref.receive_data(data)
    while True:
        held = d.buffered_bytes
        cmd = d.next_if(head)
        try:
            want = ref.next_command()
        except RemoteProtocolError as e:
            assert cmd is None and d.buffered_bytes == held
            with pytest.raises(RemoteProtocolError, match=str(e)[:30].replace("(", r"\(")):
                d.next_command()
            return got
        if cmd is None:
            assert d.buffered_bytes == held
            cmd = d.next_command()
            if want is None:
                assert cmd is None
                return got
        else:
            got.append(cmd)
        assert same(cmd, want)


def test_next_if_gives_a_pull_where_it_lies_as_next_command_would():
    """The worker's pull lane reads pulls with ``next_if``: the pulls of
    the C++ core and ali-ons (their JSON headers begin with the code), one
    with a body, between frames it must leave to ``next_command``."""
    pulls = [(GOLDEN / f"{n}-pull.bin").read_bytes() for n in ("cpp-1.2", "ons-3.12")]
    other = encode(RemotingCommand(code=34, ext={"a": "b"}))                 # a heartbeat's code
    binary = encode(RemotingCommand(code=11, ext={"topic": "T"}, serialize_type=ROCKETMQ))
    with_body = encode(RemotingCommand(code=11, opaque=7, ext={"topic": "T"}, body=b"xyz"))
    numbers = frame(b'{"code":11,"opaque":3,"extFields":{"queueId":0,"topic":"T","x":null}}')
    got = _next_if_agrees(b"".join([pulls[0], other, pulls[1], binary, with_body, numbers,
                                    pulls[0]]))
    assert [(c.code, c.opaque) for c in got] == [(11, 17), (11, 6), (11, 7), (11, 3), (11, 17)]
    assert got[2].body == b"xyz" and got[3].ext == {"queueId": "0", "topic": "T"}
    d = FrameDecoder()
    d.receive_data(pulls[1][:-1])                       # incomplete: left, then whole
    assert d.next_if(PULL_HEAD) is None and d.buffered_bytes == len(pulls[1]) - 1
    d.receive_data(pulls[1][-1:])
    assert d.next_if(PULL_HEAD).ext["topic"] == "GoldenTopic" and d.buffered_bytes == 0


@pytest.mark.parametrize("data, message", [
    (frame(b'{"code":11,"opaque":1'), "not JSON"),
    (frame(b'{"code":11,"extFields":[1]}'), "extFields is not an object"),
    (frame(b'{"code":11,"opaque":99999999999}'), "int32"),
    (struct.pack(">ii", 2000, 40) + b'{"code":11,', "exceeds the"),
])
def test_next_if_leaves_a_malformed_pull_to_next_command_which_says_what_is_wrong(data, message):
    d = FrameDecoder(frame_bytes_max=1024)
    d.receive_data(data)
    assert d.next_if(PULL_HEAD) is None and d.buffered_bytes == len(data)
    with pytest.raises(RemoteProtocolError, match=message):
        d.next_command()


@given(cmds=st.lists(COMMANDS, min_size=1, max_size=4),
       flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 255)), max_size=3))
@settings(max_examples=300, deadline=None)
def test_fuzz_next_if_agrees_with_next_command(cmds, flips):
    for c in cmds[::2]:
        c.code = 11
    data = bytearray(b"".join(encode(c) for c in cmds))
    for pos, x in flips:
        data[pos % len(data)] ^= x
    _next_if_agrees(bytes(data), b'{"code":11,')


def test_oneway_flag():
    assert RemotingCommand(code=37, flag=FLAG_ONEWAY).is_oneway


GOLDEN = __import__("pathlib").Path(__file__).parent / "golden"


def test_golden_frame_from_the_cpp_client():
    """GET_ROUTEINFO_BY_TOPIC as the C++ core of `pip install rocketmq==0.4.4`
    sent it to a listener on loopback (captured 2026-11-22): JSON with a
    trailing newline, the ACL keys always present, version 63."""
    data = (GOLDEN / "cpp-1.2-get-routeinfo.bin").read_bytes()
    for chunks in ([data], [data[i:i + 1] for i in range(len(data))]):
        d = FrameDecoder()
        for c in chunks:
            d.receive_data(c)
        cmd = d.next_command()
        assert d.next_command() is None and d.buffered_bytes == 0
        assert (cmd.code, cmd.language, cmd.version, cmd.opaque, cmd.flag) == (105, "CPP", 63, 0, 0)
        assert cmd.ext["topic"] == "GoldenTopic" and cmd.ext["AccessKey"] == ""
        assert cmd.remark == "" and cmd.body == b""


def test_code_tables_hold_rocketmq_values():
    from shmq.ipc.codes import RequestCode as R, ResponseCode as C, not_supported_remark
    assert (R.SEND_MESSAGE, R.PULL_MESSAGE, R.HEART_BEAT, R.SEND_MESSAGE_V2, R.SEND_BATCH_MESSAGE,
            R.GET_ROUTEINFO_BY_TOPIC, R.REGISTER_BROKER, R.INVOKE_BROKER_TO_RESET_OFFSET) == \
        (10, 11, 34, 310, 320, 105, 103, 222)
    assert (C.SUCCESS, C.FLUSH_DISK_TIMEOUT, C.PULL_NOT_FOUND, C.PULL_RETRY_IMMEDIATELY,
            C.PULL_OFFSET_MOVED, C.TOPIC_NOT_EXIST, C.FLOW_CONTROL) == (0, 10, 19, 20, 21, 17, 215)
    assert not_supported_remark(999) == " request type 999 not supported"


@pytest.mark.parametrize("stype", [JSON, ROCKETMQ])
@pytest.mark.parametrize("opaque, msg_id, qid, qoff", [
    (0, "7F00000100002A9F0000000000001234", 0, 0), (2**31 - 1, "AB" * 16, 7, 2**62),
    (-5, "x", 123, 1)])
def test_send_ok_template_is_the_encoded_reply(stype, opaque, msg_id, qid, qoff):
    """The SEND SUCCESS template writes the bytes the general encoder does."""
    req = RemotingCommand(310, opaque=opaque, serialize_type=stype)
    want = encode_head(req.reply(0, ext={"msgId": msg_id, "queueId": str(qid),
                                         "queueOffset": str(qoff), "MSG_REGION": "DefaultRegion",
                                         "TRACE_ON": "true"}), 0)
    assert send_ok_head(stype, opaque, msg_id, qid, qoff) == want


# ---------------------------------------------------------------- opaque matching (ipc/matcher.py)
def _reply(opaque: int, code: int = 0) -> RemotingCommand:
    return RemotingCommand(code=11, opaque=opaque).reply(code)


def test_the_matcher_pairs_replies_in_any_order_and_hands_requests_on():
    from shmq.ipc.matcher import OpaqueMatcher
    served = []
    m = OpaqueMatcher(served.append)
    m.register(1, "w1", 10.0, code=11, timeout=3.0)
    m.register(2, "w2", 10.0)
    assert m.receive(_reply(2)) == ("w2", 10.0, 0, 0.0)
    assert m.receive(RemotingCommand(code=40, opaque=7)) is None and served[0].code == 40
    assert m.receive(_reply(1)) == ("w1", 10.0, 11, 3.0)
    assert m.receive(_reply(1)) is None and m.strays == 1        # a second (late) answer
    assert m.pending == {}


def test_the_matcher_expires_by_the_deadlines_it_is_given():
    from shmq.ipc.matcher import OpaqueMatcher
    m = OpaqueMatcher()
    for opaque, deadline in ((1, 5.0), (2, 9.0), (3, 5.0), (4, 7.0)):
        m.register(opaque, f"w{opaque}", deadline)
    expired, nxt = m.expire(6.0)
    assert sorted(e[0] for e in expired) == ["w1", "w3"] and nxt == 7.0
    assert m.receive(_reply(1)) is None                           # expired: a stray now
    assert m.expire(100.0)[1] is None and m.pending == {}


def test_a_lost_connection_fails_everything_pending_and_refuses_more():
    from shmq.ipc.matcher import OpaqueMatcher
    m = OpaqueMatcher()
    m.register(1, "a")
    m.register(2, "b")
    assert m.forget(2) == ("b", float("inf"), 0, 0.0)
    assert m.lose("closed by the peer") == [("a", float("inf"), 0, 0.0)]
    assert m.lose("again") == [] and (m.closed, m.why_closed) == (True, "closed by the peer")
    with pytest.raises(AssertionError):
        m.register(3, "c")


@given(ops=st.lists(st.tuples(st.sampled_from(["register", "reply", "expire", "forget", "lose"]),
                              st.integers(1, 8)), max_size=60))
@settings(max_examples=200, deadline=None)
def test_every_registered_request_is_settled_exactly_once(ops):
    """Against a model: whatever the order of registrations, replies,
    expiries, forgets and a loss, each request leaves the table once, by
    exactly one of them, and a reply is paired only with its own request."""
    from shmq.ipc.matcher import OpaqueMatcher
    m = OpaqueMatcher()
    settled: list[int] = []
    opaque, live, now = 0, {}, 0.0
    for op, n in ops:
        if op == "register" and not m.closed:
            opaque += 1
            m.register(opaque, opaque, now + n)
            live[opaque] = now + n
        elif op == "reply" and live:
            target = sorted(live)[n % len(live)]
            entry = m.receive(_reply(target))
            assert entry[0] == target
            settled.append(target)
            del live[target]
        elif op == "expire":
            now += n
            expired, nxt = m.expire(now)
            assert sorted(e[0] for e in expired) == sorted(o for o, d in live.items() if d <= now)
            for e in expired:
                settled.append(e[0])
                del live[e[0]]
            assert nxt == (min(live.values()) if live else None)
        elif op == "forget" and live:
            target = sorted(live)[n % len(live)]
            settled.append(m.forget(target)[0])
            del live[target]
        elif op == "lose":
            settled += [e[0] for e in m.lose("gone")]
            live.clear()
    settled += [e[0] for e in m.lose("end")]
    assert sorted(settled) == list(range(1, opaque + 1))


class _FakeBroker:
    """A Unix-socket peer that answers as the test scripts it (real sockets)."""

    def __init__(self, path):
        import socket
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(1)
        self.addr = f"unix:{path}"
        self.peer = None

    def accept(self):
        self.peer, _ = self.listener.accept()

    def read_requests(self, n):
        d, got = FrameDecoder(), []
        while len(got) < n:
            d.receive_data(self.peer.recv(65536))
            while (cmd := d.next_command()) is not None:
                got.append(cmd)
        return got

    def close(self):
        for s in (self.peer, self.listener):
            if s is not None:
                s.close()


def test_the_blocking_channel_matches_through_the_matcher(tmp_path):
    """Replies in reverse order reach their own recv; a request from the peer
    goes to ``requests``; a reply to nothing is dropped; once the peer
    closes, every later call that needs the socket raises ConnectionError."""
    from shmq.ipc.channel import RemotingClient
    fake = _FakeBroker(tmp_path / "b.sock")
    try:
        c = RemotingClient(fake.addr)
        fake.accept()
        ops = c.send_many([RemotingCommand(code=11), RemotingCommand(code=12)])
        reqs = fake.read_requests(2)
        assert [r.opaque for r in reqs] == ops and set(c.matcher.pending) == set(ops)
        fake.peer.sendall(encode(reqs[1].reply(0, remark="two")) + encode(_reply(123456))
                          + encode(RemotingCommand(code=40, opaque=9))
                          + encode(reqs[0].reply(0, remark="one")))
        assert c.recv(ops[0]).remark == "one" and c.recv(ops[1]).remark == "two"
        assert c.next_request().code == 40 and c.replies == {} and c.matcher.strays == 1
        op = c.send(RemotingCommand(code=13))
        fake.peer.close()
        fake.peer = None
        with pytest.raises(ConnectionError):
            c.recv(op, timeout=10)
        assert c.matcher.pending == {}
        with pytest.raises(ConnectionError):
            c.send(RemotingCommand(code=14))
        c.close()
    finally:
        fake.close()


def test_the_asyncio_connection_matches_through_the_matcher(tmp_path):
    """The same pairing for the client's Connection; a close fails every
    pending future at once with RemotingError."""
    import asyncio
    import threading
    from shmq.client.connection import Connection, RemotingError
    fake = _FakeBroker(tmp_path / "a.sock")
    accepted = threading.Thread(target=fake.accept)
    accepted.start()

    async def main():
        conn = await Connection.open(fake.addr)
        futs = [conn.request(RemotingCommand(code=c), timeout=30) for c in (11, 12, 13)]
        await asyncio.sleep(0)                     # the queued frames leave at the end of the turn
        accepted.join()
        reqs = await asyncio.to_thread(fake.read_requests, 3)
        fake.peer.sendall(encode(reqs[1].reply(0, remark="two")) + encode(reqs[0].reply(0, remark="one")))
        one, two = await futs[0], await futs[1]
        assert (one.remark, two.remark) == ("one", "two") and list(conn.pending) == [reqs[2].opaque]
        fake.peer.close()
        with pytest.raises(RemotingError, match="closed"):
            await futs[2]
        assert conn.closed and conn.pending == {}
    try:
        asyncio.run(main())
    finally:
        fake.close()
