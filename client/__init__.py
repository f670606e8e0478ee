"""shmq's pure-Python RocketMQ 4.x client: asyncio at the core, blocking on top.

Blocking (``from shmq.client import Producer, Message``)::

    with Producer("my-group", namesrv_addr="127.0.0.1:9876") as p:
        r = p.send(Message("TopicA", b"hello", tags="TagA", keys="order-1"))
        print(r.status, r.msg_id, r.queue, r.queue_offset)

asyncio: ``AsyncProducer``, ``AsyncTransactionProducer`` (same methods, awaited).
It speaks the RocketMQ 4.x protocol, so it works with shmq and with any 4.x
broker; it never imports the broker.
"""
from .blocking import Producer, TransactionProducer
from .instance import ClientConfig, MQClientError
from .message import Message, MessageExt, MessageQueue, SendResult, SendStatus
from .producer import (AsyncProducer, AsyncTransactionProducer, LocalTransactionState,
                       TransactionListener, select_by_hash)

__all__ = ["AsyncProducer", "AsyncTransactionProducer", "ClientConfig", "LocalTransactionState",
           "MQClientError", "Message", "MessageExt", "MessageQueue", "Producer", "SendResult",
           "SendStatus", "TransactionListener", "TransactionProducer", "select_by_hash"]
