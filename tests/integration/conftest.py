"""Helpers for integration tests: find leftover node processes and ports."""

from __future__ import annotations

import time

import psutil
import pytest

NODE_MARKERS = ("tfonspark.tfprocess.entry", "tfonspark.executor.supervisor", "tensorboard.main")


def node_processes() -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info.get("cmdline") or [])
        if any(marker in cmd for marker in NODE_MARKERS):
            found.append(proc)
    return found


def wait_until(predicate, timeout: float, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def listening_ports() -> set[int]:
    return {c.laddr.port for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN}


@pytest.fixture
def no_leftovers(request):
    """After the test: no node process, no Spark job still running."""
    yield
    assert wait_until(lambda: not node_processes(), 20), \
        f"node processes left behind: {[p.info.get('cmdline') for p in node_processes()]}"
    for name in ("sc", "sc_local", "standalone"):
        if name in request.fixturenames:
            sc = request.getfixturevalue(name)
            assert wait_until(lambda sc=sc: not sc.statusTracker().getActiveJobsIds(), 20), \
                "Spark jobs of the cluster are still running"


def by_value(module_name: str) -> None:
    """Pickle a test module's functions by value: executors cannot import test modules."""
    import sys

    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[module_name])
