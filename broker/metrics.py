"""The Prometheus endpoint: ``GET /metrics`` on ``bindAddress:metricsPort``
(``metricsPort`` 0, the default: off), served by the services process.

Why there: the services process already runs the broker's background
duties off the request path, and it takes the statistics' snapshots
(``stats.Sampler``), so a scrape never costs a worker a turn of its
reactor. The server is ``prometheus_client``'s WSGI app (it renders the
text exposition format) in a thread, on the socket the boss bound at start
(a port in use is the start's one clear error, as for every port, and a
restarted services process serves the same socket); on each scrape
``Collector.collect`` reads the shared memory every process writes — the counters (``ipc/counters.py``),
the registry's consumer offsets, the store's queues — so the figures are
the whole broker's, whichever worker served the traffic. Its own view of
the store, registry and tables, not the services thread's objects: their
caches are not shared between threads.

Names: the RocketMQ exporter's (apache/rocketmq-exporter) where one exists,
with its labels (cluster, broker, topic, group):

    rocketmq_broker_tps / rocketmq_broker_qps       messages put / got per s (last minute)
    rocketmq_producer_tps, rocketmq_producer_message_size   per topic: messages, bytes per s
    rocketmq_producer_offset                        per topic: its queues' max offsets summed
    rocketmq_consumer_tps, rocketmq_consumer_message_size   per topic and group
    rocketmq_consumer_offset                        per topic and group: committed offsets summed
    rocketmq_group_diff                             per topic and group: messages not consumed
    rocketmq_group_get_latency_by_storetime         ms since the oldest unconsumed message was stored
    rocketmq_brokeruntime_*                         runtime info: disk ratios, today's totals,
                                                    CommitLog offsets

and shmq's own:

    shmq_flush_latency_seconds      histogram of CommitLog flush rounds (fdatasyncs: the
                                    flusher's, and the workers' group commits)
    shmq_fdatasyncs_total           flush rounds; shmq_flushed_messages_total, messages they made
                                    durable; shmq_messages_per_fdatasync the ratio since start
                                    (rate(flushed)/rate(fdatasyncs) for a window)
    shmq_connections                client connections the workers hold
    shmq_parked_pulls, shmq_parked_sends   long-polling pulls, SYNC_FLUSH sends waiting
    shmq_restarts_total             child processes (workers, services, flusher,
                                    NameServer) the boss restarted after they died
"""
from __future__ import annotations

import logging
import socket
import threading
import time
from wsgiref.simple_server import WSGIRequestHandler

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from shmq.core.store import MessageStore
from shmq.ipc.control import ControlBlock
from shmq.ipc.counters import FLUSH_BUCKETS_S, G, GET, NUMS, PUT, SIZE

from .config import BrokerConfig
from .registry import Registry
from .shared_store import _store, extra_region
from .stats import SPANS_S, Sampler, Stats, counters_of
from .topics import Tables

log = logging.getLogger("shmq.services")
# gauges of what a live process holds now (the others are totals that stay)
LIVE_GAUGES = ("connections", "parked_pulls", "parked_sends")


def start(config: BrokerConfig, services, store: MessageStore, cb: ControlBlock,
          sock: socket.socket | None = None):
    """The services process's share of the statistics: the snapshots (a
    feature of its loop) and, with metricsPort, the endpoint on ``sock``,
    the listening socket the boss bound."""
    counters = counters_of(cb, store)
    if counters is None:
        return None
    services.features.append(Sampler(counters))
    if not config.metricsPort or sock is None:
        return None
    reg = CollectorRegistry(auto_describe=False)
    reg.register(Collector(config, cb))
    server = serve(sock, make_wsgi_app(reg))
    log.info("metrics: http://%s:%d/metrics", config.bindAddress, config.metricsPort)
    return server


class _Quiet(WSGIRequestHandler):
    def log_message(self, format, *args) -> None:     # a scrape is no log line
        pass


def serve(sock: socket.socket, app) -> ThreadingWSGIServer:
    """``app`` served over HTTP by a daemon thread on ``sock``, a socket
    already listening (what prometheus_client's start_http_server does on
    a socket it binds itself)."""
    server = ThreadingWSGIServer(sock.getsockname()[:2], _Quiet, bind_and_activate=False)
    server.socket.close()
    server.socket = sock
    server.server_address = sock.getsockname()[:2]
    server.server_name, server.server_port = server.server_address
    server.setup_environ()
    server.set_app(app)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server


