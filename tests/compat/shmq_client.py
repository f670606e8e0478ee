"""Drives shmq's own Python client with the same JSON-lines protocol as
``cpp_client.py`` (see there), so the compatibility tests can pair it with
the real RocketMQ clients in both directions.

``produce``: modes sync, oneway, orderly (queue = arg % queues), batch.
``consume``: a push consumer (clustering or ``--broadcast``, ``--orderly``).
"""
from __future__ import annotations

import sys
import time

from driver import emit, parsers, run_consumer, serve_producer

from shmq.client import Message, Producer

def _message(topic: str, spec: dict) -> Message:
    return Message(topic, spec.get("body", "").encode(), tags=spec.get("tags") or None,
                   keys=spec.get("keys") or None, properties=dict(spec.get("props") or {}),
                   delay_level=int(spec.get("delayLevel") or 0))


def by_modulo(queues, msg, arg):
    return queues[int(arg) % len(queues)]


def produce(args) -> int:
    p = Producer(args.group, namesrv_addr=args.namesrv).start()

    def send(mode: str, req: dict):
        if mode == "oneway":
            p.send_oneway(_message(args.topic, req))
            return None
        if mode == "batch":
            r = p.send_batch([_message(args.topic, m) for m in req["msgs"]])
        elif mode == "orderly":
            r = p.send(_message(args.topic, req), selector=by_modulo, arg=req["arg"])
        else:
            r = p.send(_message(args.topic, req))
        return ("OK" if r.status.value == "SEND_OK" else r.status.value), r.msg_id, r.queue_offset
    return serve_producer(p, send)


def consume(args) -> int:
    from shmq.client import (ConsumeConcurrentlyStatus, ConsumeOrderlyStatus,
                             MessageListenerConcurrently, MessageListenerOrderly, PushConsumer)
    def on_message(msgs, context=None):
        for msg in msgs:
            body = msg.body.decode("utf-8", "replace")
            emit(event="recv", body=body, tags=msg.tags, keys=msg.keys,
                 queueId=msg.queue_id, queueOffset=msg.queue_offset, msgId=msg.msg_id,
                 topic=msg.topic, reconsumeTimes=msg.reconsume_times, bornTs=msg.born_timestamp,
                 storeTs=msg.store_timestamp, props={}, failed=False, t=time.time())
        return ConsumeOrderlyStatus.SUCCESS if args.orderly else ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    c = PushConsumer(args.group, namesrv_addr=args.namesrv,
                     message_model="BROADCASTING" if args.broadcast else "CLUSTERING",
                     consume_from_where="CONSUME_FROM_FIRST_OFFSET")
    c.subscribe(args.topic, args.expr)
    wrap = MessageListenerOrderly if args.orderly else MessageListenerConcurrently
    c.register_message_listener(wrap(on_message))
    return run_consumer(c, args.max_seconds)


def main(argv=None) -> int:
    ap, pp, pc = parsers(__doc__.split("\n")[0])
    args = ap.parse_args(argv)
    return produce(args) if args.cmd == "produce" else consume(args)


if __name__ == "__main__":
    sys.exit(main())
