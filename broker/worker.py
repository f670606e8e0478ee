"""A worker process: one reactor serving the connections the boss hands it.

The boss accepts every connection and passes its descriptor here over a
Unix socket (SCM_RIGHTS). The worker attaches to the shared store and
registries, and runs requests to completion in its one thread; it sleeps in
epoll on its client sockets, the boss channel and its wake-up socket (new
messages for parked pulls, flush progress for parked sync sends, consumer
group changes). It dies with the boss (PDEATHSIG). SIGTERM: answer what is
parked, flush replies, leave.

``Driver`` is the only code between connections and the sans-I/O request
handlers (broker/handlers/): it gives each connection a ``Peer`` (its
address parsed once), runs each command through ``Handlers.handle`` and
writes the reply with ``Connection.send``; it writes what the parking
module answers later (after a request parked, on a wake-up, when the one
reactor timer it keeps for the earliest parked deadline fires) and the
notices to other clients, each to the connection its peer names, if still
open. Before the decoder reads a connection's bytes, the lanes (``on_lane``)
take what they can: the pull lane the pulls at their head (``_pulls``: a
chunk read by one kernel call and run by ``handlers/pull_lane.py``, the
pull it stops at read where it lies and run by ``Handlers.run_pull``,
without the dispatch every request goes through); the send lane
(``handlers/lane.py``) the single sends it can read whole straight from
them, a chunk of up to 64 at a time: appended a claim per queue, answered
from kernels, each chunk's answers written before the next is taken.
Other plain sends are offered to
``Handlers.take``: those it takes
are appended together, a claim per queue, when the reactor's turn ends
(``Reactor.end_turn``) or before the next other request, whichever is
first (``flush_group``), and answered in the order they came. A turn that
read more than ANSWER_EVERY sends appends and answers them ANSWER_EVERY at a
time, each group's answers written at once rather than at the turn's end (a
SEND_BATCH_MESSAGE's answer too): a producer with a window of sends in
flight then sends its next ones while this worker appends the rest (a
pipeline of two processes overlaps; a turn answered whole makes them take
turns).

Under SYNC_FLUSH the worker leads the group commit of its own sync sends:
once a turn's requests are handled, before its replies leave and it sleeps
(``Reactor.before_sleep``, Redis's beforeSleep), it flushes the CommitLog
up to everything published and answers the sends that waited
(``group_commit``); what arrives meanwhile is the next turn's group. A
send one at a time then costs two process wake-ups (the client's request,
the answer), not four (and the flusher's and back).
"""
from __future__ import annotations

import ctypes
import logging
import os
import resource
import signal
import socket
import time

from shmq.core import jit
from shmq.ipc.control import (FLUSHER_SLOT, WANT_CLIENTS, WANT_CONFIG, WANT_FLUSH, die_with_parent,
                              set_process_name)
from shmq.ipc.codes import RequestCode as RC
from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.remoting import RemoteProtocolError, RemotingCommand, encode_head

from .config import BrokerConfig
from .handlers import PARKED, Handlers, Peer
from .handlers.lane import SendLane
from .handlers.pull_lane import CHUNK, PullLane
from .logs import setup as setup_logs
from .reactor import Connection, Reactor
from .registry import Registry
from .shared_store import attach, extra_region
from .stats import SAMPLE_S, FlushMeter
from .topics import Tables

