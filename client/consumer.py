"""The consumers' public names, in one place: RocketMQ's ``client.consumer`` package.

As in the Java client, where ``org.apache.rocketmq.client.consumer`` holds
what applications use (DefaultMQPushConsumer, the listeners and their
statuses, PullResult) and ``client.impl.consumer`` the machinery
(ProcessQueue, PullAPIWrapper, RebalanceImpl, the consume services), this
module gathers the consumer names users import and holds no code. Each
idea has its own module, of one idea each:

    subscription.py          SubscriptionData: a topic's TAG or SQL92 filter
    process_queue.py         ProcessQueue: one held queue between pull and commit
    pull.py                  pull_kernel, PullResult, PullStatus (PullAPIWrapper)
    walk.py                  a pull's records walked into rows (a numba kernel, or Python)
    batch.py                 MessageBatch: a pull as numpy columns, for a batch listener
    listeners.py             listeners, statuses, contexts; how a listener is called
    consumer_base.py         ConsumerSettings, ConsumerBase: what push and lite pull share
    push_consumer.py         AsyncPushConsumer, PushConsumerConfig: rebalance and pull loops
    consume_concurrently.py  ConsumeMessageConcurrentlyService
    consume_orderly.py       ConsumeMessageOrderlyService
    queue_locks.py           orderly consumption's broker locks
    retry.py                 send back, the retry topic
    background.py            background loops: expected errors back off, bugs stop loudly
    lite_pull.py             AsyncLitePullConsumer (DefaultLitePullConsumer)

Every name ``shmq.client.consumer`` defined before the split is importable
from here still (names it merely imported, such as the request builders
and offset-store helpers, come from their own modules).
"""
from __future__ import annotations

# the names not in __all__ are what consumer.py defined before the split
# (or imported and users may have taken from it): kept importable here
# ruff: noqa: F401
from .consume_concurrently import SEND_BACK_RETRY_DELAY
from .consume_orderly import MAX_TIME_CONSUME_CONTINUOUSLY
from .consumer_base import GROUP_NAME, ConsumerBase, ConsumerSettings, check_group, split_settings
from .errors import BackgroundFailure, MQClientError, RemotingError
from .instance import ClientConfig, ClientInstance
from .listeners import (INT_MAX, ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus,
                        ConsumeOrderlyContext, ConsumeOrderlyStatus, Listener,
                        MessageListenerConcurrently, MessageListenerOrderly)
from .batch import MessageBatch
from .message import MessageExt, MessageQueue
from .process_queue import LOCK_INTERVAL, LOCK_MAX_LIVE, PULL_MAX_IDLE, ProcessQueue
from .pull import FLOW_CONTROL_DELAY, PULL_STATUS, PullRequest, PullResult, PullStatus, pull_kernel
from .push_consumer import SUSPENDED_DELAY, UNLOCK_DELAY, AsyncPushConsumer, PushConsumerConfig
from .queue_locks import LOCK_TIMEOUT
from .retry import (DELAY, ORIGIN_MESSAGE_ID, RETRY_PREFIX, RETRY_TOPIC, SEND_BACK_TIMEOUT,
                    SYSFLAG_COMPRESSED, TRAN_MSG, restore_retry_topic)
from .subscription import SubscriptionData

__all__ = ["AsyncPushConsumer", "BackgroundFailure", "ConsumeConcurrentlyContext",
           "ConsumeConcurrentlyStatus", "ConsumeOrderlyContext", "ConsumeOrderlyStatus",
           "MessageBatch", "MessageListenerConcurrently", "MessageListenerOrderly", "ProcessQueue",
           "PullResult",
           "PullStatus", "PushConsumerConfig", "SubscriptionData", "pull_kernel"]

