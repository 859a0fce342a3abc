"""Which partitions of which feeds were delivered, and by whom: the memory behind exactly-once.

One :class:`Delivered` is asked at the end of every training partition whether it is the first
complete attempt of that partition; repeated attempts (Spark retries, speculative tasks) are
dropped, and an attempt of a feed too old to be remembered is refused. Memory is bounded by the
number of streams of feeds, not by their length.

In a cluster the one that answers is the driver's (its rendezvous server holds it, and every
node's feed server asks it through :mod:`.feedclaims`): a retry that Spark runs on another
executor may reach another node than the first attempt did, and only a memory shared by all
nodes sees both. A feed server without a driver (tests, local feeds) keeps its own.
"""

from __future__ import annotations

import collections

from ..errors import FeedError

__all__ = ["Delivered"]

#: of how many recent feeds of one stream (or of train() calls) the delivered partitions are
#: remembered, to drop repeated attempts: Spark retries a partition while its job runs, and a
#: micro-batch's job ends before the next one's starts. An attempt of an older feed is refused
#: (see ``Delivered``), never delivered again.
_REMEMBERED_FEEDS = 64


class Delivered:
    """Which partitions of which feeds were delivered, in memory bounded by the streams' count.

    A feed id ``<stream>:<number>`` is a micro-batch of a stream (the driver's ``<query id>:<batch
    id>``, ``<stream>:<batch time ms>``, ``<driver>:<n>`` of ``train()`` calls; numbers grow);
    other ids (an older feeder's) form one stream of their own. Of each stream, the partitions of
    its last ``_REMEMBERED_FEEDS`` feeds are remembered; of its older ones only the highest number
    (other ids: each id). A stream's feeds run one after another, so only its own newer feeds push
    a feed out, never another stream's nor one that is still running.

    An attempt of a forgotten feed (its number at or below what the stream forgot) is refused with
    ``FeedError``: whether its partition was delivered is no longer known, and delivering it
    twice is the one thing that must not happen. A long stream costs one number, whatever its
    length.
    """

    def __init__(self, remembered: int | None = None) -> None:
        self.remembered = _REMEMBERED_FEEDS if remembered is None else remembered
        # stream -> feed -> partition -> the node that delivered it ("" where none was named)
        self.recent: dict[str | None, collections.OrderedDict[str, dict[int, str]]] = {}
        self.forgotten_up_to: dict[str, int] = {}  # stream -> the highest number it forgot
        self.forgotten_ids: set[str] = set()  # forgotten feeds whose id has no number

    def first(self, feed_id: str, partition: int) -> bool:
        """Record ``partition`` of ``feed_id`` delivered: True if it was not before, False if it
        was (a repeated attempt), ``FeedError`` if the feed is older than what is remembered."""
        return self.claim(feed_id, partition) is None

    def claim(self, feed_id: str, partition: int, owner: str = "") -> str | None:
        """Record ``partition`` of ``feed_id`` delivered by ``owner`` if it was not before (None);
        else the owner of its first delivery (a repeated attempt, to drop). ``FeedError`` if the
        feed is older than what is remembered."""
        stream, number = _sequence(feed_id)
        family = stream if number is not None else None
        recent = self.recent.get(family) or collections.OrderedDict()
        seen = recent.get(feed_id)
        if seen is None:
            if (feed_id in self.forgotten_ids) if number is None else number <= self.forgotten_up_to.get(stream, -1):
                raise FeedError(
                    f"partition {partition} of feed {feed_id!r} was refused: this node remembers which partitions "
                    f"were delivered for the last {self.remembered} feeds of a stream only, and that feed is older, "
                    "so its rows might be delivered twice (a micro-batch replayed long after it ran, or a task "
                    "attempt that outlived its feed job)"
                )
            recent = self.recent.setdefault(family, collections.OrderedDict())
            seen = recent[feed_id] = {}
            while len(recent) > self.remembered:
                self._forget(recent.popitem(last=False)[0])
        recent.move_to_end(feed_id)
        if partition in seen:
            return seen[partition]
        seen[partition] = owner
        return None

    def _forget(self, feed_id: str) -> None:
        stream, number = _sequence(feed_id)
        if number is None:
            self.forgotten_ids.add(feed_id)
        else:
            self.forgotten_up_to[stream] = max(number, self.forgotten_up_to.get(stream, -1))


def _sequence(feed_id: str) -> tuple[str, int | None]:
    """``("<stream>", number)`` for a feed id ``<stream>:<number>``, else ``(feed_id, None)``."""
    stream, colon, number = feed_id.rpartition(":")
    if colon and 0 < len(number) <= 20 and number.isascii() and number.isdigit():
        return stream, int(number)
    return feed_id, None
