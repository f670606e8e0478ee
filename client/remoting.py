"""The blocking remoting connection, for scripts, tests and benchmarks.

It is ``shmq.ipc.channel.RemotingClient`` (the broker's services and
``shmq admin`` use the same class): send requests and wait for their
replies one call at a time, or pipeline several. The producers and
consumers of this package do not use it; they build on the asyncio
``client/connection.py``. Both match replies to requests with the one
sans-I/O ``OpaqueMatcher`` of ``ipc/matcher.py``.
"""
from shmq.ipc.channel import RemotingClient, RemotingTimeout, connect

__all__ = ["RemotingClient", "RemotingTimeout", "connect"]
