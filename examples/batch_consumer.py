"""A batch listener: each pull's messages as numpy columns (run after
batch_producer.py). Reads BatchTopic from its first message and stops
after `count` messages or 60 s; prints each batch's queue, size and
offsets, then the total.

    python examples/batch_consumer.py [count]
"""
import sys
import threading

import numpy as np

from shmq.client import ConsumeConcurrentlyStatus, PushConsumer

count = int(sys.argv[1]) if len(sys.argv) > 1 else 100
done = threading.Event()
lock = threading.Lock()
seen = []


def on_batch(batch, context):
    # no object a message: the arrays say where each body is in batch.data
    raw = np.frombuffer(batch.data, np.uint8)
    numbers = [int(raw[o + 8:o + n].tobytes()) for o, n in zip(batch.body_offsets, batch.body_lengths)]
    with lock:
        seen.extend(numbers)
        sys.stdout.write(f"queue {batch.queue.queue_id}: {len(batch)} messages, offsets "
                         f"{batch.queue_offsets[0]}..{batch.queue_offsets[-1]}\n")
        if len(seen) >= count:
            done.set()
    return ConsumeConcurrentlyStatus.CONSUME_SUCCESS


consumer = PushConsumer("batch-consumer", consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                        pull_batch_size=256)
consumer.subscribe("BatchTopic", "batch")
consumer.register_batch_listener(on_batch)
consumer.start()
try:
    done.wait(60)
finally:
    consumer.shutdown()
print(f"{len(seen)} messages, numbered {min(seen, default=0)}..{max(seen, default=0)}")
