"""Micro-benchmark of the duplicate-send check (``core/dedup.py``): what
``sendDedupWindowSize`` adds to one single-message send, in one process.

    python perf/dedup_micro.py [N]

Two stores (a window of 65,536 entries, and none), the same 100 B
single-message sends with a fresh UNIQ_KEY each (every send a miss: the
common case), alternated in blocks so that both see the same machine; the
window is filled first, so chains and the ring are warm and full. Rows:

- key_hash: finding UNIQ_KEY in the properties and its CRC32 (the handler);
- append: ``MessageStore.append`` of an encoded record with and without
  the hash (lookup + insert under the append lock), difference per send;
- lookup + insert alone: the window's work in the claim, timed by itself;
- hit: the cost of answering a duplicate (a lookup that reads the record back);
- handler: a whole SEND_MESSAGE_V2 through ``Handlers.handle`` (header
  parse, checks, encode, append, the reply template), brokers with a
  window of 65,536 and with none (``sendDedupWindowSize=0``), alternated.

Prints this process's CPU µs per send (process_time: time another process
takes the core is not counted), the fastest block and the median block.
"""
from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time

from shmq.broker.shared_store import StoreOwner
from shmq.core.config import StoreConfig
from shmq.core.dedup import key_hash
from shmq.core.records import encode_one, warm_up

WINDOW = 65536


def _props(i: int) -> bytes:
    return (f"TAGS\x01TagA\x02KEYS\x01order-{i}\x02UNIQ_KEY\x017F00000100002A9F{i:016X}"
            f"\x02WAIT\x01true\x02CLUSTER\x01DefaultCluster").encode()


def _enc(pb: bytes):
    return encode_one(b"BenchTopic", b"x" * 100, pb, queue_id=0, flag=0, sysflag=0,
                      born_timestamp=0, born_host=(b"\x7f\x00\x00\x01\x00\x00\x00\x00", False),
                      store_host=(b"\x7f\x00\x00\x01\x00\x00\x2a\x9f", False), store_timestamp=0,
                      reconsume_times=0, max_message_bytes=1 << 20, tags_code=None)


def main(n: int = 20000, blocks: int = 10) -> None:
    warm_up()
    tmp = tempfile.mkdtemp(prefix="dedup-bench-")
    cfg = dict(mappedFileSizeCommitLog=256 << 20, maxQueueSlots=1024)
    on = StoreOwner(StoreConfig(storePathRootDir=os.path.join(tmp, "on"), **cfg),
                    dedup_window=WINDOW)
    off = StoreOwner(StoreConfig(storePathRootDir=os.path.join(tmp, "off"), **cfg))
    on.open(), off.open()
    try:
        props = [_props(i) for i in range(WINDOW + n * blocks)]
        hashes = [key_hash(p) for p in props]
        s_on, s_off = on.store, off.store
        for i in range(WINDOW):                          # fill the window
            s_on.append(_enc(props[i]), hashes[i])
        t_hash, t_on, t_off = [], [], []
        i0 = WINDOW
        for _ in range(blocks):
            chunk = props[i0:i0 + n]
            t = time.process_time()
            for p in chunk:
                key_hash(p)
            t_hash.append((time.process_time() - t) / n)
            encs = [_enc(p) for p in chunk]
            t = time.process_time()
            for e, h in zip(encs, hashes[i0:i0 + n]):
                s_on.append(e, h)
            t_on.append((time.process_time() - t) / n)
            encs = [_enc(p) for p in chunk]
            t = time.process_time()
            for e in encs:
                s_off.append(e)
            t_off.append((time.process_time() - t) / n)
            i0 += n
        # duplicates: the last n sends again
        dup = props[i0 - n:i0]
        encs = [_enc(p) for p in dup]
        t = time.process_time()
        for e, h in zip(encs, hashes[i0 - n:i0]):
            r = s_on.append(e, h)
        t_dup = (time.process_time() - t) / n
        assert type(r).__name__ == "DuplicateResult"
        # the window's own work, alone: lookup (a miss) + insert, fresh keys
        t_win = []
        enc = _enc(props[0])
        for b in range(blocks):
            hs = [key_hash(_props(10 ** 9 + b * n + i)) for i in range(n)]
            t = time.process_time()
            for h in hs:
                s_on._dedup_find(h, "BenchTopic", enc)
                s_on.dedup_add(h, 0)
            t_win.append((time.process_time() - t) / n)
        us = lambda xs: f"min {min(xs) * 1e6:.2f} µs, median {statistics.median(xs) * 1e6:.2f} µs"
        diff = [a - b for a, b in zip(t_on, t_off)]
        print(f"key_hash (handler)           {us(t_hash)}")
        print(f"append, window {WINDOW}      {us(t_on)}")
        print(f"append, no window            {us(t_off)}")
        print(f"append: window - none        {us(diff)}")
        print(f"lookup + insert alone        {us(t_win)}")
        print(f"duplicate answered (hit)     {t_dup * 1e6:.2f} µs per send")
    finally:
        on.close(), off.close()
        shutil.rmtree(tmp, ignore_errors=True)     # two stores' segments: ~0.5 GB


