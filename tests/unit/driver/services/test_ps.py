"""driver/services/ps.py: ``ps_cluster``'s checks, and its block's exit raising the node failure behind
TF's error.

The node processes here are real (``LocalLauncher``) but run a TF-free ``map_fun`` that records
what each node was told; ``tests/integration/test_ps_cluster.py`` trains on real Spark.
"""

from __future__ import annotations

import socket
import types

import pytest

import tfonspark
from tfonspark.config import InputMode
from tfonspark.driver.cluster import Reserved, Running
from tfonspark.driver.services.ps import PSCluster, servers_accepting
from tfonspark.errors import ConfigError, NodeFailed
from tfonspark.testing import FakeSparkContext


@pytest.mark.parametrize(("workers", "ps"), [(0, 1), (2, 0), (-1, 1), (True, 1)])
def test_ps_cluster_needs_a_worker_and_a_ps(workers, ps):
    with pytest.raises(ConfigError, match="ps_cluster needs"):
        tfonspark.ps_cluster(FakeSparkContext(), num_workers=workers, num_ps=ps)


def test_servers_accepting_tells_a_listening_port_from_a_reserved_one():
    from tfonspark.ports import reserve_port

    with socket.create_server(("127.0.0.1", 0)) as listening, reserve_port() as reserved:
        spec = {
            "chief": ["127.0.0.1:1"],  # not probed: the driver's own task
            "ps": [f"127.0.0.1:{listening.getsockname()[1]}"],
            "worker": [f"127.0.0.1:{reserved.getsockname()[1]}"],
        }
        assert servers_accepting(spec) == {"ps:0": True, "worker:0": False}


class _Plane:
    """The control plane of a ps cluster whose check finds ``error`` (a failed node) at the block's end."""

    def __init__(self, error: Exception | None) -> None:
        self.error = error
        self.config = types.SimpleNamespace(cluster_id="c" * 32)

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def nodes(self) -> list:
        return []

    def teardown(self, grace_secs: float, final: bool = False) -> None:
        pass


class _Handover:
    def release(self) -> None:
        pass


def _ps_cluster(error: Exception | None) -> PSCluster:
    gang, streams = _Plane(error), types.SimpleNamespace(join=lambda timeout: True)
    held = Reserved("chief", _Handover(), "127.0.0.1:1")  # type: ignore[arg-type]
    running = Running(None, InputMode.TENSORFLOW, types.SimpleNamespace(gang=gang), None, streams, None, held=held)  # type: ignore[arg-type]
    return PSCluster(running)


def test_leaving_the_block_with_tfs_error_raises_the_node_failure_behind_it():
    failed = NodeFailed("TensorFlow node ps:0 (executor 0) was killed by signal 9 (SIGKILL)", role="ps", index=0)
    with pytest.raises(NodeFailed) as info, _ps_cluster(failed):
        raise RuntimeError("UnavailableError: failed to connect to all addresses")
    assert info.value is failed and isinstance(info.value.__cause__, RuntimeError)
    with pytest.raises(KeyboardInterrupt), _ps_cluster(failed):  # an interrupt stays what it is
        raise KeyboardInterrupt
    with pytest.raises(ValueError), _ps_cluster(RuntimeError("other")):  # the block's own error otherwise
        raise ValueError("the block's own")


def test_ps_cluster_refuses_an_evaluator_that_is_not_callable():
    with pytest.raises(ConfigError, match="evaluator must be callable"):
        tfonspark.ps_cluster(FakeSparkContext(), num_workers=1, num_ps=1, evaluator="eval.py")
