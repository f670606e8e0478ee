"""Consume TopicTest (tags TagA or TagB) until `count` messages, `seconds`
seconds or Ctrl-C, then shut down, which commits the group's offsets to the
broker: run it again and it gets only what was sent since.

    python examples/quickstart_consumer.py [count] [seconds]
"""
import sys
import threading

from shmq.client import ConsumeConcurrentlyStatus, PushConsumer

count = int(sys.argv[1]) if len(sys.argv) > 1 else 10
seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 60
received, lock, done = [], threading.Lock(), threading.Event()


def on_messages(msgs, context):
    # runs on the consumer's threads, several at once: collect, print later
    with lock:
        received.extend(msgs)
        if len(received) >= count:
            done.set()
    return ConsumeConcurrentlyStatus.CONSUME_SUCCESS


# the NameServer: $NAMESRV_ADDR, or 127.0.0.1:9876
consumer = PushConsumer("quickstart-consumer", consume_from_where="CONSUME_FROM_FIRST_OFFSET")
consumer.subscribe("TopicTest", "TagA || TagB")
consumer.register_message_listener(on_messages)
try:
    with consumer:               # start(); on leaving, shutdown() commits the offsets
        done.wait(seconds)
except KeyboardInterrupt:
    pass
with lock:
    for m in received:
        print(m.topic, m.tags, m.keys, m.msg_id, m.body.decode())
    print(len(received), "messages received, offsets committed")
