"""A store as a running broker publishes it: ``core.view.StoreView`` opened
with the positions the owner published in its control block.

The view itself (what is readable, offline or beside a live broker) is
``core/view.py``'s, and reading records below it ``core/reader.py``'s. What
is here is the one thing core cannot do, because core knows files and bytes,
never processes: attach to the broker's shared-memory control block
(``ipc.control``) and read the CommitLog and queue positions it has
published, so a reader beside a live broker never reads past what the
broker has made visible. The inspector, the verifier and the Spark source
open stores this way.

``StoreView.open(root)`` uses the broker's published positions when one owns
the store, else the files alone (``live=False``: always the files alone).
"""
from __future__ import annotations

import os

from shmq.core import view as _view
from shmq.core.files import REAL_FILES, FileLayer
from shmq.core.view import NotAStore, QueueExtent  # noqa: F401  (the readers' names for them)


class StoreView(_view.StoreView):
    """``core.view.StoreView``, opened with the positions a running broker published."""

    @classmethod
    def open(cls, root: str, files: FileLayer = REAL_FILES, live: bool | None = None) -> StoreView:
        """Snapshot the store at ``root``. ``live=None`` uses the broker's
        published positions when one owns the store, else the files alone;
        ``live=False`` always reads the files alone."""
        published = _published(root) if live is not False else None
        return super().open(root, files, published)


def _published(root: str) -> _view.Published | None:
    """The running broker's published positions, from its control block, or
    None when no broker owns the store."""
    from shmq.core.state import StoreState
    from shmq.ipc.control import ControlBlock, NotRunning

    try:
        cb = ControlBlock.attach(os.path.abspath(os.path.expanduser(root)))
    except NotRunning:
        return None
    try:
        st = StoreState.over(cb.region(), None)
        return None if st is None else _view.published_positions(st)
    finally:
        cb.close()
