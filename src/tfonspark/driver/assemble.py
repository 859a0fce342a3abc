"""Putting a :class:`~tfonspark.driver.cluster.Cluster` together and starting it (``tfonspark.run``).

The pieces need each other: the feed jobs and streams ask the running gang about the nodes
(:class:`~tfonspark.driver.nodes.gang.LiveNodes`), each gang hands node events to the feeds and the
report log, and a restart forms the next gang. This module wires them once, here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..config import InputMode, NodeConfig
from .cluster import Cluster
from .feeds.feeding import Feeds
from .feeds.streaming import Streams
from .nodes.gang import Gang, LiveNodes
from .nodes.launcher import Launcher, SparkLauncher
from .nodes.node_events import NodeEvents
from .nodes.rendezvous import RendezvousServer
from .nodes.reports import ReportLog
from .nodes.restarts import Attempts, check_max_restarts
from .nodes.roles import NodeRole

if TYPE_CHECKING:
    from pyspark import SparkContext

__all__ = ["Reform", "start_cluster"]

#: makes an attempt's rendezvous server and node config (a fresh port and secret, ``attempt`` n)
Reform = Callable[[int], "tuple[RendezvousServer, NodeConfig]"]


def start_cluster(
    sc: SparkContext,
    roles: list[NodeRole],
    input_mode: InputMode,
    reform: Reform,
    work: tuple[Callable[[Any, Any], Any], Any],
    *,
    reports: ReportLog | None = None,
    launcher: Launcher | None = None,
    max_restarts: int = 0,
    reserve: Callable[[], None] | None = None,
    on_end: Callable[[], None] | None = None,
) -> Cluster:
    """Form attempt 0 with ``reform``, start ``work`` (``(map_fun, tf_args)``) on every node; the Cluster.

    ``reserve()`` waits for the executors a barrier node job needs (before each attempt);
    ``launcher`` starts the node supervisors (default: a Spark job). Whatever fails on the way
    is raised after the nodes and the server are torn down. ``on_end()`` runs once the running
    cluster's nodes stop (:class:`Cluster`), not when it cannot start.
    """
    from pyspark import cloudpickle

    check_max_restarts(max_restarts)
    log = reports or ReportLog()
    start_nodes = launcher or SparkLauncher(sc, barrier=False)
    running: list[Attempts] = []  # the one Attempts, once made: LiveNodes asks it for the running gang
    nodes = LiveNodes(lambda: running[0].gang)
    feeds = Feeds(sc, "", nodes)

    def form(attempt: int) -> Gang:
        server, config = reform(attempt)
        feeds.secret_hex = config.secret_hex
        return Gang(server, config, roles, start_nodes, NodeEvents(log, feeds), feeds.cancel)

    first = form(0)
    label, stop_timeout = first.config.cluster_id[:8], first.config.stream_stop_timeout
    streams = Streams(feeds, nodes, label=label, stop_timeout=stop_timeout)
    attempts = Attempts(first, max_restarts, form, reserve, lambda: not (streams.queries or streams.contexts))
    running.append(attempts)
    try:
        payload: bytes = cloudpickle.dumps(work)  # type: ignore[no-untyped-call]  # untyped in pyspark
        attempts.begin(payload)
    except BaseException:
        attempts.gang.teardown(grace_secs=0, final=True)  # run() fails: no restart follows
        raise
    return Cluster(sc, input_mode, attempts, feeds, streams, log, on_end)
