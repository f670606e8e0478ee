"""The client's transport: a blocking, pipelining remoting connection.

It is ``shmq.ipc.channel.RemotingClient`` (the broker uses the same class to
call its NameServers); the client's producers and consumers build on it.
"""
from shmq.ipc.channel import RemotingClient, RemotingTimeout, connect

__all__ = ["RemotingClient", "RemotingTimeout", "connect"]
