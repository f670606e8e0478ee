"""``shmq``: the command line.

    shmq broker [-c broker.conf] [-n namesrvAddr] [-m]   a broker (+ embedded NameServer)
    shmq namesrv [-p port] [--bind host] [--acl file]     a NameServer alone

``broker`` with no arguments runs on the embedded default: store in
``~/store``, TCP 127.0.0.1:10911, ``<store>/broker.sock``, NameServer
127.0.0.1:9876; it prints where it listens once it serves. ``-m`` prints
every setting with its value and default and exits.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

from .console import port_arg     # 0..65535, one line on a bad one


def _broker(args) -> int:
    from shmq.core.jit import skip_blas_probe
    skip_blas_probe()                 # before anything loads a kernel
    from shmq.broker.boss import run_broker
    from shmq.broker.config import conf_text, load

    overrides = {}
    if args.namesrv:          # NameServers elsewhere: no embedded one (as mqbroker -n)
        overrides["namesrvAddr"] = args.namesrv
    try:
        config, unknown = load(args.config, overrides)
    except (OSError, ValueError) as e:
        print(f"shmq broker: {e}", file=sys.stderr)
        return 2
    for k in unknown:
        print(f"shmq broker: ignoring unknown setting {k!r}", file=sys.stderr)
    if args.print_config:
        for name, value, default in config.describe():
            mark = "" if value == default else f"   (default {conf_text(default)})"
            if name == "embeddedNamesrv" and value and not config.runs_embedded_namesrv:
                mark += "   (off: namesrvAddr names the NameServers)"
            print(f"{name}={conf_text(value)}{mark}")
        return 0
    if config.aclEnable:      # a bad rules file stops the start here, in one line
        from shmq.broker.acl import load_rules, own_registration_refused
        try:
            load_rules(config.acl_file)
        except ValueError as e:
            print(f"shmq broker: aclEnable: {e}", file=sys.stderr)
            return 2
        why = own_registration_refused(config.acl_file, config.credentials) \
            if config.runs_embedded_namesrv else None
        if why is not None:   # else it would start and never be routed
            print(f"shmq broker: aclEnable: the embedded NameServer would refuse this broker's "
                  f"registration ({why}): set accessKey and secretKey to an admin account of "
                  f"{config.acl_file}", file=sys.stderr)
            return 2
    if not _setup_logs("broker", "boss", config):   # the children's too (their environment)
        return 2
    try:
        return run_broker(config)
    except Exception as e:   # a clear line, not a traceback, for start-up failures
        logging.getLogger("shmq").debug("start-up failed", exc_info=True)
        print(f"shmq broker: {e}", file=sys.stderr)
        return 1


def _setup_logs(command: str, role: str, config=None) -> bool:
    """broker/logs.py's setup; a bad setting or log directory is one line."""
    from shmq.broker.logs import setup
    try:
        setup(role, config)
        return True
    except ValueError as e:
        print(f"shmq {command}: {e}", file=sys.stderr)
    except OSError as e:
        print(f"shmq {command}: logRoot: cannot make the log directory {e.filename}: "
              f"{e.strerror}", file=sys.stderr)
    return False


def _namesrv(args) -> int:
    from shmq.broker.namesrv import serve

    def ready(addr):
        print(f"shmq namesrv ready tcp={addr[0]}:{addr[1]}", flush=True)

    if args.acl:
        from shmq.broker.acl import load_rules
        try:
            load_rules(args.acl)
        except ValueError as e:
            print(f"shmq namesrv: --acl: {e}", file=sys.stderr)
            return 2
    if not _setup_logs("namesrv", "namesrv"):
        return 2
    try:
        serve(args.bind, args.port, on_ready=ready, acl_file=args.acl)
    except OSError as e:
        print(f"shmq namesrv: cannot listen on {args.bind}:{args.port}: {e}", file=sys.stderr)
        return 1
    return 0


# Each of these modules in shmq.tools has ``add_parser(subparsers)``, which adds
# its command and sets ``func`` (args -> exit code). Imports inside each
# ``func`` stay lazy, so ``shmq --help`` stays fast.
_COMMAND_MODULES: list[str] = ["admin", "bench", "console", "inspect"]
# What the broker extra installs (pyproject.toml): a command needing one of
# these says so instead of a traceback when shmq was installed without it.
BROKER_EXTRA = ("numba", "llvmlite", "posix_ipc", "yaml")


def _given(what: str):
    """An argparse type: any value but the empty one (an empty ``-c ""``
    was taken for no option at all: a broker on every default)."""
    def check(v: str) -> str:
        if not v.strip():
            raise argparse.ArgumentTypeError(f"empty: want {what}")
        return v
    return check


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="shmq", description="shmq: a RocketMQ 4.x-compatible broker")
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("broker", help="run a broker (and an embedded NameServer)")
    b.add_argument("-c", "--config", type=_given("a broker.conf path"),
                   help="broker.conf: key=value lines with RocketMQ's names")
    b.add_argument("-n", "--namesrv", type=_given("host:port[;host:port]"),
                   help="NameServer address(es), host:port;host:port, to "
                   "register with (then no embedded NameServer starts)")
    b.add_argument("-m", "--print-config", action="store_true",
                   help="print every setting with its value and default, then exit")
    b.set_defaults(func=_broker)
    n = sub.add_parser("namesrv", help="run a NameServer alone")
    n.add_argument("-p", "--port", type=port_arg, default=9876,
                   help="port to listen on (default 9876; 0: any free one)")
    n.add_argument("--bind", default="127.0.0.1", type=_given("an address to listen on"),
                   help="address to listen on (default 127.0.0.1)")
    n.add_argument("--acl", metavar="PLAIN_ACL_YML",
                   help="the brokers' plain_acl.yml: registrations and admin requests then need "
                        "an admin account's signature (or a white-listed address)")
    n.set_defaults(func=_namesrv)
    for name in _COMMAND_MODULES:
        importlib.import_module(f"shmq.tools.{name}").add_parser(sub)
    args = ap.parse_args(argv)
    try:
        return args.func(args)
    except ModuleNotFoundError as e:
        if e.name not in BROKER_EXTRA:
            raise
        print(f"shmq {args.command}: needs the broker extra ({e.name} is not installed): "
              f"pip install 'shmq[broker]' (pip install shmq is the client alone)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
