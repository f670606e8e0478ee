"""The NameServer (RocketMQ's NamesrvController): route tables, bodies, server.

    routes   ``NameServer``: the route tables (RouteInfoManager) and every
             request they answer, sans I/O (a command in, a reply out)
    bodies   RegisterBrokerBody decoded and encoded; the requests a broker
             sends to register and unregister
    server   the process: ``serve`` puts ``NameServer`` behind a reactor
"""
from .bodies import (QueueData, RegisterBody, decode_register_body, encode_register_body,
                     quote_bare_keys, register_broker_request, unregister_broker_request)
from .routes import GUARDED, BrokerData, Live, NameServer
from .server import listen, serve

__all__ = ["GUARDED", "BrokerData", "Live", "NameServer", "QueueData", "RegisterBody",
           "decode_register_body", "encode_register_body", "listen", "quote_bare_keys",
           "register_broker_request", "serve", "unregister_broker_request"]
