"""Every numba-jitted function of the store, in one private package.

Kernels take numpy arrays and numbers only, return numbers or fill output
arrays, and never raise for bad data: they return a status code that the
Python wrappers (``records``, ``consumequeue``, ``index``) turn into errors.
Each one has a slow, obviously correct twin in ``tests/naive.py``. The
wrappers' warm-ups (``core/jit.py``) touch every kernel once at process
start, so no request ever pays for a JIT.

One module per kind of data the kernels work on, each building only on the
ones above it::

    binary        big-endian integers, CRC-32, Java String.hashCode of UTF-8
    properties    a message's properties string: values, tags code, integers
    batch         into the CommitLog: split a batch body, encode, stamp
    frames        single sends and pulls read from a connection's bytes; the sends'
                  records, answers
    records       stored records: scan and validate a segment, UNIQ_KEY hashes
    consumequeue  ConsumeQueue units: put, scan, valid end, min offset
    index         IndexFile: put, select, check, index a scan
    columns       records as Arrow-shaped columns for readers; a pull's records as rows

The layouts they read and write (record, ConsumeQueue unit, IndexFile) and
the scan vocabulary (``SCAN_*``, ``S_*``) are drawn in ``layout``. This
package re-exports every public kernel and constant, so callers say
``from shmq.core import _kernels as K`` and never name a module.

The on-disk cache. ``cache=True``: a process loads machine code from
``__pycache__`` (or ``NUMBA_CACHE_DIR``) instead of compiling. Numba keys a
kernel's cache entry by the modification time and size of the file that
*defines* it, and nothing else; but a kernel's machine code also holds the
helpers it calls from other modules (``ld_i32``, ``crc32``, ``_scan_headers``
are inlined or linked in). As one file that was harmless; split, an edit of
``binary.py`` would leave ``records.py``'s cached kernels running the old
helper. So ``_stamp_together`` gives every kernel of the package one stamp,
made of all its files' stamps: any edit invalidates every entry, as before
the split. (That stamp is numba's private ``IndexDataCacheFile._source_stamp``;
if a numba release renames it the stamp is left alone, which costs only the
hazard above, in a development tree, never wrong code in a fresh one.)
"""
from __future__ import annotations

import os

from ..layout import (CQ_PAD_SIZE, IX_BEGIN_PHY, IX_BEGIN_TS, IX_END_PHY, IX_END_TS,
                      IX_ENTRY_BYTES, IX_HEADER_BYTES, IX_INDEX_COUNT, IX_SLOT_BYTES,
                      IX_SLOT_COUNT, MESSAGE_MAGIC_V2_I32, N_SCAN, S_BODY_LEN, S_BODY_POS,
                      S_PHY, S_PROPS_LEN, S_PROPS_POS, S_QUEUE_ID, S_QUEUE_OFFSET, S_SIZE,
                      S_STORE_TS, S_SYSFLAG, S_TAGS_CODE, S_TOPIC_HASH, S_TOPIC_LEN,
                      S_TOPIC_POS, SCAN_BLANK, SCAN_CORRUPT, SCAN_END, SCAN_FOREIGN, SCAN_FULL)
from . import batch, binary, columns, consumequeue, frames, index, properties, records
from .batch import (BATCH_OK, BATCH_PROPS_TOO_LONG, BATCH_TOO_MANY, BATCH_TRUNCATED,
                    M_BODY_LEN, M_BODY_OFF, M_BORN_HOST, M_BORN_TS, M_FLAG, M_PREPARED,
                    M_PROPS_LEN, M_PROPS_OFF, M_QUEUE_ID, M_RECONSUME, M_SYSFLAG, M_TAGS_CODE,
                    N_META, encode_batch, encode_uniform, split_batch, stamp_batch)
from .binary import (CRC_TABLES, _java_hash_more, crc32, java_hash_utf8, ld_i16, ld_i32,
                     ld_i64, ld_u32, make_crc_tables, st_i16, st_i32, st_i64)
from .columns import (N_PULL, P_BODY_LEN, P_BODY_POS, P_QUEUE_OFFSET, P_SIZE, P_START,
                      P_STATUS, P_SYSFLAG, P_TOPIC_AT, PULL_CRC, PULL_FIELDS, PULL_OK,
                      arrow_columns, gather_spans, property_spans, pull_rows, records_at)
from .consumequeue import (CQ_BAD, CQ_DONE, CQ_FULL, cq_group_rows, cq_put, cq_put_many,
                           cq_put_units, cq_scan, cq_valid_units, min_phy_from, queues_due)
from .frames import encode_sends, place_answers, read_pulls, read_sends, send_ok_frames
from .index import (IX_BAD_ENTRY, IX_BAD_SLOT, IX_DONE, IX_FULL, IX_OK, _index_key_hash,
                    index_check, index_put, index_records, index_select)
from .properties import INT_DIGITS_MAX, find_property, int_properties, tags_codes
from .records import last_nonzero, scan_records, uniq_hashes

MODULES = (binary, properties, batch, frames, records, consumequeue, index, columns)


def _stamp_together(modules=MODULES) -> None:
    """One cache stamp for every kernel of ``modules``: see the header."""
    stamps = []
    for m in modules:
        st = os.stat(m.__file__)
        stamps.append((os.path.basename(m.__file__), st.st_mtime, st.st_size))
    stamp = tuple(stamps)
    for m in modules:
        for v in vars(m).values():
            cache_file = getattr(getattr(v, "_cache", None), "_cache_file", None)
            if cache_file is not None and hasattr(cache_file, "_source_stamp"):
                # With the JIT off (the coverage-gated run) there is no cache;
                # tests/test_jit.py checks this line with the JIT on.
                cache_file._source_stamp = stamp   # pragma: no cover


_stamp_together()
