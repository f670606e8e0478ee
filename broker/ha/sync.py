"""A slave's copy of its master's topics, subscription groups and consumer
offsets (RocketMQ's ``SlaveSynchronize``, run by the services process of a SLAVE).

As soon as the master is known (RocketMQ waits 3 s), then every
SYNC_EVERY_S: ask the master (the
``masterAddr`` its registration reply named, ``slave.learned``) for
GET_ALL_TOPIC_CONFIG (21), GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201) and
GET_ALL_CONSUMER_OFFSET (43), plain requests with no header. When a table's
``dataVersion`` differs from the one last taken, the local table becomes
the master's (entries added, changed and removed), so pulls and queries on
the slave know every topic the master has; the master's consumer offsets
are put over the slave's (added and overwritten, never removed: RocketMQ's
putAll), so a consumer that moves to the slave goes on from where it
committed on the master. GET_ALL_DELAY_OFFSET (45): each delay level's
progress becomes the slave's cursor (``delivery.Progress``; a slave runs no
delay service, so nothing else moves them), saved to the slave's
``config/delayOffset.json`` as a master's is: a slave restarted as the
master re-posts from where its master had got to, not from the start. A
master that does not answer is tried again next round.

A master whose CommitLog ends before this slave's (GET_BROKER_RUNTIME_INFO's
commitLogMaxOffset, asked after reading the slave's own end: a master's
only grows) is not the one this store followed — started on another store,
or a backup's — and drops the slave's HA connection; its tables are not
copied either (they replaced the slave's topics and subscription groups
and overwrote its consumer offsets), with one WARNING, until it catches up
or the right master returns.
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
from ..delivery import DELAY_CURSOR, Progress
from ..registry import Registry
from ..topics import Tables
from .slave import load_learned

log = logging.getLogger("shmq.ha")
SYNC_EVERY_S = 10.0
TIMEOUT_S = 3.0


class SlaveSync:
    def __init__(self, config: BrokerConfig, tables: Tables, registry: Registry, now: float,
                 cursors: Progress | None = None, store=None):
        self.config, self.tables, self.registry = config, tables, registry
        self.cursors = cursors             # the services process's, None without a store
        self.store = store                 # this slave's (its CommitLog's end), None without one
        self.refused = ""                  # the master last skipped as not ours (said once)
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
            if not self._follows(master):
                return
            for code, table, key in ((RC.GET_ALL_TOPIC_CONFIG, t.topics, "topicConfigTable"),
                                     (RC.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, t.groups,
                                      "subscriptionGroupTable")):
                self._sync(master, code, table, key)
            self._offsets(master)
            self._delay_offsets(master)
        except OSError as e:
            log.warning("syncing from the master %s: %s", master, e)
            self.close()

    def _follows(self, master: str) -> bool:
        """Whether ``master``'s CommitLog could be the one this store copies."""
        if self.store is None:
            return True
        ours = self.store.state.write_pos           # first: the master's end only grows
        table = self._ask(master, RC.GET_BROKER_RUNTIME_INFO).get("table")
        try:
            theirs = int(table["commitLogMaxOffset"])
        except (TypeError, KeyError, ValueError):
            return True                                 # a master that does not say: as before
        if theirs >= ours:
            self.refused = ""
            return True
        if self.refused != master:
            log.warning("not copying topics, groups and offsets from the master %s: its CommitLog "
                        "ends at %d, before this slave's %d (another store than the one this "
                        "slave followed?)", master, theirs, ours)
            self.refused = master
        return False

    def _ask(self, master: str, code: int) -> dict:
        """The master's JSON answer to ``code`` ({} unless SUCCESS with an object)."""
        if self.client is None or self.addr != master:
            self.close()
            self.client, self.addr = RemotingClient(master, timeout=TIMEOUT_S), master
        r = self.client.invoke(RemotingCommand(code), timeout=TIMEOUT_S)
        if r.code != R.SUCCESS:
            return {}               # e.g. SYSTEM_ERROR "No topic in this broker"
        try:
            body = orjson.loads(r.body)
        except orjson.JSONDecodeError:     # a Java master: fastjson's unquoted keys
            body = parse_json_lenient(bytes(r.body).decode("utf-8", "replace"))
        return body if isinstance(body, dict) else {}

    def _offsets(self, master: str) -> None:
        table = self._ask(master, RC.GET_ALL_CONSUMER_OFFSET).get("offsetTable")
        if not isinstance(table, dict):
            return
        reg = self.registry
        for tg, queues in table.items():
            topic, _, group = str(tg).partition("@")
            if not group or not isinstance(queues, dict):
                continue
            for qid, off in queues.items():
                try:
                    qid, off = int(qid), int(off)
                except (TypeError, ValueError):
                    continue
                if reg.get_offset(topic, group, qid) != off:
                    reg.commit_offset(topic, group, qid, off)

    def _delay_offsets(self, master: str) -> None:
        table = self._ask(master, RC.GET_ALL_DELAY_OFFSET).get("offsetTable")
        if not isinstance(table, dict) or self.cursors is None:
            return
        levels = len(self.config.delay_levels_ms)
        for level, off in table.items():
            try:
                level, off = int(level), int(off)
            except (TypeError, ValueError):
                continue
            if 1 <= level <= levels:
                self.cursors[DELAY_CURSOR + level] = off

    def _sync(self, master: str, code: int, table, key: str) -> None:
        body = self._ask(master, code)
        remote = body.get(key)
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