log = logging.getLogger("shmq.worker")
HANDOFF_MSG_BYTES = 64 * 1024
HANDOFF_FDS_MAX = 64
DRAIN_S = 5.0
# sends taken into one group at most (Handlers.take) before they are appended
# and their answers written, mid-turn: a turn's recv of 256 KiB may hold ~700
# small ones. 32 is half of AsyncProducer's default window (max_in_flight 64):
# its first half's answers reach the producer while the worker appends the
# second half, so the two overlap. Measured 2026-11-27 (2-core VM, 1 worker,
# AsyncProducer.send of 100 B, window 64, Unix socket): 10.0-10.7 k msg/s with
# the answers written at the turn's end (or every 64), 17.2-18.1 k every 32,
# 16.5-17.4 k every 24, 10.5-10.7 k every 8 (more writes and producer turns
# than the overlap gains). A SEND_BATCH_MESSAGE is such a group already (one
# claim): its answer is written at once. AsyncProducer's accumulator (single
# sends sent as batches of ~32) went 31.4-33.6 -> 52.6-59.3 k msg/s with that
# (client_send_accumulated, alternated twice); 16-message batches, 4 in
# flight, within noise (27.6-33.5 k either way).
ANSWER_EVERY = 32
# ... and bytes of their bodies: what they hold is out of the decoders'
# account (serverPendingFrameBytesMax) until they are appended
TAKEN_BYTES_MAX = 4 << 20
# the requests RocketMQ's send thread pool runs (waitTimeMillsInSendQueue applies)
SEND_CODES = frozenset({RC.SEND_MESSAGE, RC.SEND_MESSAGE_V2, RC.SEND_BATCH_MESSAGE,
                        RC.CONSUMER_SEND_MSG_BACK})
# after which requests the decoder gave the send lane is tried again (a send
# it did not take, say to a topic it did not yet know, may be followed by
# more it can take; after a request the decoder gave that is not a send,
# the send lane waits for the next read)
LANE_AFTER = frozenset({RC.SEND_MESSAGE, RC.SEND_MESSAGE_V2})
# how the JSON header of a pull begins (Java's fastjson and the C++ client
# sort its keys; ali-ons writes code first): what the pull lane looks for
PULL_HEAD = b'{"code":%d,' % RC.PULL_MESSAGE
# whole frames a connection must hold for the pull lane's chunk to be tried:
# a lone pull costs the same either way (157-177 µs end to end, 2026-11-27;
# 71.7 against 72.0 µs in-process, 2026-11-28), and one that finds nothing
# (a caught-up consumer's, which parks) would be read twice
LANE_MIN_FRAMES = 2
# ... and for the send lane: one. A lone send (a producer sending one message
# at a time) takes the lane's chunk of one (``SendLane._lone``: no chunk
# arrays, the answer from its template), 46-51 µs of CPU in-process against
# 61-62 the usual way (2026-11-28, the README's "A lone send takes the
# lane"); a chunk of one with the chunk's arrays cost more than the usual
# way (250-290 µs against 170-200 end to end, 2026-11-27)
SEND_LANE_MIN_FRAMES = 1
M_MMAP_THRESHOLD = -3        # mallopt(3)
MMAP_THRESHOLD = 1 << 20     # bytes: larger allocations are mmapped
FDS_KEPT = 256        # descriptors a worker keeps for the store's files past its connections


def boss_address(namespace: str) -> bytes:
    return f"\0{namespace}.boss".encode()


def fixed_mmap_threshold() -> None:
    """Large request buffers (a frame of up to 16 MiB) come from mmap and go
    back to the OS when freed. glibc raises its mmap threshold to the size
    of each mmapped block freed (up to 32 MiB), after which such buffers
    come from the heap and a worker that shed many half-sent frames kept
    their pages: setting the threshold turns that adjustment off."""
    ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)


