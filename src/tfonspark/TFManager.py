"""TFoS-compatible face: ``TFManager.start(authkey, queues, mode)``, to test ``map_fun`` without Spark.

TFoS fed rows through a multiprocessing manager; tfonspark feeds columnar batches through each
node's feed server, so there is no manager to start. What TFoS users relied on it for is the
seam: build a ``DataFeed`` on ``TFManager.start(...)``, put rows into its ``"input"`` queue
(``None`` ends the feed) and read ``batch_results`` from ``"output"``, all in one process. That
is :class:`tfonspark.tfprocess.localfeed.LocalFeeds`.
"""

from __future__ import annotations

from collections.abc import Iterable

from .errors import ConfigError
from .tfprocess.localfeed import LocalFeeds

__all__ = ["start"]


def start(authkey: bytes, queues: Iterable[str], mode: str = "local") -> LocalFeeds:
    """In-process queues for a ``DataFeed`` (``authkey`` is unused: nothing leaves the process).

    ``mode`` is TFoS's ``"local"`` or ``"remote"``; both give in-process queues here, since
    tfonspark's nodes never share a manager between processes.
    """
    if mode not in ("local", "remote"):
        raise ConfigError(f"mode must be 'local' or 'remote'. Received: {mode!r}")
    return LocalFeeds(list(queues))
