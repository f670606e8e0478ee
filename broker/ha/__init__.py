"""Master/slave replication, speaking RocketMQ 4.x's own HA protocol.

A master streams its CommitLog to its slaves over a plain TCP connection on
``haListenPort`` (listenPort + 1), with no remoting framing, byte for byte
as RocketMQ 4.9's ``HAService``, ``HAConnection`` and ``HAClient`` speak it
(``shared/reference/rocketmq-ha-acl-timer-trace.md`` §1), so that a RocketMQ
4.x broker can be either end (untried here: no Java broker runs on this
machine). The two directions, big-endian (``protocol``)::

    slave → master, repeated, nothing else ever:
        0          8
        +----------+
        | int64    |  the slave's CommitLog max offset (received bytes):
        +----------+  the first one is where to start (0: the master's first
                      retained segment), every one acks the bytes below it

    master → slave, repeated:
        0          8          12                 12 + size
        +----------+----------+------------------+
        | int64    | int32    | size bytes of    |
        | offset   | size     | CommitLog        |
        +----------+----------+------------------+
        offset: where the bytes lie in the master's CommitLog; size <=
        haTransferBatchSize, or 1 MiB when more waits (a backlog); a
        frame never crosses a segment's end and may begin or end inside
        a record; size 0: a heartbeat, sent after haSendHeartbeatInterval
        ms with nothing to send

Who runs what, and who writes what:

- ``shmq-ha``, one process beside the workers (``process``), started and
  restarted by the boss. On a master (``master.HAService``) it accepts
  slaves on the socket the boss bound, reads their reports, sends CommitLog
  bytes straight from the shared mapping up to the published ``write_pos``
  (woken by every publish, WANT_PUBLISH), and publishes in the store state
  ``ha_slaves`` (connections) and ``confirm_pos`` (the highest offset a
  slave acked: RocketMQ's push2SlaveMaxOffset, it only grows), waking the
  workers that hold SYNC_MASTER sends (WANT_FLUSH). A worker never waits on
  a slave: it parks the send (``broker/parking.py``) and answers it when
  ``confirm_pos`` passes its end — one ack releases every waiting send —
  or FLUSH_SLAVE_TIMEOUT after ``slaveTimeout``; with no slave connected (or
  one ``haSlaveFallbehindMax`` behind) it answers SLAVE_NOT_AVAILABLE at
  once. Either way the message is stored, as RocketMQ's is.
- On a slave (``slave.HAClient``) the same process connects to
  ``haMasterAddress``, or to the ``haServerAddr`` the NameServer answered
  the slave's registration with (the services process writes it to
  ``<store>/haMaster.json``, ``learned``), reports its offset at once, after
  every frame it applied and every ``haSendHeartbeatInterval``, and hands
  each frame to ``core.replica.Replica``, the only writer of a slave's
  CommitLog: ConsumeQueues and the published positions follow as for any
  append, and the services process indexes the records. A slave refuses
  every client write (SERVICE_NOT_AVAILABLE, RocketMQ's remark), serves
  pulls and queries, runs no delay, timer or transaction check-back, and
  registers as its ``brokerId`` (> 0).

Where shmq differs from RocketMQ 4.9, on purpose: a slave reports its offset
on connecting, not 5 s later; an empty slave is sent the master's whole
retained CommitLog (RocketMQ: from its last segment only); a backlog goes
in 1 MiB frames, not haTransferBatchSize's 32 KiB (the slave's cost is per
frame; a Java HAClient's 4 MiB read buffer holds such a frame whole); a slave
closes a connection after ``haHousekeepingInterval`` without a byte from the
master (RocketMQ 5's check; 4.9's looks at its own writes and never fires).
"""
