"""The slave's end: follow a master's CommitLog (RocketMQ's ``HAClient``).

One connection at a time, in the ``shmq-ha`` process of a SLAVE:

    find      haMasterAddress, else the haServerAddr the NameServer gave the
              services process (``learned``); none: look again after
              RETRY_S
    connect   blocking, CONNECT_TIMEOUT_S; then non-blocking, TCP_NODELAY;
              report the store's offset at once
    follow    reads into one buffer, frames in (``protocol.Frames``: the
              body bytes as views of it, a frame cut by a read's end
              handed on as it arrives) → ``Replica.receive`` (written
              where they lie on the master, one write per piece, nothing
              joined) → ``Replica.dispatch`` (ConsumeQueues, published
              positions) after each read (4 MiB at a time saved no CPU
              measurable here, 1.0-1.2 GB per CPU-second either way, and
              would hold a slave that is behind back by 4 MiB);
              after the reads one readiness brings (up to
              READS_PER_REPORT full ones) that applied bytes, and every
              haSendHeartbeatInterval, report the offset received
    drop      on a frame that does not continue the store, garbage, EOF, or
              haHousekeepingInterval without a byte from the master; then
              connect again after RETRY_S; on a write the store refuses (its
              disk full: ENOSPC from a new segment or a write) after
              DISK_RETRY_S, from where the store ends (the process used to
              die of it, five times, and take the whole slave down with it)

A master that closes the connection before sending a byte is named as
such (the address may be another port, a broker's listenPort, or a master
that refuses this slave's offset: past its end, or behind what it keeps,
which its log says): the slave cannot tell which. A failure that repeats, refused connection or
such a drop, is logged once at WARNING, then at DEBUG until bytes flow
again (a line a second for as long as a master stays wrong helped no one).
"""
from __future__ import annotations

import json
import logging
import os
import selectors
import socket
import time

from shmq.core.files import DISK_ERRORS
from shmq.core.replica import Replica, ReplicaError

from ..config import BrokerConfig
from ..logs import DISK_RETRY_S   # a store that could not write what arrived: then ask again
from .protocol import Frames, ProtocolError, report

log = logging.getLogger("shmq.ha")
RETRY_S = 1.0
CONNECT_TIMEOUT_S = 5.0
TICK_S = 0.1
RECV_BYTES = 1 << 20
# full reads applied before the offset is reported: a report per read cost
# the slave a fifth of its time catching up (a loopback send wakes the master)
READS_PER_REPORT = 8
LEARNED_FILE = "haMaster.json"


def learned_path(root: str) -> str:
    return os.path.join(root, LEARNED_FILE)


def save_learned(root: str, ha_addr: str, master_addr: str) -> None:
    """What the NameServer answered a slave's registration with (services)."""
    path = learned_path(root)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump({"haServerAddr": ha_addr, "masterAddr": master_addr}, f)
    os.replace(tmp, path)


def load_learned(root: str) -> dict:
    try:
        with open(learned_path(root)) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def split_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host, int(port)


