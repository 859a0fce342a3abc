"""The control plane of a running cluster, as everything above the nodes sees it: :class:`ControlPlane`.

The rendezvous server (nodes register, report and are stopped through it), the node table it
keeps and the gang's watcher (which hands every node event to the cluster) are one unit: one
start of the nodes, :class:`~tfonspark.driver.nodes.gang.Gang`. What the rest of the driver
needs of it is this interface, and nothing else reaches inside it (the server's fields, its
condition variable, the table's dicts): the :class:`~tfonspark.driver.cluster.Cluster`, the feed
jobs and streams (through :class:`~tfonspark.driver.nodes.gang.LiveNodes`), the restartable
epochs, the evaluator's stop at the end and the serve-only services. TFoS's
``TFCluster.server`` stays, as the one attribute user code reads.

Why a seam here: on Spark Connect (docs: issue 46) the driver program is a client and the
control plane runs inside the cluster, next to the executors. Its nodes then register with a
server the program cannot touch; the program talks to the control plane remotely, through these
same calls. Nothing above this interface changes for that: only another implementation of it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from .rendezvous import NodeState

__all__ = ["ControlPlane"]


class ControlPlane(Protocol):
    """One running start of a cluster's nodes: the node table, its events, stopping, waiting.

    Node events themselves go one way, to the handler the plane was formed with (the gang's
    watcher calls it for each); what later code needs of them is kept here as state
    (``event_count``, the epoch marks, ``NodeState.feed_ended``).
    """

    # ---- the node table ------------------------------------------------------------------------
    def nodes(self) -> list[NodeState]:
        """Every node's state, in executor-id order (a snapshot of the list; the states are live)."""
        ...

    def cluster_spec(self) -> dict[str, list[str]]:
        """``{job: ["host:port", ...]}`` every node was given (the driver's own tasks too); ``{}`` until formed."""
        ...

    def data_nodes(self) -> set[str]:
        """The names (``"worker:0"``) of the nodes that take data."""
        ...

    def failures(self) -> list[NodeState]:
        """The nodes that failed (exited badly or were lost), now."""
        ...

    def check(self) -> None:
        """Raise NodeFailed, after tearing every node down, if a node has failed."""
        ...

    # ---- events --------------------------------------------------------------------------------
    @property
    def event_count(self) -> int:
        """Node events accepted so far: a count that moves while the nodes make progress."""
        ...

    def marks_read(self, feed_id: str) -> dict[str, int]:
        """For each data node, the last epoch of a train feed it read to the end (its end mark)."""
        ...

    # ---- stopping ------------------------------------------------------------------------------
    def request_stop(self, reason: str) -> None:
        """Ask the cluster's streams to stop (the first reason is kept)."""
        ...

    def stop_node(self, node: NodeState, grace_secs: float, final: bool = False) -> None:
        """Ask one node's supervisor to stop its TF process (``final``: no restart follows)."""
        ...

    def teardown(self, grace_secs: float, final: bool = False) -> None:
        """Stop every node, wait for their supervisors, close the plane (idempotent)."""
        ...

    # ---- waiting -------------------------------------------------------------------------------
    def wait_for(
        self, predicate: Callable[[Iterable[NodeState]], object], timeout: float | None, until_failure: bool = True
    ) -> bool:
        """Wait until ``predicate(nodes)`` holds or (``until_failure``) a node fails; whether it holds."""
        ...