def handler_rows(n: int = 20000, blocks: int = 10) -> None:
    from shmq.broker.config import BrokerConfig
    from shmq.broker.handlers import Handlers, Peer
    from shmq.broker.registry import Registry, registry_bytes
    from shmq.broker.shared_store import extra_region
    from shmq.broker.topics import Tables
    from shmq.client.requests import create_topic, send_message

    class Owner(StoreOwner):
        def start_flusher(self):      # nothing flushes: the handler's own cost
            self.flusher = None

    tmp = tempfile.mkdtemp(prefix="dedup-handler-bench-")
    rigs = []
    for name, window in (("on", WINDOW), ("off", 0)):
        root = os.path.join(tmp, name)
        cfg = BrokerConfig(store=StoreConfig(storePathRootDir=root, maxQueueSlots=1024,
                                             mappedFileSizeCommitLog=512 << 20),
                           sendDedupWindowSize=window)
        o = Owner(cfg.store, extra_bytes=registry_bytes(), dedup_window=window)
        o.open()
        reg = Registry(extra_region(o.cb, o.store), root, create=True)
        tables = Tables(cfg, o.store.state)
        tables.ensure_system_topics()
        h = Handlers(cfg, o.store, o.cb, tables, reg)
        h.handle(Peer(1, "10.0.0.1:1234"), create_topic("BenchTopic", 1))
        rigs.append((o, h))
    peer = Peer(2, "10.0.0.1:1234")
    body = b"x" * 100

    def cmds(start):
        return [send_message("BenchTopic", body, queue_id=0, props={
            "UNIQ_KEY": f"7F00000100002A9F{i:016X}", "TAGS": "TagA", "KEYS": f"order-{i}"})
            for i in range(start, start + n)]

    try:
        (o_on, h_on), (o_off, h_off) = rigs
        for i in range(0, WINDOW, n):               # fill the window
            for c in cmds(i):
                h_on.handle(peer, c)
        t_on, t_off = [], []
        i0 = WINDOW
        for _ in range(blocks):
            for h, ts in ((h_on, t_on), (h_off, t_off)):
                cs = cmds(i0)
                t = time.process_time()
                for c in cs:
                    h.handle(peer, c)
                ts.append((time.process_time() - t) / n)
            i0 += n
        us = lambda xs: f"min {min(xs) * 1e6:.2f} µs, median {statistics.median(xs) * 1e6:.2f} µs"
        print(f"handler send, window {WINDOW}  {us(t_on)}")
        print(f"handler send, no window      {us(t_off)}")
        print(f"handler: window - none       {us([a - b for a, b in zip(t_on, t_off)])}")
    finally:
        for o, _ in rigs:
            o.close()
        shutil.rmtree(tmp, ignore_errors=True)     # two stores' segments: ~1 GB


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:2]))
    handler_rows(*(int(a) for a in sys.argv[1:2]))
