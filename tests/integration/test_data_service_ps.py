"""Issue 24: a ``ps_cluster`` trainer (the driver as coordinator) reads its data from ``data_service``.

Both on real Spark (``local[3]``: the service's worker, the ps, the worker), in a driver
subprocess (``ps_service_driver.py``). Every element the steps consumed came from the service
(counted on the ps), the loss fell, and after both blocks no server accepts and no node is left.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import run_driver

pytestmark = [pytest.mark.timeout(300), pytest.mark.spark]

DRIVER = Path(__file__).with_name("ps_service_driver.py")


def test_a_ps_trainer_reads_its_batches_from_the_service(tmp_path):
    out = tmp_path / "out.json"
    result = run_driver(DRIVER, "local[3]", str(out), out=out, timeout=240)
    assert result["elements"] == result["steps"] * result["batch"], result
    assert result["last_loss"] < 0.05 * result["first_loss"], result
    assert abs(result["w"] - 3) < 0.3 and abs(result["b"] - 1) < 0.5, result
    assert not any(result["accepting"].values()), result["accepting"]
    assert result["node_pids"] and result["alive"] == []
    print(f"\n[measured] ps_cluster + data_service up in {result['startup_s']:.1f}s; {result['elements']} elements")
