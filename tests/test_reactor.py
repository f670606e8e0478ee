"""The reactor's output: replies made in one turn leave in one write, in
order; a connection closed for bad bytes still answers what came before."""
from __future__ import annotations

import socket

from test_handlers import turns_until
from shmq.broker.reactor import Reactor
from shmq.ipc.remoting import FrameDecoder, RemotingCommand, encode, encode_head


def _recv_commands(sock: socket.socket, n: int) -> list[RemotingCommand]:
    dec, got = FrameDecoder(), []
    sock.settimeout(10)
    while len(got) < n:
        data = sock.recv(1 << 16)
        assert data, f"closed after {len(got)} of {n} replies"
        dec.receive_data(data)
        while (c := dec.next_command()) is not None:
            got.append(c)
    return got


def _served(handler):
    reactor = Reactor()
    ours, theirs = socket.socketpair()
    conn = reactor.add_connection(ours, "test", handler)
    return reactor, conn, theirs


def test_replies_of_one_turn_leave_in_one_write_in_order():
    def echo_twice(conn, cmd):
        for k in range(2):
            reply = cmd.reply(0, ext={"k": str(k)}, body=cmd.body)
            conn.send(encode(reply))
    reactor, conn, client = _served(echo_twice)
    client.sendall(b"".join(encode(RemotingCommand(1, opaque=i, body=b"b%d" % i)) for i in range(3)))
    turns_until(reactor, lambda: conn.writes, "a write")
    got = _recv_commands(client, 6)
    assert [(c.opaque, c.ext["k"], bytes(c.body)) for c in got] == \
        [(i, str(k), b"b%d" % i) for i in range(3) for k in range(2)]
    assert conn.writes == 1           # six replies, three requests, one sendmsg
    reactor.close()


def test_a_reply_with_parts_goes_with_its_header():
    """A pull's header and its records (slices of the mapping) in one write."""
    def reply_in_parts(conn, cmd):
        parts = (b"abc", memoryview(bytearray(b"defg")))
        conn.send(encode_head(cmd.reply(0), 7), parts)
    reactor, conn, client = _served(reply_in_parts)
    client.sendall(encode(RemotingCommand(1, opaque=7)))
    turns_until(reactor, lambda: conn.writes, "a write")
    (reply,) = _recv_commands(client, 1)
    assert (reply.opaque, bytes(reply.body)) == (7, b"abcdefg")
    assert conn.writes == 1
    reactor.close()


def test_bad_bytes_close_the_connection_after_answering_what_came_before():
    reactor, conn, client = _served(lambda conn, cmd: conn.send(encode(cmd.reply(0))))
    client.sendall(encode(RemotingCommand(1, opaque=42)) + b"\x00\x00\x00\x01garbage")
    turns_until(reactor, lambda: conn.closed, "the close")
    (reply,) = _recv_commands(client, 1)
    assert reply.opaque == 42
    client.settimeout(10)
    assert client.recv(100) == b""    # then closed
    reactor.close()