class HAClient:
    def __init__(self, config: BrokerConfig, replica: Replica, clock=time.monotonic):
        self.config, self.replica = config, replica
        self.clock = clock
        self.sock: socket.socket | None = None
        self.sel = selectors.DefaultSelector()
        self.frames = Frames()
        self.buf = memoryview(bytearray(RECV_BYTES))     # every read lands here
        self.master = ""
        self.reported = -1
        self.unsent = b""            # the rest of a report the socket took part of
        self.last_report = self.last_read = 0.0
        self.next_try = 0.0
        self.fed = False             # this connection brought a byte from the master
        self.failing = ""            # the failure last logged: the same again is not

    def master_addr(self) -> str:
        c = self.config
        return c.haMasterAddress or load_learned(c.store.storePathRootDir).get("haServerAddr", "")

    def step(self) -> None:
        now = self.clock()
        if self.sock is None:
            if now >= self.next_try:
                self.next_try = now + RETRY_S
                self._connect(now)
            if self.sock is None:
                time.sleep(min(TICK_S, max(0.0, self.next_try - now)))
                return
        for _key, _ in self.sel.select(TICK_S):
            for _ in range(READS_PER_REPORT):     # a backlog: full reads, then one report
                got = self._read()
                if got:
                    self._dispatch()
                if got < len(self.buf) or self.sock is None:
                    break
        if self.sock is None:
            return
        now = self.clock()
        if now - self.last_read > self.config.haHousekeepingInterval / 1000:
            self.drop("nothing from the master for haHousekeepingInterval")
            return
        rcv = self.replica.received
        if rcv > self.reported or now - self.last_report >= self.config.haSendHeartbeatInterval / 1000:
            self._report(rcv, now)

    def _connect(self, now: float) -> None:
        addr = self.master_addr()
        if not addr:
            return
        try:
            sock = socket.create_connection(split_addr(addr), timeout=CONNECT_TIMEOUT_S)
        except (OSError, ValueError) as e:
            self.master = addr
            self._failed(f"cannot connect to the master {addr}: {e}")
            return
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        self.sock, self.master = sock, addr
        self.frames = Frames()
        self.sel.register(sock, selectors.EVENT_READ)
        self.last_read = now
        self.reported = -1
        self.unsent = b""
        self.fed = False
        log.log(logging.DEBUG if self.failing else logging.INFO,
                "HA: connected to the master %s; this store ends at %d", addr, self.replica.received)
        self._report(self.replica.received, now)

    def _report(self, offset: int, now: float) -> None:
        """Send ``offset``, or first the rest of a report the socket took
        only part of (a master that stopped reading): reports stay whole."""
        fresh = not self.unsent
        data = self.unsent or report(offset)
        try:
            n = self.sock.send(data)
        except BlockingIOError:
            n = 0
        except OSError as e:
            self.drop(f"report failed: {e.strerror or e}")
            return
        self.unsent = data[n:]
        if fresh and not self.unsent:
            self.reported, self.last_report = offset, now

    def _read(self) -> int:
        """Read what arrived and write it to the store; the bytes read (the
        buffer's size: more is probably waiting)."""
        try:
            got = self.sock.recv_into(self.buf)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError as e:
            self.drop(e.strerror or str(e))
            return 0
        if not got:
            self.drop("closed by the master")
            return 0
        self.last_read = self.clock()
        if not self.fed:
            self.fed = True
            if self.failing:
                log.info("HA: replicating from the master %s from offset %d", self.master,
                         self.replica.received)
                self.failing = ""
        try:
            # the read's body pieces, written before the next read reuses the
            # buffer: contiguous ones (a backlog's) as one run of writes
            run, start, at = [], -1, -1
            for offset, piece in self.frames.feed(self.buf[:got]):
                if not piece and offset == (at if run else self.replica.received):
                    continue                # a heartbeat where the stream is
                if run and offset == at:
                    run.append(piece)
                else:
                    if run:
                        self.replica.receive(start, run)
                    run, start = [piece], offset
                at = offset + len(piece)
            if run:
                self.replica.receive(start, run)
        except (ProtocolError, ReplicaError) as e:
            self.drop(str(e))
            return 0
        except OSError as e:
            self._cannot_write(e)
            return 0
        return got

    def _dispatch(self) -> None:
        try:
            self.replica.dispatch()
        except ReplicaError as e:
            self.drop(str(e))
        except OSError as e:
            self._cannot_write(e)

    def _cannot_write(self, e: OSError) -> None:
        """The store cannot take what arrived (a full disk: a new segment's
        fallocate, a write; a disk that fails or went read-only): what it
        holds stays served; the master is asked again in DISK_RETRY_S, from
        where the store ends. Any other OSError is a bug, raised."""
        if e.errno not in DISK_ERRORS:
            raise e
        root = self.replica.store.config.storePathRootDir
        self.drop(f"cannot write to this store under {root}: {e.strerror or e}; trying again "
                  f"in {DISK_RETRY_S:.0f} s (pulls go on)")
        self.next_try = self.clock() + DISK_RETRY_S

    def drop(self, why: str) -> None:
        if self.sock is None:
            return
        self.sel.unregister(self.sock)
        self.sock.close()
        self.sock = None
        self.next_try = self.clock() + RETRY_S
        text = f"connection to the master {self.master} closed: {why}"
        if self.fed:
            log.warning("HA: %s", text)
        else:
            self._failed(f"{text} before it sent anything: is {self.master} the master's "
                         f"haListenPort? (a master also drops a slave whose offset, here "
                         f"{self.replica.received}, its CommitLog does not continue from: its "
                         f"log says why)")

    def _failed(self, text: str) -> None:
        """A connection that never brought a byte: WARNING once, DEBUG while it repeats."""
        log.log(logging.DEBUG if text == self.failing else logging.WARNING, "HA: %s", text)
        self.failing = text

    def close(self) -> None:
        if self.sock is not None:
            self.sel.unregister(self.sock)
            self.sock.close()
            self.sock = None
        self.sel.close()
