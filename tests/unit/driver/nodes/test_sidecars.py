"""driver/nodes/sidecars.py: the evaluator of a parameter-server cluster is stopped first, with a
longer grace, and waited for.

``run(..., coordinator=True, eval_node=True)`` runs ``map_fun`` on the chief and on the
evaluator; ``ps_cluster(..., evaluator=fn)`` runs ``fn`` on the evaluator. The evaluator runs no
TF server, so TF's coordinator must not see it in its cluster spec.
``tests/integration/test_ps_coordinator.py`` runs one on real Spark.
"""

from __future__ import annotations

from tfonspark.driver.nodes.rendezvous import NodeState
from tfonspark.driver.nodes.roles import plan_roles
from tfonspark.driver.nodes.sidecars import EVALUATOR_GRACE_SECS, finish_evaluators
from tfonspark.wire.messages import NodeExit


class _Server:
    """What :func:`finish_evaluators` uses of the control plane: its nodes, Stop, and waiting."""

    def __init__(self, nodes, exit_code=0) -> None:
        self.table = list(nodes)
        self.stopped: list[tuple[str, float]] = []
        self.exit_code = exit_code

    def nodes(self):
        return list(self.table)

    def stop_node(self, node, grace_secs) -> None:
        self.stopped.append((node.role.name, grace_secs))
        node.exit = NodeExit(node.role.executor_id, self.exit_code, stopped=True)  # its supervisor's answer

    def wait_for(self, predicate, timeout, until_failure=True) -> bool:
        assert timeout > 0 and until_failure is False
        return bool(predicate(self.table))


def _nodes():
    return [
        NodeState(role, address=f"h:{role.executor_id}") for role in plan_roles(4, 1, eval_node=True, coordinator=True)
    ]


def test_the_evaluator_is_stopped_first_with_a_longer_grace_and_waited_for():
    server = _Server(_nodes())
    finish_evaluators(server, grace_secs=0)
    assert server.stopped == [("evaluator:0", EVALUATOR_GRACE_SECS)]  # only it; the rest go at teardown
    finish_evaluators(server, grace_secs=30)  # it has exited: nothing to do
    assert len(server.stopped) == 1


def test_an_evaluator_killed_at_its_stop_is_logged(caplog):
    server = _Server(_nodes(), exit_code=-9)
    finish_evaluators(server, grace_secs=60)
    assert server.stopped == [("evaluator:0", 60)]
    assert "evaluator:0 exited with code -9" in caplog.text and "grace_secs" in caplog.text


def test_without_an_evaluator_nothing_is_stopped():
    server = _Server([NodeState(role, address="h:1") for role in plan_roles(3, 1, coordinator=True)])
    finish_evaluators(server, grace_secs=0)
    assert server.stopped == []
