"""What the driver does with each node event: keep reports, cancel a stalled feed, release held
Acks that can only stall, warn of long waits, log the rest.

The rendezvous server keeps what it needs of ``EpochRead`` and ``FeedTerminated`` as they arrive
(epoch marks, ``NodeState.feed_ended``); the gang's watcher hands every event here.
"""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import dataclass, field
from typing import Protocol

from ...errors import FeedTimeout
from ...wire import events as ev
from .rendezvous import NodeState
from .reports import ReportLog

__all__ = ["FeedListener", "NodeEvents", "ServerRestart", "how_it_died"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerRestart:
    """One restart in place of a worker's TF server (``cluster.server_restarts``), from its ``ServerRestarted``.

    ``node`` (``"worker:1"``) died as ``exit_code`` says (``-9``: SIGKILL) and was restarted at
    the same address, its ``restart``-th of at most ``limit``; it accepted connections again
    ``down_s`` seconds after its death (``accepting`` False: it never did). ``time`` is when the
    driver heard of it (``time.time()``).
    """

    node: str
    restart: int
    limit: int
    exit_code: int
    down_s: float
    accepting: bool = True
    time: float = field(default_factory=time.time)

    @classmethod
    def of(cls, node: str, event: ev.ServerRestarted) -> ServerRestart:
        """The record of ``event``, which ``node`` sent."""
        return cls(node, event.restart, event.limit, event.exit_code, event.down_s, event.accepting)


def how_it_died(exit_code: int) -> str:
    """``"killed by signal 9 (SIGKILL)"`` or ``"exited with code 1"``."""
    if exit_code >= 0:
        return f"exited with code {exit_code}"
    try:
        return f"killed by signal {-exit_code} ({signal.Signals(-exit_code).name})"
    except ValueError:
        return f"killed by signal {-exit_code}"


class FeedListener(Protocol):
    """What the feed events go to: the cluster's feed jobs (:class:`~tfonspark.driver.feeds.feeding.Feeds`)."""

    @property
    def running(self) -> str:
        """The feed id of the running ``train()``, ``""`` if none."""
        ...

    def stalled(self, feed_id: str, train: bool, error: FeedTimeout) -> bool:
        """A node reported a stalled partition of ``feed_id``; whether the running feed was cancelled."""
        ...

    def held(self, feed_id: str) -> None:
        """A node holds a partition's Ack of ``feed_id`` (pacing)."""
        ...

    def starved(self) -> None:
        """A data node waits for training data with nothing queued or arriving."""
        ...


class NodeEvents:
    """Dispatches node events by type: ``Reported`` to ``reports``, the feed's events to ``feeds``."""

    def __init__(self, reports: ReportLog, feeds: FeedListener) -> None:
        self.reports = reports
        self.feeds = feeds

    def __call__(self, node: NodeState, event: ev.NodeEvent) -> None:
        match event:
            case ev.Reported(metrics=metrics):
                self.reports.add(node.role.job_name, node.role.task_index, metrics)
            case ev.FeedStalled():
                self._stalled(node, event)
            case ev.FeedHeld(feed_id=feed_id):
                self.feeds.held(feed_id)
            case ev.FeedStarved():
                self.feeds.starved()
            case ev.FeedWaiting():
                self._waiting(node, event)
            case ev.ServerRestarted():
                self._restarted(node, event)
            case ev.FeedTerminated() | ev.EpochRead():
                pass  # the server keeps these as it records them: node.feed_ended, epochs_read()
            case _:
                log.info("node %s reported %s", node.role.name, event)

    @staticmethod
    def _restarted(node: NodeState, event: ev.ServerRestarted) -> None:
        back = (
            f"accepting again {event.down_s:.1f}s after"
            if event.accepting
            else f"not accepting {event.down_s:.0f}s after"
        )
        log.warning(
            "node %s: its TF server was %s and restarted in place (%d of at most %d), %s; TF's coordinator "
            "re-runs the closures it lost",
            node.role.name,
            how_it_died(event.exit_code),
            event.restart,
            event.limit,
            back,
        )

    def _waiting(self, node: NodeState, event: ev.FeedWaiting) -> None:
        """A wait of the feed on ``node`` has lasted: say which node, what for, and what bounds it.

        A node waiting for data while no ``train()`` runs is the user's program between feeds:
        that is logged at INFO only.
        """
        where = f" (partition {event.partition} of feed {event.feed_id})" if event.partition >= 0 else ""
        level = logging.WARNING if self.feeds.running or event.partition >= 0 else logging.INFO
        log.log(
            level,
            "node %s has waited %.0fs for %s%s; what bounds the wait: %s",
            node.role.name,
            event.waited,
            event.what,
            where,
            event.setting or "nothing",
        )

    def _stalled(self, node: NodeState, event: ev.FeedStalled) -> None:
        error = FeedTimeout(
            f"partition {event.partition}: its feeder sent nothing to node {node.role.name} "
            f"for feed_timeout={event.timeout:.0f}s after {event.received} "
            "rows (a stalled Spark task or executor); the feed was cancelled. Raise feed_timeout if "
            "computing a partition's rows can take longer."
        )
        log.warning("%s", error)
        self.feeds.stalled(event.feed_id, event.train, error)
