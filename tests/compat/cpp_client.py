"""Drives the real RocketMQ C++ core (PyPI `rocketmq==0.4.4`, a ctypes wrapper
over librocketmq) for the compatibility tests; it is not a test double.

Run it with HOME set to a scratch directory: librocketmq writes its logs and
local offset files under $HOME.

Subcommands (every line on stdout is one JSON object):

``produce --namesrv A --group G --topic T``
    Reads requests from stdin, one JSON object a line, and answers each with
    one line. Requests: ``{"mode": "sync"|"oneway"|"orderly"|"batch", "body":
    str, "tags": str, "keys": str, "props": {..}, "arg": int, "delayLevel": int}``
    (``delayLevel``: ``Message.set_delay_time_level``, the DELAY property); batch takes
    ``"msgs": [{"body", "tags", "keys"}, ...]``. ``orderly`` uses the wrapper's
    hashing selector: queue = arg % number of queues. Answers:
    ``{"event": "sent", "mode", "body", "status", "msgId", "offset"}`` or
    ``{"event": "error", "body", "error"}``. EOF on stdin ends it.

``consume --namesrv A --group G --topic T [--expr E] [--broadcast] [--orderly]
        [--fail-prefix P --fail-times N]``
    Prints ``{"event": "started"}``, then ``{"event": "recv", "body", "tags",
    "keys", "queueId", "queueOffset", "msgId", "topic", "reconsumeTimes",
    "bornTs", "storeTs", "props", "failed", "t"}`` per message consumed,
    and ``{"event": "stopped"}`` after a clean shutdown. Stops on EOF or a
    ``stop`` line on stdin, on SIGTERM, or after ``--max-seconds``.
    ``--fail-prefix``: answer RECONSUME_LATER while a message whose body starts
    with P has been consumed fewer than N (``--fail-times``, default 1) times.

The wheel exposes no transaction producer and no max-reconsume-times setting:
its C API (librocketmq 1.x) has neither, so these drivers cannot use them.
"""
from __future__ import annotations

import sys
import time
import traceback

from driver import emit, parsers, run_consumer, serve_producer


def _text(v) -> str | None:
    if v is None:
        return None
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def _message(topic: str, spec: dict):
    from rocketmq.client import Message
    m = Message(topic)
    if spec.get("tags"):
        m.set_tags(spec["tags"])
    if spec.get("keys"):
        m.set_keys(spec["keys"])
    for k, v in (spec.get("props") or {}).items():
        m.set_property(k, v)
    m.set_body(spec.get("body", ""))
    if spec.get("delayLevel"):
        m.set_delay_time_level(int(spec["delayLevel"]))
    return m


def produce(args) -> int:
    from rocketmq.client import Producer, SendStatus
    p = Producer(args.group, timeout=args.send_timeout_ms)
    p.set_namesrv_addr(args.namesrv)
    p.start()

    def send(mode: str, req: dict):
        if mode == "oneway":
            p.send_oneway(_message(args.topic, req))
            return None
        if mode == "batch":
            r = p.send_batch([_message(args.topic, m) for m in req["msgs"]])
        elif mode == "orderly":
            r = p.send_orderly(_message(args.topic, req), int(req["arg"]))
        else:
            r = p.send_sync(_message(args.topic, req))
        return ("OK" if r.status == SendStatus.OK else str(int(r.status))), r.msg_id, r.offset
    return serve_producer(p, send)


def consume(args) -> int:
    from rocketmq.client import PushConsumer
    from rocketmq.ffi import MessageModel
    def on_message(msg) -> bool:
        """Report one delivery; True asks for a redelivery (RECONSUME_LATER)."""
        props = {}
        for k in args.show_props:
            v = msg.get_property(k)
            if v:
                props[k] = _text(v)
        body = _text(msg.body)
        fail = bool(args.fail_prefix) and (body or "").startswith(args.fail_prefix) \
            and msg.reconsume_times < args.fail_times
        emit(event="recv", body=body, tags=_text(msg.tags), keys=_text(msg.keys),
             queueId=msg.queue_id, queueOffset=msg.queue_offset, msgId=msg.id, topic=msg.topic,
             reconsumeTimes=msg.reconsume_times, bornTs=msg.born_timestamp,
             storeTs=msg.store_timestamp, props=props, failed=fail, t=time.time())
        if args.consume_delay_ms:
            time.sleep(args.consume_delay_ms / 1000)
        return fail

    # The wrapper's subscribe() cannot ask for a redelivery: it re-raises the
    # callback's exception, and ctypes then returns 0 (CONSUME_SUCCESS). So
    # register the message callback ourselves with the same two library calls
    # (Subscribe + RegisterMessageCallback[Orderly]), returning the status.
    from rocketmq.client import RecvMessage
    from rocketmq.exceptions import ffi_check
    from rocketmq.ffi import dll

    def raw_callback(_consumer, cmsg):
        try:
            return 1 if on_message(RecvMessage(cmsg)) else 0     # RECONSUME_LATER / CONSUME_SUCCESS
        except Exception:
            traceback.print_exc()
            return 1

    model = MessageModel.BROADCASTING if args.broadcast else MessageModel.CLUSTERING
    c = PushConsumer(args.group, orderly=args.orderly, message_model=model)
    c.set_namesrv_addr(args.namesrv)
    if args.instance:
        c.set_instance_name(args.instance)
    c.set_thread_count(args.threads)
    ffi_check(dll.Subscribe(c._handle, args.topic.encode(), args.expr.encode()))
    c._register_callback(raw_callback)
    return run_consumer(c, args.max_seconds)


def main(argv=None) -> int:
    ap, pp, pc = parsers(__doc__.split("\n")[0])
    pp.add_argument("--send-timeout-ms", type=int, default=5000)
    pc.add_argument("--instance", default=None, help="instance name (two consumers in one process need distinct ones)")
    pc.add_argument("--threads", type=int, default=2)
    pc.add_argument("--consume-delay-ms", type=int, default=0)
    pc.add_argument("--fail-prefix", "--fail-once-prefix", dest="fail_prefix", default="",
                    help="answer RECONSUME_LATER to the first --fail-times deliveries of bodies "
                         "starting with this")
    pc.add_argument("--fail-times", type=int, default=1)
    pc.add_argument("--show-props", nargs="*", default=[], help="property names to report per message")
    args = ap.parse_args(argv)
    try:
        import rocketmq.client  # noqa: F401
    except Exception as e:
        emit(event="error", error=f"cannot import rocketmq: {e}")
        return 3
    try:
        return produce(args) if args.cmd == "produce" else consume(args)
    except Exception as e:
        emit(event="error", error=f"{type(e).__name__}: {e}", trace=traceback.format_exc())
        return 1


if __name__ == "__main__":
    sys.exit(main())
