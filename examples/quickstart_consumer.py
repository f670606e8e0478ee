"""Consume TopicTest (tags TagA or TagB) until `count` messages or Ctrl-C.

    python examples/quickstart_consumer.py [count]
"""
import sys
import threading

from shmq.client import ConsumeConcurrentlyStatus, PushConsumer

count = int(sys.argv[1]) if len(sys.argv) > 1 else 10
done = threading.Event()
seen = []


def on_messages(msgs, context):
    for m in msgs:
        # one write per line: listeners run on several threads
        sys.stdout.write(f"{m.topic} {m.tags} {m.msg_id} {m.body.decode()}\n")
        seen.append(m)
    if len(seen) >= count:
        done.set()
    return ConsumeConcurrentlyStatus.CONSUME_SUCCESS


consumer = PushConsumer("quickstart-consumer", consume_from_where="CONSUME_FROM_FIRST_OFFSET")
consumer.subscribe("TopicTest", "TagA || TagB")
consumer.register_message_listener(on_messages)
consumer.start()
try:
    done.wait(60)
finally:
    consumer.shutdown()
