"""Broadcasting: every consumer of the group gets every message of TopicTest
(run two of these, then quickstart_producer.py). Each reads from the topic's
first message, the ones already there included, and stops after `count`
messages (at least: a pulled batch is printed whole) or 60 s.

    python examples/broadcast_consumer.py [count]
"""
import sys
import threading

from shmq.client import ConsumeConcurrentlyStatus, PushConsumer

count = int(sys.argv[1]) if len(sys.argv) > 1 else 10
done = threading.Event()
seen = []


def on_messages(msgs, context):
    seen.extend(msgs)
    for m in msgs:
        # one write per line: listeners run on several threads
        sys.stdout.write(f"broadcast {m.msg_id} {m.body.decode()}\n")
    if len(seen) >= count:
        done.set()
    return ConsumeConcurrentlyStatus.CONSUME_SUCCESS


consumer = PushConsumer("broadcast-consumer", message_model="BROADCASTING",
                        consume_from_where="CONSUME_FROM_FIRST_OFFSET")
consumer.subscribe("TopicTest", "*")
consumer.register_message_listener(on_messages)
consumer.start()
try:
    done.wait(60)
finally:
    consumer.shutdown()
