"""The NameServer process: ``NameServer`` behind a socket reactor.

``serve`` runs one until SIGTERM: ``shmq namesrv``, or the broker's embedded
NameServer, which the boss forks with the listening socket it bound itself
(so a port in use is the boss's one-line error, and a restarted NameServer
reuses the socket) and which dies with its parent.
"""
from __future__ import annotations

import logging

from ..acl import Acl
from ..logs import setup as setup_logs
from .routes import NameServer

log = logging.getLogger("shmq.broker.namesrv")


def listen(host: str, port: int):
    """The NameServer's listening socket (OSError if the port is taken)."""
    import socket
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        lsock.bind((host, port))
        lsock.listen(1024)
    except OSError:
        lsock.close()
        raise
    return lsock


def serve(host: str, port: int, parent_pid: int | None = None, on_ready=None, lsock=None,
          acl_file: str | None = None) -> None:
    """Run a NameServer on ``host:port`` until SIGTERM (``shmq namesrv``, or
    the broker's embedded one, which dies with its parent and is handed the
    listening socket ``lsock`` its parent bound). ``acl_file``: plain_acl.yml,
    whose admin accounts alone may send the GUARDED requests."""
    import signal

    from ..reactor import Reactor
    from shmq.ipc.control import die_with_parent, set_process_name
    from shmq.ipc.remoting import encode

    if parent_pid is not None:        # the broker's: its logs as the boss set them
        die_with_parent(parent_pid)
        set_process_name("shmq-namesrv")
        setup_logs("namesrv")
    ns = NameServer(acl=Acl(acl_file) if acl_file else None)
    reactor = Reactor()
    if lsock is None:
        lsock = listen(host, port)
    lsock.setblocking(False)
    ns.settings["listenPort"] = lsock.getsockname()[1]

    def on_command(conn, cmd):
        reply = ns.process(cmd, conn.peer)
        if reply is not None:
            conn.send(encode(reply))

    def on_accept():
        try:
            sock, addr = lsock.accept()
        except (BlockingIOError, InterruptedError):
            return
        reactor.add_connection(sock, f"{addr[0]}:{addr[1]}", on_command,
                               lambda conn: ns.connection_closed(conn.peer))

    reactor.add_reader(lsock, on_accept)
    reactor.every(10.0, ns.scan_expired)
    reactor.every(30.0, lambda: reactor.close_idle(120))

    def on_term(signum, frame):
        reactor.stopping = True

    signal.signal(signal.SIGTERM, on_term)
    reactor.wake_on_signals()
    if parent_pid is not None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    log.info("namesrv: serving on %s:%d", *lsock.getsockname()[:2])   # RocketMQ: "boot success"
    if on_ready is not None:
        on_ready(lsock.getsockname())
    try:
        reactor.run()
    finally:
        reactor.close()
        lsock.close()
