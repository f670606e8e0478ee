"""Worker-wide caps and flow control (issue 15, point 6), against a real broker.

Each connection was capped (one 16 MiB frame, 8 MiB of unsent replies),
but not their sum: 16 clients each sending most of a 16 MiB frame and
stopping took a worker from 305 to 562 MiB. Now a worker holds at most
serverPendingFrameBytesMax of unfinished frames, serves at most its share
of serverMaxConnections, and refuses a send that waited past
waitTimeMillsInSendQueue with SYSTEM_BUSY, as RocketMQ does.
"""
from __future__ import annotations

import select
import socket
import time

from brokerproc import start_broker
from shmq.client.remoting import RemotingClient
from shmq.client.requests import create_topic, decode_records, pull_message, send_message
from shmq.ipc.codes import RequestCode as RC
from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.remoting import FrameDecoder, RemotingCommand, encode

MIB = 1 << 20


def _closed_by_peer(s: socket.socket) -> bool:
    """Has the broker closed ``s`` (EOF or reset), without waiting?"""
    if not select.select([s], [], [], 0)[0]:
        return False
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def _wait_until(pred, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.02)


def test_unfinished_frames_past_the_workers_limit_close_the_biggest_holders(tmp_path):
    with start_broker(tmp_path, workerProcessNums="1",
                      serverPendingFrameBytesMax=str(4 * MIB)) as b:
        host, port = b.addr.split(":")
        holders = []
        for _ in range(8):             # 1 MiB each of a frame that says 16 MiB
            s = socket.create_connection((host, int(port)))
            s.sendall((16 * MIB).to_bytes(4, "big") + (2).to_bytes(4, "big") + b"{}"
                      + bytes(MIB - 10))
            holders.append(s)
        # no more than 4 MiB is held: at least 4 of the 8 are closed
        _wait_until(lambda: sum(_closed_by_peer(s) for s in holders) >= 4,
                    "four holders closed")
        with RemotingClient(b.addr) as c:                    # a good client is served
            assert c.invoke(RemotingCommand(RC.GET_BROKER_RUNTIME_INFO)).code == R.SUCCESS
        assert "serverPendingFrameBytesMax" in b.log()
        for s in holders:
            s.close()


def test_connections_past_the_cap_are_refused_with_an_error(tmp_path):
    with start_broker(tmp_path, workerProcessNums="1", serverMaxConnections="2") as b:
        clients = [RemotingClient(b.addr) for _ in range(2)]
        for c in clients:
            assert c.invoke(RemotingCommand(RC.GET_BROKER_RUNTIME_INFO)).code == R.SUCCESS
        host, port = b.addr.split(":")
        extra = socket.create_connection((host, int(port)))
        _wait_until(lambda: _closed_by_peer(extra), "the third connection refused")
        _wait_until(lambda: "refused 1 connection(s)" in b.log(), "the ERROR line")
        clients[0].close()             # a place is free again
        _wait_until(lambda: _served(b.addr), "a new connection served once one closed")
        clients[1].close()


def _served(addr: str) -> bool:
    try:
        with RemotingClient(addr) as c:
            return c.invoke(RemotingCommand(RC.GET_BROKER_RUNTIME_INFO),
                            timeout=5).code == R.SUCCESS
    except OSError:
        return False


def test_a_send_that_waited_past_wait_time_mills_in_send_queue_is_system_busy(tmp_path):
    """2,000 sends in one write: those handled more than 1 ms after their
    bytes came are refused with SYSTEM_BUSY; exactly the others are stored.
    (A worker reads up to 256 KiB, ~850 of these sends, at a time; the
    send lane takes them at 2-5 µs each, so each read's last ones wait
    past the millisecond.)"""
    topic = "Busy"
    with start_broker(tmp_path, workerProcessNums="1", waitTimeMillsInSendQueue="1") as b:
        with RemotingClient(b.addr) as c:
            assert c.invoke(create_topic(topic, 1)).code == R.SUCCESS
        s = socket.socket(socket.AF_UNIX)
        s.connect(b.unix)
        cmds = [send_message(topic, b"busy-%04d" % i, queue_id=0) for i in range(2000)]
        for i, cmd in enumerate(cmds):
            cmd.opaque = i + 1
        s.sendall(b"".join(encode(cmd) for cmd in cmds))
        dec, replies = FrameDecoder(), {}
        s.settimeout(30)
        while len(replies) < len(cmds):
            data = s.recv(1 << 16)
            assert data, "the broker closed the connection"
            dec.receive_data(data)
            while (r := dec.next_command()) is not None:
                replies[r.opaque] = r
        s.close()
        codes = {r.code for r in replies.values()}
        assert codes <= {R.SUCCESS, R.SYSTEM_BUSY} and R.SYSTEM_BUSY in codes
        busy = [r for r in replies.values() if r.code == R.SYSTEM_BUSY]
        assert all(r.remark.startswith("[TIMEOUT_CLEAN_QUEUE]broker busy") for r in busy)
        ok = [i for i in range(len(cmds)) if replies[i + 1].code == R.SUCCESS]
        with RemotingClient(b.addr) as c:
            stored = []
            offset = 0
            while offset < len(ok):
                r = c.invoke(pull_message(topic, 0, offset, max_msgs=32))
                got = decode_records(r.body)
                stored += [m.body for m in got]
                offset = int(r.ext["nextBeginOffset"])
                if not got:
                    break
        assert stored == [b"busy-%04d" % i for i in ok]
