"""What the nodes of each kind of cluster run: the table of node programs, the one place it is chosen.

Every node of a cluster runs one program, ``program(tf_args, ctx)`` in its TF process. Which one
is the kind of cluster, as a backend in Ray Train or a runner in Horovod says what its workers
run; the start path (:func:`tfonspark.driver.plan.prepare`) is the same for all of them.

=================  ==========================================  ======================================  ======
kind               started by                                  every node runs                         serves
=================  ==========================================  ======================================  ======
``map_fun``        ``run()``, ``TFCluster.run``, ``TFEstimator``  ``map_fun``                          no
``coordinator``    ``run(..., coordinator=True)``               ``ChiefCoordinator``: ``map_fun`` on    yes
                                                                the chief, a TF server elsewhere
``data_on_nodes``  ``run(..., data_service_on="nodes")``        ``OnNodes``: ``map_fun``, a tf.data     no
                                                                worker beside it on the first N nodes
``ps``             ``ps_cluster()``                             ``serve``: a TF server                  yes
``ps_evaluator``   ``ps_cluster(..., evaluator=fn)``            ``ServeBesideEvaluator``: ``fn`` on     yes
                                                                the evaluator, a TF server elsewhere
``data_worker``    ``data_service()``                           ``serve_data``: a tf.data worker        yes
=================  ==========================================  ======================================  ======

"serves": the cluster's workers only serve a TF server (no user code), so their supervisors
restart a killed one in place, at the same address (``NodeConfig.server_restarts``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import ConfigError
from ..tfprocess.data_worker import OnNodes, serve_data
from ..tfprocess.server import ChiefCoordinator, ServeBesideEvaluator, serve
from .options import PLACES, ClusterOptions, service_workers

__all__ = ["PROGRAMS", "NodeProgram", "ProgramKind", "for_run"]

#: what each node runs: ``program(tf_args, ctx)``
Program = Callable[[Any, Any], Any]
ProgramKind = Literal["map_fun", "coordinator", "data_on_nodes", "ps", "ps_evaluator", "data_worker"]


@dataclass(frozen=True)
class NodeProgram:
    """One row of the table: what every node of one kind of cluster runs.

    ``make(fn, options, nodes)`` is the program, from the user's function (``map_fun``; the
    evaluator's for ``ps_evaluator``; None where the nodes run none), the cluster's options
    and its number of nodes. ``serves``: the workers only serve a TF server (module doc).
    """

    kind: ProgramKind
    serves: bool
    make: Callable[[Program | None, ClusterOptions, int], Program]


def _user_function(fn: Program | None) -> Program:
    if fn is None or not callable(fn):
        raise ConfigError(f"map_fun must be callable. Received: {type(fn).__name__}")
    return fn


def _on_nodes(fn: Program | None, options: ClusterOptions, nodes: int) -> Program:
    """``OnNodes`` of ``map_fun``, once the options are ones whose nodes each run it once."""
    count = service_workers(options)
    why = _not_on_nodes(options, count, nodes)
    if why:
        raise ConfigError(f"data_service_on='nodes' {why}; or use data_service_on='executors' (executors of their own)")
    return OnNodes(_user_function(fn), count, float(options.reservation_timeout))


def _not_on_nodes(options: ClusterOptions, count: int, nodes: int) -> str:
    """Why ``count`` workers cannot run in ``nodes`` TF nodes under ``options`` ("": they can)."""
    if not 1 <= count <= nodes:
        return f"runs one tf.data worker in each of the first data_service nodes: give 1..{nodes}. Received: {count}"
    if options.coordinator:
        return "needs map_fun on every node, but coordinator=True runs it on the chief only"
    if options.max_restarts:
        return "keeps the dispatcher's worker list for one start of the nodes: max_restarts must be 0"
    if options.driver_ps_nodes:
        return "runs workers on the nodes' executors, not on the driver: driver_ps_nodes must be False"
    return ""


def _server(fn: Program | None, options: ClusterOptions, nodes: int) -> Program:
    return serve


def _data_worker(fn: Program | None, options: ClusterOptions, nodes: int) -> Program:
    return serve_data


def _beside_evaluator(fn: Program | None, options: ClusterOptions, nodes: int) -> Program:
    return ServeBesideEvaluator(_user_function(fn))


def _coordinator(fn: Program | None, options: ClusterOptions, nodes: int) -> Program:
    return ChiefCoordinator(_user_function(fn), float(options.reservation_timeout))


PROGRAMS: Mapping[ProgramKind, NodeProgram] = {
    row.kind: row
    for row in (
        NodeProgram("map_fun", False, lambda fn, options, nodes: _user_function(fn)),
        NodeProgram("coordinator", True, _coordinator),
        NodeProgram("data_on_nodes", False, _on_nodes),
        NodeProgram("ps", True, _server),
        NodeProgram("ps_evaluator", True, _beside_evaluator),
        NodeProgram("data_worker", True, _data_worker),
    )
}
"""The table (module doc), by kind."""


def for_run(options: ClusterOptions) -> NodeProgram:
    """The row of a cluster of ``run()`` (and ``TFCluster.run``, ``TFEstimator``), as its options say.

    Raises ConfigError for a ``data_service_on`` that is not one of :data:`PLACES`, and for a
    ``data_service`` that is not a whole number >= 0.

    Examples
    --------
    >>> for_run(ClusterOptions(num_ps=1, coordinator=True)).kind
    'coordinator'
    """
    service_workers(options)
    place = options.data_service_on
    if place not in PLACES:
        raise ConfigError(f"data_service_on must be one of {', '.join(map(repr, PLACES))}. Received: {place!r}")
    if place == "nodes":
        return PROGRAMS["data_on_nodes"]
    return PROGRAMS["coordinator" if options.coordinator else "map_fun"]
