"""Transactional messages: commit one, roll back one, leave one to the
broker's check (answered by check_local_transaction).

    python examples/transaction_producer.py
"""
import os
import time

from shmq.client import LocalTransactionState, Message, TransactionListener, TransactionProducer


class Orders(TransactionListener):
    def execute_local_transaction(self, msg, arg):
        print("local transaction for", msg.body.decode(), "→", arg)
        return arg

    def check_local_transaction(self, msg):
        print("the broker asks about", msg.msg_id, "→ commit")
        return LocalTransactionState.COMMIT_MESSAGE


with TransactionProducer("tx-producer", Orders()) as producer:
    for body, state in ((b"order 1", LocalTransactionState.COMMIT_MESSAGE),
                        (b"order 2", LocalTransactionState.ROLLBACK_MESSAGE),
                        (b"order 3", LocalTransactionState.UNKNOW)):
        r = producer.send_message_in_transaction(Message("TxTopic", body), state)
        print(body.decode(), r.status.value, r.local_transaction_state.name)
    # the broker asks about order 3 after transactionTimeOut, at its next check round
    # (transactionCheckInterval, 60 s by default): stay up to answer
    time.sleep(float(os.environ.get("TX_WAIT_S", "70")))