class Collector:
    def __init__(self, config: BrokerConfig, cb: ControlBlock):
        self.config = config
        self.cb = cb
        self.store = _store(config.store, cb)
        self.counters = counters_of(cb, self.store)
        self.stats = Stats(self.counters)
        self.registry = Registry(extra_region(cb, self.store), config.store.storePathRootDir)
        self.tables = Tables(config, self.store.state)

    def collect(self):
        c, f, store = self.counters, self.stats, self.store
        cluster, broker = self.config.brokerClusterName, self.config.brokerName
        minute = SPANS_S["minute"]
        base = [cluster, broker]

        def gauge(name, help_, labels=()):
            return GaugeMetricFamily(name, help_, labels=["cluster", "broker", *labels])

        puts, gets = c.items(PUT), c.items(GET)
        bt = gauge("rocketmq_broker_tps", "BrokerPutNums")
        bt.add_metric(base, f.window([r for _, r in puts], NUMS, minute, False)["tps"])
        bq = gauge("rocketmq_broker_qps", "BrokerGetNums")
        bq.add_metric(base, f.window([r for _, r in gets], NUMS, minute, False)["tps"])
        yield bt
        yield bq

        ptps = gauge("rocketmq_producer_tps", "TopicPutNums", ["topic"])
        psize = gauge("rocketmq_producer_message_size", "TopicPutMessageSize", ["topic"])
        for topic, row in puts:
            ptps.add_metric(base + [topic], f.window([row], NUMS, minute)["tps"])
            psize.add_metric(base + [topic], f.window([row], SIZE, minute)["tps"])
        yield ptps
        yield psize
        poff = gauge("rocketmq_producer_offset", "TopicOffset", ["topic"])
        for topic, tc in sorted(self.tables.topics.current().items()):
            poff.add_metric(base + [topic], sum(max(0, store.max_offset(topic, q))
                                                for q in range(tc.write_queue_nums)))
        yield poff

        ctps = gauge("rocketmq_consumer_tps", "GroupGetNums", ["topic", "group"])
        csize = gauge("rocketmq_consumer_message_size", "GroupGetMessageSize", ["topic", "group"])
        for key, row in gets:
            topic, _, group = key.partition("@")
            ctps.add_metric(base + [topic, group], f.window([row], NUMS, minute)["tps"])
            csize.add_metric(base + [topic, group], f.window([row], SIZE, minute)["tps"])
        yield ctps
        yield csize
        coff = gauge("rocketmq_consumer_offset", "GroupOffset", ["topic", "group"])
        diff = gauge("rocketmq_group_diff", "GroupDiff", ["topic", "group"])
        late = gauge("rocketmq_group_get_latency_by_storetime", "GroupGetLatencyByStoreTime",
                     ["topic", "group"])
        now_ms = int(time.time() * 1000)
        for tg, queues in sorted(self.registry.offset_table().items()):
            topic, _, group = tg.partition("@")
            behind, oldest = 0, now_ms
            for qid, off in queues.items():
                q = int(qid)
                hi = store.max_offset(topic, q)
                if 0 <= off < hi:
                    behind += hi - off
                    oldest = min(oldest, store.store_time(topic, q, off) or now_ms)
            labels = base + [topic, group]
            coff.add_metric(labels, sum(max(0, o) for o in queues.values()))
            diff.add_metric(labels, behind)
            late.add_metric(labels, now_ms - oldest)
        yield coff
        yield diff
        yield late
        yield from self._runtime(base)
        yield from self._own(base)

    def _runtime(self, base):
        st = self.store.state
        ratio = self.store.files.disk_usage_ratio
        put, got = self.stats.broker_totals()
        for name, help_, value in (
                ("commitlog_disk_ratio", "brokerRuntimeCommitLogDiskRatio",
                 ratio(self.store.cl.dir)),
                ("consumequeue_disk_ratio", "brokerRuntimeConsumeQueueDiskRatio",
                 ratio(self.store.cqs.dir)),
                ("msg_put_total_today_now", "brokerRuntimeMsgPutTotalTodayNow", put),
                ("msg_gettotal_today_now", "brokerRuntimeMsgGetTotalTodayNow", got),
                ("commitlog_maxoffset", "brokerRuntimeCommitLogMaxOffset", st.write_pos),
                ("commitlog_minoffset", "brokerRuntimeCommitLogMinOffset",
                 st.get("cl_min_offset"))):
            m = GaugeMetricFamily(f"rocketmq_brokeruntime_{name}", help_,
                                  labels=["cluster", "broker"])
            m.add_metric(base, value)
            yield m

    def _own(self, base):
        c = self.counters
        live = self.cb.procs["pid"] != 0          # the owner clears a dead process's slot
        labels = ["cluster", "broker"]
        for name, help_ in (("connections", "client connections the workers hold"),
                            ("parked_pulls", "pulls parked (long polling) in the workers"),
                            ("parked_sends", "SYNC_FLUSH sends waiting for the disk")):
            m = GaugeMetricFamily(f"shmq_{name}", help_, labels=labels)
            m.add_metric(base, int(c.gauges[live, G[name]].sum()))
            yield m
        syncs, msgs = c.gauge("fdatasyncs"), c.gauge("flushed_msgs")
        for name, help_, value in (
                ("fdatasyncs", "CommitLog flush rounds (fdatasync of each segment touched)", syncs),
                ("flushed_messages", "messages the flush rounds made durable", msgs),
                ("restarts", "child processes the boss restarted after they died",
                 c.gauge("restarts"))):
            m = CounterMetricFamily(f"shmq_{name}", help_, labels=labels)
            m.add_metric(base, value)
            yield m
        m = GaugeMetricFamily("shmq_messages_per_fdatasync",
                              "messages made durable per flush round, since the broker started",
                              labels=labels)
        m.add_metric(base, msgs / syncs if syncs else 0.0)
        yield m
        buckets, n = [], 0
        for i, le in enumerate(FLUSH_BUCKETS_S):
            n += c.gauge(f"flush_le_{i}")
            buckets.append((repr(le), n))
        buckets.append(("+Inf", n + c.gauge(f"flush_le_{len(FLUSH_BUCKETS_S)}")))
        h = HistogramMetricFamily("shmq_flush_latency_seconds",
                                  "time of each CommitLog flush round", labels=labels)
        h.add_metric(base, buckets, c.gauge("flush_ns") / 1e9)
        yield h
