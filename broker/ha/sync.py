"""A slave's copy of its master's topics and subscription groups
(RocketMQ's ``SlaveSynchronize``, run by the services process of a SLAVE).

As soon as the master is known (RocketMQ waits 3 s), then every
SYNC_EVERY_S: ask the master (the
``masterAddr`` its registration reply named, ``slave.learned``) for
GET_ALL_TOPIC_CONFIG (21) and GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201), plain
requests with no header; when a table's ``dataVersion`` differs from the one
last taken, the local table becomes the master's (entries added, changed
and removed), so pulls and queries on the slave know every topic the
master has. Consumer offsets (43) and delay offsets (45) are not synced
yet. A master that does not answer is tried again at the next round.
"""
from __future__ import annotations

import logging

import orjson

from shmq.core.checkpoint import parse_json_lenient
from shmq.ipc.channel import RemotingClient
from shmq.ipc.codes import RequestCode as RC
from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.remoting import RemotingCommand

from ..config import BrokerConfig
from ..topics import Tables
from .slave import load_learned

log = logging.getLogger("shmq.ha")
SYNC_EVERY_S = 10.0
TIMEOUT_S = 3.0


class SlaveSync:
    def __init__(self, config: BrokerConfig, tables: Tables, now: float):
        self.config, self.tables = config, tables
        self.next = now
        self.versions: dict[str, object] = {}
        self.client: RemotingClient | None = None
        self.addr = ""

    def step(self, now: float) -> None:
        if now < self.next:
            return
        master = load_learned(self.config.store.storePathRootDir).get("masterAddr", "")
        if not master or master == self.config.addr:
            self.next = now + 1.0         # not learned yet: look again soon
            return
        self.next = now + SYNC_EVERY_S
        t = self.tables
        try:
            for code, table, key in ((RC.GET_ALL_TOPIC_CONFIG, t.topics, "topicConfigTable"),
                                     (RC.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, t.groups,
                                      "subscriptionGroupTable")):
                self._sync(master, code, table, key)
        except OSError as e:
            log.warning("syncing from the master %s: %s", master, e)
            self.close()

    def _sync(self, master: str, code: int, table, key: str) -> None:
        if self.client is None or self.addr != master:
            self.close()
            self.client, self.addr = RemotingClient(master, timeout=TIMEOUT_S), master
        r = self.client.invoke(RemotingCommand(code), timeout=TIMEOUT_S)
        if r.code != R.SUCCESS:
            return                  # e.g. SYSTEM_ERROR "No topic in this broker"
        try:
            body = orjson.loads(r.body)
        except orjson.JSONDecodeError:
            body = parse_json_lenient(bytes(r.body).decode("utf-8", "replace"))
        remote = body.get(key) if isinstance(body, dict) else None
        if not isinstance(remote, dict) or body.get("dataVersion") == self.versions.get(key):
            return
        local = table.current()
        theirs = {n: table.entry.from_json(n, v) for n, v in remote.items() if isinstance(v, dict)}
        changes = {n: v for n, v in theirs.items() if local.get(n) != v}
        changes.update({n: None for n in local if n not in theirs})
        if changes:
            table.update(changes)
            log.info("from the master %s: %d %s entries changed", master, len(changes), key)
        self.versions[key] = body.get("dataVersion")

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
