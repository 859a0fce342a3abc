"""The feed's waits in progress on a node, and the thread that tells the driver of long ones.

Every place the feed waits on a node (a held Ack, a feeder waiting for room in the buffer,
``map_fun`` waiting for data) runs inside :meth:`Waits.waiting`. One daemon thread looks at them
every half second: a wait older than ``FEED_WAIT_WARNING_SECS`` becomes a ``FeedWaiting`` event,
which the driver logs as a WARNING naming the node, what it waits for and the setting; a reader
that starves (nothing queued, nothing arriving) for ``FEED_STARVED_SECS`` becomes a
``FeedStarved`` event, on which the driver releases the Acks other nodes hold. Events are written
from that thread, never with a lock of the feed held: writing one may block on the status pipe.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..settings import FEED_STARVED_SECS, FEED_WAIT_WARNING_SECS
from ..wire import events as ev

__all__ = ["Waits"]

_SCAN_SECS = 0.5


@dataclass
class _Wait:
    """One wait in progress: what it is about, when it began, what was already said of it."""

    what: str
    setting: str
    feed_id: str
    partition: int
    qname: str
    starving: Callable[[], bool] | None
    start: float
    warned: bool = False
    starved_since: float | None = None  # when the reader was first seen starving in this wait
    starved_told: float | None = None  # when the driver was last told it starves


class Waits:
    """Registers the feed's waits; tells the driver (``on_event``) of long and starving ones."""

    def __init__(
        self,
        on_event: Callable[[ev.NodeEvent], None],
        warn_after: float = FEED_WAIT_WARNING_SECS,
        starved_after: float = FEED_STARVED_SECS,
    ) -> None:
        self.on_event = on_event
        self.warn_after = warn_after
        self.starved_after = starved_after
        self._waits: dict[int, _Wait] = {}
        self._numbers = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    @contextlib.contextmanager
    def waiting(
        self,
        what: str,
        setting: str,
        *,
        feed_id: str = "",
        partition: int = -1,
        qname: str = "",
        starving: Callable[[], bool] | None = None,
    ) -> Iterator[None]:
        """Run the block as one wait. ``starving`` (a reader's wait only) says, when called from
        the watch thread, whether nothing is queued or arriving for the reader now."""
        wait = _Wait(what, setting, feed_id, partition, qname, starving, time.monotonic())
        number = next(self._numbers)
        with self._cond:
            self._waits[number] = wait
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._watch, name="tfos-feed-waits", daemon=True)
                self._thread.start()
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                del self._waits[number]

    def close(self) -> None:
        """Stop the watch thread (the feed server is closing)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _watch(self) -> None:
        while True:
            with self._cond:
                while not self._waits and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                self._cond.wait(_SCAN_SECS)
                waits = list(self._waits.values())
            now = time.monotonic()
            for event in [e for w in waits for e in self._due(w, now)]:
                self.on_event(event)

    def _due(self, wait: _Wait, now: float) -> list[ev.NodeEvent]:
        """The events ``wait`` calls for now (each said once; a starving reader every few seconds)."""
        due: list[ev.NodeEvent] = []
        waited = now - wait.start
        if not wait.warned and waited >= self.warn_after:
            wait.warned = True
            due.append(ev.FeedWaiting(wait.what, round(waited, 1), wait.setting, wait.feed_id, wait.partition))
        if wait.starving is None:
            return due
        if not _safely(wait.starving):
            wait.starved_since = None
            return due
        since = wait.starved_since = now if wait.starved_since is None else wait.starved_since
        last = wait.starved_told if wait.starved_told is not None else since
        if now - last >= self.starved_after:
            wait.starved_told = now
            due.append(ev.FeedStarved(wait.qname, round(now - since, 1)))
        return due


def _safely(check: Callable[[], bool]) -> bool:
    """``check()``, False if it raises (the feed may be closing under it)."""
    try:
        return bool(check())
    except Exception:
        return False
