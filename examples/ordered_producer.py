"""Ordered messages: every step of one order goes to the same queue.

    python examples/ordered_producer.py
"""
from shmq.client import Message, Producer, select_by_hash

with Producer("ordered-producer") as producer:
    for order_id in range(5):
        for step in ("created", "paid", "shipped"):
            msg = Message("OrderTopic", f"order {order_id}: {step}".encode(), tags=step,
                          keys=f"order-{order_id}")
            r = producer.send(msg, selector=select_by_hash, arg=order_id)
            print(order_id, step, "→ queue", r.queue.queue_id)
