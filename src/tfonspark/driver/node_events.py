"""What the driver does with each node event: keep reports, cancel a stalled feed, log the rest.

The rendezvous server keeps what it needs of ``EpochRead`` and ``FeedTerminated`` as they arrive
(epoch marks, ``NodeState.feed_ended``); the gang's watcher hands every event here.
"""

from __future__ import annotations

import logging

from ..errors import FeedTimeout
from ..wire import events as ev
from .feeding import Feeds
from .rendezvous import NodeState
from .reports import ReportLog

__all__ = ["NodeEvents"]

log = logging.getLogger(__name__)


class NodeEvents:
    """Dispatches node events by type: ``Reported`` to ``reports``, ``FeedStalled`` to ``feeds``."""

    def __init__(self, reports: ReportLog, feeds: Feeds) -> None:
        self.reports = reports
        self.feeds = feeds

    def __call__(self, node: NodeState, event: ev.NodeEvent) -> None:
        match event:
            case ev.Reported(metrics=metrics):
                self.reports.add(node.role.job_name, node.role.task_index, metrics)
            case ev.FeedStalled():
                self._stalled(node, event)
            case ev.FeedTerminated() | ev.EpochRead():
                pass  # the server keeps these as it records them: node.feed_ended, epochs_read()
            case _:
                log.info("node %s reported %s", node.role.name, event)

    def _stalled(self, node: NodeState, event: ev.FeedStalled) -> None:
        error = FeedTimeout(
            f"partition {event.partition}: its feeder sent nothing to node {node.role.name} "
            f"for feed_timeout={event.timeout:.0f}s after {event.received} "
            "rows (a stalled Spark task or executor); the feed was cancelled. Raise feed_timeout if "
            "computing a partition's rows can take longer."
        )
        log.warning("%s", error)
        self.feeds.stalled(event.feed_id, event.train, error)
