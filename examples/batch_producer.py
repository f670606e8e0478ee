"""Batch send: many small messages in one request (one topic, one queue).

    python examples/batch_producer.py [count]
"""
import sys

from shmq.client import Message, Producer

count = int(sys.argv[1]) if len(sys.argv) > 1 else 100
with Producer("batch-producer") as producer:
    msgs = [Message("BatchTopic", b"message %d" % i, tags="batch") for i in range(count)]
    r = producer.send_batch(msgs)
    print(r.status.value, "queue", r.queue.queue_id, "first offset", r.queue_offset,
          len(r.msg_id.split(",")), "messages")
