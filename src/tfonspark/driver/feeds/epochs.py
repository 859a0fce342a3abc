"""``Cluster.train`` of a restartable cluster: one feed job per epoch, each followed by its end mark.

After a restart the feed goes on from the first epoch that some data node had not read through
(its end mark not reached): completed epochs are never fed again.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from typing import Any

from ...errors import NodeFailed
from ..nodes.plane import ControlPlane
from ..nodes.rendezvous import NodeState
from ..nodes.restarts import Attempts
from .feeding import Feeds, check_num_epochs

__all__ = ["await_read_through", "train_epochs"]

log = logging.getLogger(__name__)


def train_epochs(
    attempts: Attempts,
    feeds: Feeds,
    data: Any,
    num_epochs: int,
    feed_timeout: float,
    qname: str,
    label: str,
    read_timeout: float,
) -> int:
    """Feed ``data`` epoch by epoch; the rows delivered. ``read_timeout``: see :func:`await_read_through`."""
    check_num_epochs(num_epochs)
    feed_id, epoch, read = uuid.uuid4().hex[:12], 0, -1  # read: the last epoch every node read through
    delivered: dict[int, int] = {}  # epoch -> rows its last feed delivered
    while True:
        try:
            if epoch < num_epochs and not attempts.gang.all_done():
                attempts.gang.check()
                epoch_label = f"{label} epoch {epoch + 1}/{num_epochs}"
                delivered[epoch] = feeds.train(data, 1, feed_timeout, qname, label=epoch_label)
                feeds.mark_epoch(feed_id, epoch, qname)
                epoch += 1
                continue
            # fed is not read: a node failing on the rows still in its buffer needs them again
            await_read_through(attempts.gang, feed_id, num_epochs - 1, read_timeout)
            return sum(delivered.values())
        except NodeFailed as error:
            # the failed attempt's marks (a new attempt's nodes start from the epoch re-fed)
            gang = attempts.gang
            marks = gang.marks_read(feed_id)
            read = max(read, min((marks.get(name, -1) for name in gang.data_nodes()), default=-1))
            attempts.restart(error)
            epoch = attempts.log[-1].refeed_epoch = read + 1
            log.info("re-feeding epochs %d-%d of %d after the restart", epoch + 1, num_epochs, num_epochs)


def await_read_through(plane: ControlPlane, feed_id: str, epoch: int, timeout: float) -> None:
    """Wait until every data node has read ``epoch`` of a train feed to its end (or has finished).

    Gives up, with a warning, once no node has read an epoch mark or reported anything for
    ``timeout`` seconds (a ``map_fun`` that stopped reading): the data was delivered.
    """
    names = plane.data_nodes()

    def read(nodes: Iterable[NodeState]) -> bool:
        done = {n.role.name for n in nodes if n.finished or n.feed_ended}
        done |= {name for name, last in plane.marks_read(feed_id).items() if last >= epoch}
        return names <= done

    progress = -1
    while not plane.wait_for(read, timeout):
        plane.check()
        if plane.event_count == progress:
            log.warning(
                "train(): the data nodes have not read the last epoch to its end after epoch_end_timeout=%.0fs "
                "without progress; a node failing now restarts without it being fed again",
                timeout,
            )
            return
        progress = plane.event_count
    plane.check()
