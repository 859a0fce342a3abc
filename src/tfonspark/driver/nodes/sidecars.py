"""The evaluator goes first when a cluster ends, so its last evaluation reaches the driver.

A sidecar evaluator (``eval_node=True``, ``ps_cluster(evaluator=...)``) turns SIGTERM into
"evaluate the newest checkpoint, then return" (:mod:`tfonspark.distribute.sidecar`), which
takes longer than the other nodes' stop. :func:`finish_evaluators` stops it first, with at least
``EVALUATOR_GRACE_SECS``, and waits for it to exit, so that its last report is in
``cluster.reports`` before the rest is stopped (the driver collects reports until teardown
closes its server in any case: see ``Gang._watch``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from .plane import ControlPlane
from .rendezvous import NodeState

__all__ = ["EVALUATOR_GRACE_SECS", "finish_evaluators"]

_log = logging.getLogger(__name__)

EVALUATOR_GRACE_SECS = 10.0
"""The least time an evaluator gets between SIGTERM and SIGKILL to evaluate the last checkpoint
(``shutdown(grace_secs=...)`` raises it); one that exits sooner costs no more."""
_MARGIN_SECS = 15.0  # beyond the grace: the supervisor's SIGKILL and its exit message


def _evaluators(nodes: Iterable[NodeState]) -> list[NodeState]:
    return [n for n in nodes if n.role.job_name == "evaluator"]


def finish_evaluators(plane: ControlPlane, grace_secs: float) -> None:
    """Stop the running evaluator nodes (SIGTERM, SIGKILL after at least ``EVALUATOR_GRACE_SECS``)
    and wait for them to exit; a no-op without one. An evaluator that ends badly is logged: the
    cluster's training result stands."""
    running = [n for n in _evaluators(plane.nodes()) if n.address and not n.finished]
    if not running:
        return
    grace = max(grace_secs, EVALUATOR_GRACE_SECS)
    for node in running:
        plane.stop_node(node, grace)
    done = plane.wait_for(
        lambda nodes: all(n.finished for n in _evaluators(nodes)), grace + _MARGIN_SECS, until_failure=False
    )
    for node in running:
        code = node.exit.exit_code if node.exit is not None else None
        if not done or code != 0:
            how = "did not exit" if code is None else f"exited with code {code}"
            _log.warning(
                "evaluator %s %s after its stop (grace %.0fs); its last evaluation may be missing: raise "
                "shutdown(grace_secs=...) if evaluating a checkpoint takes longer. %s",
                node.role.name,
                how,
                grace,
                (node.exit.traceback if node.exit is not None else "").strip()[-2000:],
            )
