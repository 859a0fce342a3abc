"""While a ``train()`` feed job runs: release the Acks the nodes hold once holding can only stall.

A node holds a committed training partition's Ack (its feed task keeps its Spark core) while
its ``map_fun`` still has a partition queued, so that the other executors take the partitions
that remain (``tfprocess/feedserver.py``, pacing). That only helps while partitions remain, and
only if no node is left without data. Two shapes stalled training until the hold's quiet limit
(``feed_timeout / 2``, 300 s by default):

* every partition is handed out, one node read all of its share and waits for more, and the
  other waits for it in a collective with a partition queued: the held Ack keeps the job, so
  the end of the feed, from coming;
* a node starves while every core is held by feed tasks of the others (executors without a node
  spread partitions over all nodes), so the partitions it waits for cannot run.

:class:`FeedWatch` is told of holds and starving nodes by their events (``FeedHeld``,
``FeedStarved``) and looks at the feed job's final stage in Spark's status tracker; it sends
``FeedRelease`` to the data nodes: final once no task of the feed is left to launch, one-off when a
node starves.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from ...wire import messages as m

__all__ = ["FeedWatch", "tasks_to_launch"]

log = logging.getLogger(__name__)

_POLL_SECS = 0.5


def tasks_to_launch(sc: Any, group: str) -> int | None:
    """Tasks of ``group``'s running jobs' final stages that Spark has not launched yet; None if
    no such stage is known (no job running yet, or its final stage not submitted)."""
    tracker = sc.statusTracker()
    left, known = 0, False
    for job_id in tracker.getJobIdsForGroup(group):
        job = tracker.getJobInfo(job_id)
        if job is None or str(job.status) != "RUNNING" or not list(job.stageIds):
            continue
        stage = tracker.getStageInfo(max(job.stageIds))  # the result stage: where the feed tasks run
        if stage is None:
            return None
        known = True
        left += max(0, stage.numTasks - stage.numActiveTasks - stage.numCompletedTasks)
    return left if known else None


class FeedWatch:
    """Watches one running ``train()`` feed job; ``tell`` sends a message to every data node."""

    def __init__(
        self,
        sc: Any,
        group: str,
        qname: str,
        feed_id: str,
        tell: Callable[[m.FeedRelease], None],
        left: Callable[[Any, str], int | None] = tasks_to_launch,
    ) -> None:
        self.sc, self.group, self.qname, self.feed_id = sc, group, qname, feed_id
        self._tell = tell
        self._left = left
        self._held = threading.Event()
        self._starved = threading.Event()
        self._stop = threading.Event()
        self.final_sent = False
        self.releases = 0  # one-off releases sent (a node starved while another held)
        self._thread = threading.Thread(target=self._run, name="tfos-feed-watch", daemon=True)

    def start(self) -> FeedWatch:
        self._thread.start()
        return self

    def held(self, feed_id: str) -> None:
        """A node holds an Ack of ``feed_id`` (``FeedHeld``)."""
        if feed_id == self.feed_id:
            self._held.set()

    def starved(self) -> None:
        """A data node waits for data with nothing queued or arriving (``FeedStarved``)."""
        self._starved.set()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(_POLL_SECS):
            if not self._held.is_set() or self.final_sent:
                self._starved.clear()  # nothing is held: a starving node is the feed's own pace
                continue
            try:
                if self._left(self.sc, self.group) == 0:
                    self._send(final=True)
                elif self._starved.is_set():
                    self._starved.clear()
                    self._send(final=False)
            except Exception as exc:  # the context may be stopping; the hold's own limit remains
                log.debug("feed watch: %s", exc)

    def _send(self, final: bool) -> None:
        why = "every partition of the feed is handed out" if final else "a data node starves"
        log.info("feed %s: releasing the Acks the nodes hold: %s", self.feed_id, why)
        self._tell(m.FeedRelease(self.qname, self.feed_id, final=final))
        if final:
            self.final_sent = True
        else:
            self.releases += 1
