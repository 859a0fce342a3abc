"""The driver's ledger of delivered training partitions: one memory for all the nodes of a gang.

Spark may run a feed task twice: its executor was lost (a host cut off, then back), or a
speculative copy. The second attempt can run on another executor and reach another node than
the first (a feed task prefers the node on its own executor), and each node only knows what it
delivered itself. So every node asks here before it commits a complete training partition
(``FeedClaim``, from :mod:`tfonspark.tfprocess.feedclaims`): the first node to ask delivers it,
any later attempt, on any node, is dropped and acknowledged. The rendezvous server hands each
``FeedClaim`` connection to :meth:`FeedLedger.serve`; memory is bounded as in
:class:`~tfonspark.tfprocess.delivered.Delivered`, whose rules (and refusal of a feed too old to
know) apply unchanged. A ledger lives as long as its gang: a restart forms a new one, as the
nodes' own queues start empty then.
"""

from __future__ import annotations

import contextlib
import logging
import threading

from ...errors import FeedError, ProtocolError
from ...tfprocess.delivered import Delivered
from ...wire import messages as m
from ...wire.framing import Connection

__all__ = ["FeedLedger"]

log = logging.getLogger(__name__)


class FeedLedger:
    """Which node delivered each partition of each train feed; answers the nodes' ``FeedClaim``."""

    def __init__(self) -> None:
        self.delivered = Delivered()
        self.repeats = 0  # attempts dropped because a partition was delivered before
        self.elsewhere = 0  # of them, attempts that reached another node than the first delivery
        self._lock = threading.Lock()
        self._conns: set[Connection] = set()
        self._closed = False

    def claim(self, node: str, feed_id: str, partition: int) -> m.FeedClaimed:
        """The answer to ``node`` asking to deliver ``partition`` of ``feed_id``."""
        with self._lock:
            try:
                owner = self.delivered.claim(feed_id, partition, node)
            except FeedError as exc:
                return m.FeedClaimed(False, refusal=str(exc))
            if owner is None:
                return m.FeedClaimed(True, node)
            self.repeats += 1
            if owner != node:
                self.elsewhere += 1
        log.info(
            "partition %s of feed %s reached %s again after %s delivered it (a Spark retry or speculative "
            "task); %s drops it",
            partition,
            feed_id,
            node,
            owner if owner != node else "that node",
            node,
        )
        return m.FeedClaimed(False, owner)

    def serve(self, conn: Connection, first: m.FeedClaim) -> None:
        """Answer ``first`` and every later claim on ``conn`` (a node's feed server) until it closes."""
        with self._lock:
            if self._closed:
                return
            self._conns.add(conn)
        conn.settimeout(None)  # a node asks once per partition, however far apart; close() ends the wait
        msg: m.Message = first
        try:
            while True:
                assert isinstance(msg, m.FeedClaim)
                m.send_message(conn, self.claim(msg.node, msg.feed_id, msg.partition))
                msg = m.recv_message(conn, m.FeedClaim)
        except (OSError, ProtocolError):
            pass  # the node's feed server closed (its TF process ended) or the ledger did
        finally:
            with self._lock:
                self._conns.discard(conn)

    def close(self) -> None:
        """Close every node's claim connection (the gang is done)."""
        with self._lock:
            self._closed = True
            conns, self._conns = list(self._conns), set()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.close()
