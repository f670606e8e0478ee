"""ipc/table.py's SharedTable: two views of one table stand for two
processes (the same shared bytes, each with its own key → row cache)."""
from __future__ import annotations

import mmap

from shmq.ipc.table import FileLock, SharedTable, table_bytes


def _two_views(tmp_path, rows: int = 8) -> tuple[SharedTable, SharedTable]:
    buf = mmap.mmap(-1, table_bytes(rows))
    lock = str(tmp_path / "lock")
    return (SharedTable(buf, 0, FileLock(lock), rows=rows), SharedTable(buf, 0, FileLock(lock)))


def test_a_row_another_process_deleted_and_gave_to_another_key_is_not_found_from_the_cache(tmp_path):
    a, b = _two_views(tmp_path)
    row = a.upsert(b"topic@group\x000")
    assert a.find(b"topic@group\x000") == row == b.find(b"topic@group\x000")   # both cached
    b.delete(row)
    assert b.upsert(b"other@group\x001") == row          # the freed row, another key
    assert a.find(b"topic@group\x000") == -1             # not the stale cached row
    assert a.find(b"other@group\x001") == row


def test_values_written_by_one_process_are_read_by_another(tmp_path):
    a, b = _two_views(tmp_path)
    row = a.upsert(b"k")
    a.set_values(row, 42, 1_700_000_000_000)
    assert [int(x) for x in b.v[b.find(b"k")][:2]] == [42, 1_700_000_000_000]
    assert int(b.v[row][2]) == 0 and int(b.v[row][3]) == 0        # the rest untouched
