"""Send ten messages to TopicTest (start the broker first: `shmq broker`).

    python examples/quickstart_producer.py [count]
"""
import sys

from shmq.client import Message, Producer

count = int(sys.argv[1]) if len(sys.argv) > 1 else 10
# the NameServer: $NAMESRV_ADDR, or 127.0.0.1:9876
with Producer("quickstart-producer") as producer:
    for i in range(count):
        r = producer.send(Message("TopicTest", b"Hello shmq %d" % i, tags="TagA", keys=f"key-{i}"))
        print(r.status.value, r.msg_id, "queue", r.queue.queue_id, "offset", r.queue_offset)
