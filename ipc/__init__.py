"""Everything between processes and over the wire: the shared-memory control
block, the append lock and wake-ups (``control``, ``wakeup``, ``table``;
DESIGN §5); RocketMQ's remoting protocol (``remoting``: frames and headers,
``headers``: request schemas, ``codes``, ``fastjson``), request signing
(``signing``), the sans-I/O pairing of requests and replies by opaque
(``matcher``) under both connections, and the blocking, pipelining one
(``channel``) the broker's services, tools and scripts use; the client's
asyncio connection is ``client/connection.py``."""
