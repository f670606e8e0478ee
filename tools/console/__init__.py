"""``shmq console``: a web console for a NameServer and its brokers, the
rocketmq-dashboard functions that matter on one host.

    shmq console [-n NAMESRV] [--port 8080] [--interval 5] [--timeout 3]

It serves http://127.0.0.1:<port>/ (127.0.0.1 only: there is no login) and
talks to the NameServer and brokers over the RocketMQ 4.x remoting protocol
only, through ``shmq admin``'s client and commands, so it watches an Apache
RocketMQ 4.x cluster as well as shmq. Pages: the cluster (brokers' status,
put/get TPS charts sampled every ``--interval`` seconds), a broker's runtime
status, topics (list, create, delete, route, queue offsets, send a message),
consumer groups (lag per queue, connections, reset offset by time, skip the
backlog), producers (a group's connections), messages (by key, by id, by time
range; body, properties, trace; resend a dead letter to its group).

The parts: ``server`` (HTTP, dispatch, errors as pages), ``pages`` (each
page's question and tables), ``html`` (layout, escaping, SVG charts),
``sampler`` (the TPS rings). The stack is the standard library's
http.server with server-rendered HTML and no script (pyproject.toml says
why). ``-n``, ``--timeout`` and the ACL account are ``shmq admin``'s.
"""
from __future__ import annotations

import sys

DEFAULT_PORT = 8080


def _interval(v: str) -> float:
    import argparse
    try:
        s = float(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{v!r} is not a number of seconds") from None
    if not 0.2 <= s <= 3600:
        raise argparse.ArgumentTypeError(f"{s:g} s: want 0.2..3600")
    return s


def port_arg(v: str) -> int:
    import argparse
    if not v.isdigit() or not 0 <= int(v) < 65536:
        raise argparse.ArgumentTypeError(f"{v!r} is not a port (0..65535; 0: any free one)")
    return int(v)


def add_parser(subparsers) -> None:
    import os

    from ..admin import DEFAULT_NAMESRV, _namesrv, _timeout
    p = subparsers.add_parser(
        "console", help="a web console (rocketmq-dashboard's functions) on 127.0.0.1",
        description="A web console for a NameServer and its brokers, over the RocketMQ 4.x "
                    "protocol (works against shmq and RocketMQ 4.x), on http://127.0.0.1:PORT/.")
    p.add_argument("--port", type=port_arg, default=DEFAULT_PORT,
                   help=f"port to listen on, on 127.0.0.1 ({DEFAULT_PORT}; 0: any free one)")
    p.add_argument("--interval", type=_interval, default=5.0,
                   help="seconds between two samples of the brokers' TPS for the charts (5)")
    p.add_argument("-n", "--namesrvAddr", type=_namesrv, default=None,
                   help=f"NameServer address(es), host:port;host:port (default: $NAMESRV_ADDR, "
                        f"else {DEFAULT_NAMESRV})")
    p.add_argument("--timeout", type=_timeout, default=3.0,
                   help="seconds to wait for each connect and each reply (3)")
    p.add_argument("--access-key", default=os.environ.get("SHMQ_ACCESS_KEY", ""),
                   help="ACL account to sign every request with, as shmq admin's")
    p.add_argument("--secret-key", default=os.environ.get("SHMQ_SECRET_KEY", ""),
                   help="its secret key (default: $SHMQ_SECRET_KEY)")
    p.set_defaults(func=_run, _parser=p)


def _run(args) -> int:
    import logging

    from ..admin import credentials, namesrv_addr
    from .server import Console

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    args.namesrvAddr = namesrv_addr(args._parser, args.namesrvAddr)
    creds = credentials(args._parser, args)
    try:
        console = Console(args.port, args.namesrvAddr, args.timeout, creds, args.interval)
    except OSError as e:
        print(f"shmq console: cannot listen on 127.0.0.1:{args.port}: {e.strerror or e}",
              file=sys.stderr)
        return 1
    port = console.server_address[1]
    print(f"shmq console ready http://127.0.0.1:{port}/ namesrv={args.namesrvAddr}", flush=True)
    try:
        console.serve()
    except KeyboardInterrupt:
        pass
    return 0