def worker_main(config: BrokerConfig, index: int, boss_pid: int) -> None:
    die_with_parent(boss_pid)
    set_process_name(f"shmq-worker-{index}")
    fixed_mmap_threshold()
    setup_logs(f"worker-{index}")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    store, cb = attach(config.store, "worker")
    jit.freeze()                      # no compile on a request path (core/jit.py)
    cb.set_flag(WANT_CLIENTS, True)
    registry = Registry(extra_region(cb, store), config.store.storePathRootDir)
    tables = Tables(config, store.state, on_change=lambda: cb.wake_flagged(WANT_CONFIG))
    reactor = Reactor(config.serverPendingFrameBytesMax)
    handlers = Handlers(config, store, cb, tables, registry)
    driver = Driver(reactor, handlers)
    reactor.every(SAMPLE_S, handlers.stats.sample)

    chan = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    chan.connect(boss_address(cb.namespace))
    chan.sendall(f"{index} {cb.slot} {os.getpid()}\n".encode())

    conn_max = connection_cap(config)
    refused = Refusals(conn_max)

    def on_handoff():
        try:
            msg, fds, flags, _ = socket.recv_fds(chan, HANDOFF_MSG_BYTES, HANDOFF_FDS_MAX)
        except (BlockingIOError, InterruptedError):
            return
        if not msg and not fds:
            log.warning("the boss is gone: stopping")
            reactor.stopping = True
            return
        peers = msg.decode().split("\n")
        if flags & socket.MSG_CTRUNC:      # the kernel dropped descriptors we had no room for
            lost = max(0, len([p for p in peers if p]) - len(fds))
            log.error("lost %d client connection(s) handed by the boss: this worker is out of "
                      "file descriptors (RLIMIT_NOFILE %d); raise it (ulimit -n, LimitNOFILE=)",
                      lost, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        for i, fd in enumerate(fds):
            sock = socket.socket(fileno=fd)
            peer = peers[i] if i < len(peers) and peers[i] else f"fd{fd}"
            if len(reactor.conns) >= conn_max:
                refused.note(peer)
                sock.close()
                continue
            driver.add_connection(sock, peer, config.outboundBufferMaxBytes)

    def on_wake():
        cb.waiter.drain()
        driver.on_wake()

    ticks = [0]

    def every_second():
        cb.heartbeat()
        handlers.stats.note_worker(len(reactor.conns), handlers.parking)
        handlers.reload_damage()
        driver.on_wake()     # a wake-up missed is a second late, not a hold late
        ticks[0] += 1
        if ticks[0] % 10 == 0:
            reactor.close_idle(config.serverChannelMaxIdleTimeSeconds)

    chan.setblocking(False)
    reactor.add_reader(chan, on_handoff)
    reactor.add_reader(cb.waiter.sock, on_wake)
    reactor.every(1.0, every_second)

    def on_term(signum, frame):
        reactor.stopping = True

    signal.signal(signal.SIGTERM, on_term)
    reactor.wake_on_signals()
    log.info("serving (slot %d)", cb.slot)
    try:
        reactor.run()
        driver.drain()
    finally:
        reactor.close()
        cb.close()
        store.close()


def connection_cap(config: BrokerConfig) -> int:
    """The connections one worker serves at once: its share of
    serverMaxConnections, or of the descriptor limit less FDS_KEPT."""
    total = config.serverMaxConnections or max(
        1, resource.getrlimit(resource.RLIMIT_NOFILE)[0] - FDS_KEPT)
    return max(1, -(-total // max(1, config.workers)))


class Refusals:
    """Connections closed past the cap: one ERROR a second at most, with the count."""

    def __init__(self, cap: int):
        self.cap, self.count, self.logged_at = cap, 0, float("-inf")

    def note(self, peer: str) -> None:
        self.count += 1
        now = time.monotonic()
        if now - self.logged_at >= 1.0:
            log.error("refused %d connection(s) (the last from %s): this worker serves %d, its "
                      "share of serverMaxConnections (or of the descriptor limit)",
                      self.count, peer, self.cap)
            self.count, self.logged_at = 0, now


class Driver:
    """Connections ↔ handlers (see the module's docstring)."""

    def __init__(self, reactor: Reactor, handlers: Handlers):
        self.reactor = reactor
        reactor.end_turn = self.end_turn
        self.h = handlers
        self.parking = handlers.parking
        self.peers: dict[int, Peer] = {}        # connection id → its peer
        self.armed = None                        # the reactor timer for the earliest deadline
        self.armed_at = float("inf")
        self.notices_soon = False
        self.send_wait_ms = handlers.config.waitTimeMillsInSendQueue
        self.lane = SendLane(handlers)
        self.pull_lane = PullLane(handlers)
        self.pulls_run = 0                       # pulls the pull lane ran one by one (tests)
        self.flush_meter = None                  # its flush rounds' gauges (stats.FlushMeter)
        if handlers.store.config.sync_flush:
            # the group commit of this worker's sync sends is its own
            handlers.store.flush_inline = True
            reactor.before_sleep = self.group_commit
            if handlers.cb is not None:
                self.flush_meter = FlushMeter(handlers.store, handlers.cb, counts=False)

    def add_connection(self, sock: socket.socket, addr: str, out_max: int) -> Connection:
        conn = self.reactor.add_connection(sock, addr, self.on_command, self.on_close, out_max)
        self.peers[conn.id] = Peer(conn.id, addr, conn.attrs)
        conn.lane = self.on_lane
        return conn

    def on_lane(self, conn: Connection, cmd: RemotingCommand | None) -> None:
        """The lanes, tried before the decoder gives ``conn``'s next command
        (``cmd``: the one it gave last, or None): the pulls at the head of
        what the decoder holds are run straight (``_pulls``); then the send
        lane (``handlers/lane.py``) takes the single sends it can, a chunk
        at a time, each chunk's answers written before the next is taken
        (as ANSWER_EVERY does)."""
        dec = conn.decoder
        if self.h.pulls_direct():
            self._pulls(conn, dec)
        if cmd is not None and (cmd.code not in LANE_AFTER or cmd.is_response):
            return
        if not dec.frames_held(SEND_LANE_MIN_FRAMES):
            return
        peer = self.peers[conn.id]
        lane = self.lane
        if not lane.open(peer):
            return
        if self.h.taken:       # the sends before these first
            self.flush_group()
        parking = self.parking
        while (time.monotonic() - conn.last_active) * 1000 <= self.send_wait_ms:
            # (sends that waited longer are refused the usual way, SYSTEM_BUSY)
            try:
                buf, pos = dec.pending()
            except RemoteProtocolError:
                return
            try:
                end, answers = lane.take(peer, buf, pos)
            except Exception:       # a bug: this connection's sends go the usual way from here
                log.exception("connection %s: the send lane failed; its sends go the usual "
                              "way", conn.peer)
                conn.lane = None
                return
            if end == pos:
                return
            dec.skip_to(end)
            if parking.sends:         # parked answers now due leave before these
                self.send_all(parking.ready())
            for a in answers:
                conn.send(a)
            if parking.arrived or parking.sends:    # a pull waits on what they appended; they parked
                self.send_all(parking.ready())
                self.arm()
            if self.h.due:
                self._notices_soon()
            if conn.closed or not conn.reading or not dec.frames_held(SEND_LANE_MIN_FRAMES):
                return
            self.reactor.flush()      # these answers leave while the producer sends on

    def _pulls(self, conn: Connection, dec) -> None:
        """The pull lane: the PULL_MESSAGE requests at the head of
        ``conn``'s decoder are run straight, their answers queued as
        ``on_command`` queues them; anything else ends the lane, and the
        way every request goes reads it. Where the decoder holds two whole
        frames or more, ``PullLane`` reads the pulls a chunk at a time in
        one kernel call and answers those it can (see its module); the pull
        it stops at (and a lone pull) is read where it lies
        (``FrameDecoder.next_if``: a JSON header that begins with its
        code, as every RocketMQ client writes it) and run by
        ``Handlers.run_pull``. After a chunk that took nothing, the next
        reads one frame ahead, not a chunk: pulls that all park (a
        consumer's queues, caught up, after a rebalance) are each read by
        the kernel at most twice, not once for every pull before them.
        The README's "pull lane" says what each costs; tests/test_lane.py
        has the lane and the usual way to the same answers."""
        peer = self.peers[conn.id]
        h = self.h
        chunked = dec.frames_held(LANE_MIN_FRAMES)
        window = CHUNK
        while not conn.closed and conn.reading:
            if h.taken:        # the sends before them first: they may read what those append
                self.flush_group()
            if chunked:
                try:
                    buf, pos = dec.pending()
                except RemoteProtocolError:
                    return
                end, answers = self.pull_lane.take(buf, pos, window)
                window = CHUNK if end != pos else 1
                if end != pos:
                    dec.skip_to(end)
                    for head, parts in answers:
                        conn.send(head, parts)
                    self._answer(conn, None)
                    chunked = dec.frames_held(LANE_MIN_FRAMES)
                    continue
            cmd = dec.next_if(PULL_HEAD)
            if cmd is None:
                return
            if cmd.code != RC.PULL_MESSAGE or cmd.flag:     # a response, a oneway: as any
                self.on_command(conn, cmd)
            else:
                self.pulls_run += 1
                self._answer(conn, h.run_pull(peer, cmd))
            chunked = dec.frames_held(LANE_MIN_FRAMES)

    def on_command(self, conn: Connection, cmd: RemotingCommand) -> None:
        h = self.h
        if cmd.code in SEND_CODES and not cmd.is_response:
            waited_ms = (time.monotonic() - conn.last_active) * 1000
            if waited_ms > self.send_wait_ms:
                self.busy(conn, cmd, waited_ms)
                return
            if h.take(self.peers[conn.id], cmd):
                if len(h.taken) >= ANSWER_EVERY or h.taken_bytes >= TAKEN_BYTES_MAX:
                    self.flush_group()
                    self.reactor.flush()       # the answers leave now, not at the turn's end
                return
        if h.taken:        # the sends before it first: it may read what they append
            self.flush_group()
        self._answer(conn, h.handle(self.peers[conn.id], cmd))
        if cmd.code == RC.SEND_BATCH_MESSAGE:
            self.reactor.flush()         # a batch is a group already: answered at once

    def _answer(self, conn: Connection, out) -> None:
        """Queue a handler's answer (``Handlers.handle``'s) on ``conn``; then
        the parked answers it made due, and the notices."""
        if out is not None:
            if type(out) is bytes:
                conn.send(out)
            elif out is PARKED:
                self.send_all(self.parking.ready())
                self.arm()
            else:
                conn.send(out.head(), out.parts)
        if self.parking.arrived:         # this request appended to a queue a pull waits on
            self.send_all(self.parking.ready())
        if self.h.due:
            self._notices_soon()

    def end_turn(self) -> None:
        """The reactor's turn ends (its replies are about to leave)."""
        if self.h.taken:
            self.flush_group()
        if self.parking.arrived:     # what this worker appended (``Handlers._published``)
            self.send_all(self.parking.ready())

    def group_commit(self) -> None:
        """Before the reactor sleeps (``Reactor.before_sleep``), under
        SYNC_FLUSH: when sends of this worker wait for the disk, lead the
        group commit — flush the CommitLog up to everything published
        (every process's appends, not only ours), answer our sends, wake
        the other processes whose sends it made durable. The requests that
        came while it flushed are read in the next turn and flushed
        together: one fdatasync for every send of a turn, as Redis's
        ``appendfsync always`` writes and syncs once per event-loop turn,
        and no wake-up of the flusher and back for each (two on the path
        of a send one at a time). Another process flushing (the flush lock
        taken: the flusher, another worker) publishes and wakes us, and the
        turn that wake-up makes tries again."""
        parking = self.parking
        if not parking.sends:
            return
        store = self.h.store
        if store.state.flushed_pos >= parking.last_end:
            self.send_all(parking.ready())
            return
        try:
            t0 = time.perf_counter_ns()
            done = store.flush_commitlog(block=False)
        except OSError as e:       # (EIO): the flusher's own flush tries again and says why
            log.error("group commit: the CommitLog flush failed (%s); the flusher takes over", e)
            self.h.cb.wake(FLUSHER_SLOT)
            return
        if done < 0:
            return
        if self.flush_meter is not None:
            self.flush_meter(time.perf_counter_ns() - t0)
        self.send_all(parking.ready())
        # the others' sends it made durable (ours are answered and our flag
        # is down, unless some still wait for a slave's ack: SYNC_MASTER)
        self.h.cb.wake_flagged(WANT_FLUSH)

    def flush_group(self) -> None:
        """Append the sends taken this turn; queue their answers."""
        conns = self.reactor.conns
        answers = self.h.flush_group()
        parking = self.parking
        if parking.sends:       # parked answers now due leave before these (SYNC_FLUSH: in order)
            self.send_all(parking.ready())
        for peer, out in answers:
            conn = conns.get(peer.id)
            if conn is not None:
                if type(out) is bytes:
                    conn.send(out)
                else:
                    conn.send(out.head(), out.parts)
        if parking.arrived or parking.sends:    # a pull waits on what they appended; they parked
            self.send_all(parking.ready())
            self.arm()
        if self.h.due:
            self._notices_soon()

    def busy(self, conn: Connection, cmd: RemotingCommand, waited_ms: float) -> None:
        """RocketMQ's fast failure (BrokerFastFailure): a send that waited past
        waitTimeMillsInSendQueue since its bytes arrived — behind a long turn,
        or while its connection was not read — is refused with SYSTEM_BUSY, so
        the producer backs off or sends to another broker, instead of being
        stored after its sender may have given up on it."""
        if not cmd.is_oneway:
            reply = cmd.reply(R.SYSTEM_BUSY, f"[TIMEOUT_CLEAN_QUEUE]broker busy, start flow "
                                             f"control for a while, period in queue: "
                                             f"{waited_ms:.0f}ms")
            conn.send(encode_head(reply, 0))

    def on_close(self, conn: Connection) -> None:
        peer = self.peers.pop(conn.id, None)
        if peer is not None:
            self.h.connection_closed(peer)
            if self.h.due:
                self._notices_soon()

    def send_all(self, answers) -> None:
        """Write ``(peer, Reply)`` pairs, each to its peer's connection if it is open."""
        conns = self.reactor.conns
        for peer, reply in answers:
            conn = conns.get(peer.id)
            if conn is not None:
                conn.send(reply.head(), reply.parts)

    def on_wake(self) -> None:
        """The control block woke us (or the second passed): parked answers
        now due, then notices."""
        self.send_all(self.parking.on_wake())
        self.send_all(self.h.notices())

    def _notices_soon(self) -> None:
        if not self.notices_soon:
            self.notices_soon = True
            self.reactor.call_soon(self._send_notices)

    def _send_notices(self) -> None:
        self.notices_soon = False
        self.send_all(self.h.notices())

    def arm(self) -> None:
        """Keep one reactor timer at the earliest parked deadline."""
        due = self.parking.next_deadline()
        if due is None or due >= self.armed_at:
            return
        if self.armed is not None:
            self.reactor.cancel(self.armed)
        self.armed_at = due
        self.armed = self.reactor.call_later(max(0.0, due - self.parking.clock()), self._expire)

    def _expire(self) -> None:
        self.armed, self.armed_at = None, float("inf")
        self.send_all(self.parking.expire())
        self.arm()

    def drain(self) -> None:
        """Answer parked pulls now, give parked sync sends and queued
        replies up to DRAIN_S to go out."""
        reactor = self.reactor
        self.send_all(self.parking.expire_all_pulls())
        deadline = time.monotonic() + DRAIN_S
        reactor.stopping = False
        while time.monotonic() < deadline and (self.parking.sends or any(
                c.out for c in reactor.conns.values())):
            reactor.run_once()
            self.send_all(self.parking.on_wake())
            self.send_all(self.parking.expire())
