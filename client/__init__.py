"""shmq's pure-Python RocketMQ 4.x client: asyncio at the core, blocking on top.

Blocking (``from shmq.client import Producer, Message``)::

    with Producer("my-group", namesrv_addr="127.0.0.1:9876") as p:
        r = p.send(Message("TopicA", b"hello", tags="TagA", keys="order-1"))
        print(r.status, r.msg_id, r.queue, r.queue_offset)

Consumers: ``PushConsumer`` (concurrently or orderly listeners, or a batch
listener taking each pull as numpy columns; clustering or broadcasting) and ``LitePullConsumer`` (poll, commit, seek). asyncio: the
``Async…`` classes, same methods, awaited.
It speaks the RocketMQ 4.x protocol, so it works with shmq and with any 4.x
broker; it never imports the broker.
"""
from .batch import MessageBatch
from .blocking import LitePullConsumer, Producer, PushConsumer, TransactionProducer
from .consumer import (AsyncPushConsumer, ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus,
                       ConsumeOrderlyContext, ConsumeOrderlyStatus, MessageListenerConcurrently,
                       MessageListenerOrderly)
from .errors import BackgroundFailure
from .instance import ClientConfig, MQClientError
from .lite_pull import AsyncLitePullConsumer
from .message import Message, MessageExt, MessageQueue, SendResult, SendStatus
from .producer import (AsyncProducer, AsyncTransactionProducer, FlushResult, LocalTransactionState,
                       PutFailed, TransactionListener, select_by_hash)
from .rebalance import averagely, averagely_by_circle, by_config, consistent_hash

__all__ = ["AsyncLitePullConsumer", "AsyncProducer", "AsyncPushConsumer",
           "AsyncTransactionProducer", "BackgroundFailure", "ClientConfig", "ConsumeConcurrentlyContext",
           "ConsumeConcurrentlyStatus", "ConsumeOrderlyContext", "ConsumeOrderlyStatus", "FlushResult",
           "LitePullConsumer", "LocalTransactionState", "MQClientError", "Message",
           "MessageBatch", "MessageExt", "MessageListenerConcurrently", "MessageListenerOrderly",
           "MessageQueue", "Producer", "PutFailed", "PushConsumer", "SendResult", "SendStatus",
           "TransactionListener", "TransactionProducer", "averagely", "averagely_by_circle",
           "by_config", "consistent_hash", "select_by_hash"]
