"""What every compatibility driver shares: JSON lines out, requests in.

``serve_requests(send)`` reads one JSON request a line from stdin until EOF
or ``stop`` and answers each with one ``sent`` or ``error`` line; ``send(mode,
req)`` performs it and returns (status, msgId, offset), or None for a send
that has no answer (oneway). ``wait_for_stop`` blocks a consumer until
``stop`` or EOF on stdin, SIGTERM, or ``max_seconds``. ``serve_producer`` and
``run_consumer`` wrap them with the started/stopped lines and shutdown;
``parsers`` gives the command line every driver takes.
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from typing import Callable

_out_lock = threading.Lock()
MODES = ("sync", "oneway", "orderly", "batch")


def emit(**obj) -> None:
    line = json.dumps(obj, sort_keys=True)
    with _out_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def serve_requests(send: Callable[[str, dict], tuple | None]) -> None:
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        if line == "stop":
            break
        req = json.loads(line)
        mode = req.get("mode", "sync")
        if mode not in MODES:
            emit(event="error", body=req.get("body"), error=f"unknown mode {mode}")
            continue
        try:
            answer = send(mode, req)
        except Exception as e:      # report, keep serving: the test decides
            emit(event="error", mode=mode, body=req.get("body"), error=f"{type(e).__name__}: {e}")
            continue
        status, msg_id, offset = answer or ("OK", None, None)
        emit(event="sent", mode=mode, body=req.get("body"),
             bodies=[m.get("body") for m in req.get("msgs", [])] or None,
             status=status, msgId=msg_id, offset=offset)


def wait_for_stop(max_seconds: float) -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def read_stdin():
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        stop.set()
    threading.Thread(target=read_stdin, daemon=True).start()
    stop.wait(max_seconds)


def serve_producer(producer, send: Callable[[str, dict], tuple | None]) -> int:
    """A started producer: announce it, serve requests, shut it down."""
    emit(event="started")
    try:
        serve_requests(send)
    finally:
        producer.shutdown()
        emit(event="stopped")
    return 0


def run_consumer(consumer, max_seconds: float) -> int:
    """Start a configured consumer, run until told to stop, shut it down."""
    consumer.start()
    emit(event="started")
    wait_for_stop(max_seconds)
    consumer.shutdown()
    emit(event="stopped")
    return 0


def parsers(description: str) -> tuple[argparse.ArgumentParser, argparse.ArgumentParser,
                                        argparse.ArgumentParser]:
    """(the driver's parser, its ``produce`` and ``consume`` sub-parsers) with
    the options every driver has; a driver adds its own."""
    ap = argparse.ArgumentParser(description=description)
    sub = ap.add_subparsers(dest="cmd", required=True)
    pp = sub.add_parser("produce")
    pc = sub.add_parser("consume")
    for p in (pp, pc):
        p.add_argument("--namesrv", required=True)
        p.add_argument("--group", required=True)
        p.add_argument("--topic", required=True)
    pc.add_argument("--expr", default="*")
    pc.add_argument("--broadcast", action="store_true")
    pc.add_argument("--orderly", action="store_true")
    pc.add_argument("--max-seconds", type=float, default=120.0)
    return ap, pp, pc
