"""ipc/table.py's SharedTable: two views of one table stand for two
processes (the same shared bytes, each with its own key → row cache)."""
from __future__ import annotations

import mmap
import subprocess
import sys

from brokerproc import until
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
    assert a.put(b"k", 42, 1_700_000_000_000) == row
    assert [int(x) for x in b.v[b.find(b"k")][:2]] == [42, 1_700_000_000_000]
    assert int(b.v[row][2]) == 0 and int(b.v[row][3]) == 0        # the rest untouched
    row = a.put(b"p", 7, payload=b"client")                       # created with its payload
    assert b.payload(b.find(b"p")) == b"client" and int(b.v[row][0]) == 7


def test_put_many_writes_each_key_as_put_does_and_creates_the_absent_ones(tmp_path):
    a, b = _two_views(tmp_path)
    a.put(b"k1", 1, 10)
    b.put(b"k2", 2, 20)
    a.put_many([(b"k1", (11, 110)), (b"k3", (3, 30)), (b"k2", (12, 120)), (b"k3", (13, 130))])
    assert {k: [int(x) for x in b.v[b.find(k)][:2]] for k in (b"k1", b"k2", b"k3")} == {
        b"k1": [11, 110], b"k2": [12, 120], b"k3": [13, 130]}     # in order: the last wins
    assert a.lock._depth == 0                                      # the lock given back


# A writer process: ``put``s 7 into b"victim" until told to stop (the word
# after the table), counting the puts that found a row (the table's one row
# is often b"other"'s: then the put finds the table full).
_WRITER = """
import mmap, sys
from shmq.ipc.table import FileLock, SharedTable, TableFull, table_bytes
path, lock = sys.argv[1:]
with open(path, "r+b") as f:
    buf = mmap.mmap(f.fileno(), 0)
t = SharedTable(buf, 0, FileLock(lock))
flags = memoryview(buf)[table_bytes(1):].cast("q")
flags[0] = 1                                    # ready
puts = 0
for _ in range(2_000_000):
    if flags[1]:
        break
    try:
        t.put(b"victim", 7)
        puts += 1
    except TableFull:
        pass
print(puts)
"""


def test_a_value_written_while_another_process_deletes_and_reuses_the_row_never_lands_in_another_key(tmp_path):
    """One process writes b"victim"'s value while this one deletes its row
    and gives it to b"other" (values 0, a table of one row: the same row
    every time), again and again: b"other"'s value is never the writer's."""
    path, lock = tmp_path / "table", str(tmp_path / "lock")
    path.write_bytes(bytes(table_bytes(1) + 16))
    with open(path, "r+b") as f:
        buf = mmap.mmap(f.fileno(), 0)
    t = SharedTable(buf, 0, FileLock(lock), rows=1)
    flags = memoryview(buf)[table_bytes(1):].cast("q")
    t.upsert(b"victim")
    w = subprocess.Popen([sys.executable, "-c", _WRITER, str(path), lock],
                         stdout=subprocess.PIPE, text=True)
    try:
        until(lambda: flags[0], "the writer started")
        stray = 0
        for _ in range(3000):
            with t.lock.held():
                t.delete(t.find(b"victim"))
                row = t.upsert(b"other")
            # the writer may run here, its find and write on either side of the lock
            with t.lock.held():
                stray += int(t.v[row, 0]) != 0
                t.delete(row)
                t.upsert(b"victim")
        flags[1] = 1
        puts = int(w.communicate(timeout=30)[0])
    finally:
        w.kill()
    assert puts > 0, "the writer never wrote"
    assert stray == 0, f"{stray} of b'other''s rows got b'victim''s value"
