"""The tools' way to open a store: ``core.view.StoreView``, with a running broker's positions.

The view itself (what is readable, offline or beside a live broker) is
``core/view.py``'s, and reading records below it ``core/reader.py``'s. What
is left here is what core does not do: attaching to a running broker's
shared-memory control block (``ipc.control``) to read the positions it has
published, and the inspector's words for a short segment.

``StoreView.open(root)`` uses the broker's published positions when one owns
the store, else the files alone (``live=False``: always the files alone).
"""
from __future__ import annotations

import os

from shmq.core import view as _view
from shmq.core.files import REAL_FILES, FileLayer
from shmq.core.records import warm_up  # noqa: F401  (re-exported for readers)
from shmq.core.view import NotAStore, QueueExtent  # noqa: F401  (the tools' names for them)


class StoreView(_view.StoreView):
    """``core.view.StoreView``, opened with the positions a running broker published."""

    @classmethod
    def open(cls, root: str, files: FileLayer = REAL_FILES, live: bool | None = None) -> StoreView:
        """Snapshot the store at ``root``. ``live=None`` uses the broker's
        published positions when one owns the store, else the files alone;
        ``live=False`` always reads the files alone."""
        published = _published(root) if live is not False else None
        return super().open(root, files, published)


def short_segment_note(size: int, segment_bytes, last: bool) -> str:
    """What the inspector says of a segment file shorter than the store's size."""
    what = "its records past the cut are truncated" if last else \
        "the records past its last whole one are lost and reported"
    return (f"short: {size} bytes of {segment_bytes} (cut by a crash, a copy or a full disk); "
            f"the next start repairs it: extends it with zeros, {what}")


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
