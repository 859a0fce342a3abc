"""A DataFeed that ``tf.data`` and the node's own code may both read, and that can be drained.

``fit(..., steps_per_epoch=...)`` stops before the feed ends, and a ``tf.data`` prefetch may
still be reading the feed (on one of TensorFlow's threads) when ``fit`` returns. The node then
reads and drops the rest of the feed (:meth:`DrainableFeed.drain`), so that the driver's
``cluster.train`` completes; the lock keeps the two readers from interleaving inside a batch.
"""

from __future__ import annotations

import threading
from typing import Any

from ..tfprocess.datafeed import DataFeed

__all__ = ["DrainableFeed"]

_DRAIN_BATCH = 16_384


class DrainableFeed(DataFeed):
    """``ctx.get_data_feed()`` with reads serialised by a lock, plus :meth:`drain`."""

    def __init__(self, mgr: Any, qname: str = "input") -> None:
        super().__init__(mgr, train_mode=True, qname_in=qname)
        self._read_lock = threading.Lock()

    def next_columns(self, batch_size: int) -> Any:
        """``DataFeed.next_columns`` under the lock (``as_dataset`` reads through it too)."""
        with self._read_lock:
            return super().next_columns(batch_size)

    def drain(self) -> int:
        """Read and drop the rest of the feed, until the driver ends it; return the row count.

        Returns once the driver calls ``cluster.shutdown()`` (which ends the feed), so call it
        after the last training step and before work that should not wait for the driver.
        """
        dropped = 0
        while (batch := self.next_columns(_DRAIN_BATCH)) is not None:
            dropped += batch.count
        return dropped
