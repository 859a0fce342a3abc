"""A node's questions to the driver before it commits a training partition: exactly once across nodes.

A feed task sends its partition to the node on its own executor, or, from an executor without a
node, to one chosen by partition index (``executor/feeder.py``). When Spark runs a task again
(its executor was lost, a speculative copy), the new attempt may run on another executor and so
reach another node than the first attempt: each node alone would deliver the partition once, and
the cluster twice. So before a node queues a complete training partition for ``map_fun`` it asks
the driver, which keeps the one :class:`~.delivered.Delivered` of the cluster (in its rendezvous
server): the first node to ask delivers, every later attempt (on any node) is dropped and
acknowledged, so its feed task succeeds.

:class:`DriverClaims` keeps one authenticated connection to the driver's rendezvous server per
feed server, opened on first use and opened again once if it broke. A question the driver does
not answer within its deadline is a ``FeedError``: the partition is refused (its feed task fails
and Spark retries it), never delivered on a guess.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import FeedError, ProtocolError
from ..wire import messages as m
from ..wire.framing import Connection, connect

__all__ = ["CLAIM_TIMEOUT_SECS", "Claim", "DriverClaims"]

log = logging.getLogger(__name__)

#: the longest wait for the driver's answer (and for a connection to it): a driver that does not
#: answer within it is unreachable or hung, and the cluster is failing anyway
CLAIM_TIMEOUT_SECS = 30.0

#: ``claim(feed_id, partition)``: None if this node delivers the partition (the first attempt to
#: arrive anywhere), else the node that delivered it; ``FeedError`` where it must not be delivered
Claim = Callable[[str, int], "str | None"]


class DriverClaims:
    """``claim(feed_id, partition)`` answered by the driver at ``address`` for node ``node``."""

    def __init__(self, address: Sequence[Any], secret: bytes, node: str, timeout: float = CLAIM_TIMEOUT_SECS) -> None:
        self.address = (str(address[0]), int(address[1]))
        self.secret = secret
        self.node = node
        self.timeout = timeout
        self._conn: Connection | None = None
        self._lock = threading.Lock()  # one question at a time on the one connection

    def __call__(self, feed_id: str, partition: int) -> str | None:
        question = m.FeedClaim(self.node, feed_id, partition)
        with self._lock:
            try:
                answer = self._ask(question)
            except (OSError, ProtocolError) as first:
                self._drop()
                try:  # once more on a fresh connection: the driver may have closed an idle one
                    answer = self._ask(question)
                except (OSError, ProtocolError) as exc:
                    self._drop()
                    raise FeedError(
                        f"partition {partition} of feed {feed_id!r} was not delivered: node {self.node} could not "
                        f"ask the driver at {self.address[0]}:{self.address[1]} whether another node delivered it "
                        f"already ({type(first).__name__}: {first}; then {type(exc).__name__}: {exc}); "
                        "is the driver's host reachable from this one?"
                    ) from None
        if answer.refusal:
            raise FeedError(answer.refusal)
        if answer.first:
            return None
        return answer.owner or self.node

    def _ask(self, question: m.FeedClaim) -> m.FeedClaimed:
        if self._conn is None:
            self._conn = connect(self.address, self.secret, timeout=self.timeout)
            self._conn.settimeout(self.timeout)
        m.send_message(self._conn, question)
        answer = m.recv_message(self._conn, m.FeedClaimed)
        assert isinstance(answer, m.FeedClaimed)
        return answer

    def _drop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.close()
            self._conn = None

    def close(self) -> None:
        """Close the connection to the driver (the feed server is closing)."""
        with self._lock:
            self._drop()
