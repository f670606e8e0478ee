"""Transactional messages: commit one, roll back one, leave one to the
broker's check (answered by check_local_transaction). It then waits for that
check, up to 70 s ($TX_WAIT_S), since the broker asks at its next check round.

    python examples/transaction_producer.py
"""
import os
import threading

from shmq.client import LocalTransactionState, Message, TransactionListener, TransactionProducer

checked = threading.Event()


class Orders(TransactionListener):
    def execute_local_transaction(self, msg, arg):
        print("local transaction for", msg.body.decode(), "→", arg)
        return arg

    def check_local_transaction(self, msg):
        print("the broker asks about", msg.msg_id, "→ commit")
        checked.set()
        return LocalTransactionState.COMMIT_MESSAGE


with TransactionProducer("tx-producer", Orders()) as producer:
    for body, state in ((b"order 1", LocalTransactionState.COMMIT_MESSAGE),
                        (b"order 2", LocalTransactionState.ROLLBACK_MESSAGE),
                        (b"order 3", LocalTransactionState.UNKNOW)):
        r = producer.send_message_in_transaction(Message("TxTopic", body), state)
        print(body.decode(), r.status.value, r.local_transaction_state.name)
    # the broker asks about order 3 after transactionTimeOut, at its next check round
    # (transactionCheckInterval, 60 s by default): stay up to answer
    wait = float(os.environ.get("TX_WAIT_S", "70"))
    print(f"waiting up to {wait:g} s for the broker's check of order 3 …", flush=True)
    if not checked.wait(wait):
        print(f"no check within {wait:g} s: order 3 stays pending until a tx-producer "
              "answers a later check round")
