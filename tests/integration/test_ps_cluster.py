"""Parameter-server training on real Spark with the driver as coordinator (``tfonspark.ps_cluster``).

The driver runs in a subprocess (``ps_driver.py``): TensorFlow's coordinator, its threads and its
in-process ``chief`` server live as long as their process, which must not be the pytest process.
It starts 2 workers + 1 ps, trains a Keras 3 Dense layer for 50 scheduled steps, and leaves the
block; this test then checks that no node process is left and no worker/ps port still accepts.
"""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

import tfonspark
from tfonspark.driver.services.ps import servers_accepting
from tfonspark.errors import ReservationTimeout

from .conftest import run_driver, wait_until

pytestmark = pytest.mark.spark

DRIVER = Path(__file__).with_name("ps_driver.py")


def _run_driver(tmp_path: Path, master: str, *flags: str) -> dict:
    out = tmp_path / "out.json"
    return run_driver(DRIVER, master, str(out), *flags, out=out, timeout=240)


def _check_trained_and_gone(result: dict) -> None:
    losses = result["losses"]
    assert result["steps"] == 50 and len(losses) == 50
    assert sum(losses[-10:]) / 10 < 0.1 * sum(losses[:10]) / 10, losses
    assert result["devices"] and all("/job:ps" in d for d in result["devices"].values()), result["devices"]
    spec = result["spec"]
    assert spec["chief"] == [result["chief"]] and len(spec["worker"]) == 2 and len(spec["ps"]) == 1
    # the block's end stopped every server: checked inside the driver right after it, and again now
    assert result["after_block"]["accepting"] == {"ps:0": False, "worker:0": False, "worker:1": False}
    assert result["after_block"]["alive"] == []
    assert servers_accepting(spec) == {"ps:0": False, "worker:0": False, "worker:1": False}
    assert result["node_pids"], "no node process was found while the cluster ran"
    assert wait_until(lambda: not any(psutil.pid_exists(p) for p in result["node_pids"]), 10)


def test_the_driver_coordinates_two_workers_and_a_ps(tmp_path):
    result = _run_driver(tmp_path, "local[3]")
    _check_trained_and_gone(result)
    print(
        f"ps_cluster on local[3]: start-up {result['startup_s']:.1f}s, 50 steps {result['train_s']:.1f}s, "
        f"loss {result['losses'][0]:.3f} -> {result['losses'][-1]:.5f}, shutdown {result['shutdown_s']:.2f}s"
    )


def test_driver_ps_nodes_run_the_ps_task_on_the_driver_host(tmp_path):
    """Also: an exception leaving the block stops every server as a normal end does."""
    result = _run_driver(tmp_path, "local[2]", "--driver-ps", "--raise")  # 2 slots: the workers only
    assert result.get("raised")
    _check_trained_and_gone(result)
    assert result["ps_on_driver"] and not result["worker_on_driver"]


def test_too_few_executors_name_the_numbers_and_settings(sc_local):
    with pytest.raises(ReservationTimeout) as info:
        tfonspark.ps_cluster(sc_local, num_workers=2, num_ps=1, reservation_timeout=3)
    message = str(info.value)
    assert "num_workers=2, num_ps=1" in message and "3 Spark task slots" in message, message
    assert "spark.executor.instances" in message and "local[N]" in message, message
    assert (info.value.required, info.value.registered) == (3, 2)
