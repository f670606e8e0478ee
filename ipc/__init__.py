"""Everything between processes and over the wire: the shared-memory control
block, the append lock and wake-ups (``control``, ``wakeup``, ``table``;
DESIGN §5); RocketMQ's remoting protocol (``remoting``: frames and headers,
``headers``: request schemas, ``codes``, ``fastjson``), request signing
(``signing``) and the blocking, pipelining connection both the broker and
the client use (``channel``)."""
