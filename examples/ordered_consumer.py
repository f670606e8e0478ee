"""Consume OrderTopic orderly: one queue at a time, in order, with a queue lock.

    python examples/ordered_consumer.py [count]
"""
import sys
import threading

from shmq.client import ConsumeOrderlyStatus, MessageListenerOrderly, PushConsumer

count = int(sys.argv[1]) if len(sys.argv) > 1 else 15
done = threading.Event()
seen = set()            # delivery is at least once: a queue handed over may replay a message


def on_messages(msgs, context):
    for m in msgs:
        # one write per line: listeners run on several threads
        sys.stdout.write(f"queue {m.queue_id} {m.body.decode()}\n")
        seen.add(m.msg_id)
    if len(seen) >= count:
        done.set()
    return ConsumeOrderlyStatus.SUCCESS


consumer = PushConsumer("ordered-consumer", consume_from_where="CONSUME_FROM_FIRST_OFFSET")
consumer.subscribe("OrderTopic", "*")
consumer.register_message_listener(MessageListenerOrderly(on_messages))
consumer.start()
try:
    done.wait(60)
finally:
    consumer.shutdown()
