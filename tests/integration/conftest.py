"""Helpers for integration tests: find leftover node processes and ports."""

from __future__ import annotations

import glob
import os
import tempfile
import time

import psutil
import pytest

NODE_MARKERS = ("tfonspark.tfprocess.entry", "tfonspark.executor.supervisor", "tensorboard.main")


def node_processes(clusters: list[str] | None = None) -> list[psutil.Process]:
    """Node processes (supervisors, TF processes, TensorBoard), optionally of given clusters only."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info.get("cmdline") or [])
        if not any(marker in cmd for marker in NODE_MARKERS):
            continue
        if clusters is None or any(c[:12] in cmd for c in clusters):
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


def feed_socket_dirs(clusters: list[str] | None = None) -> list[str]:
    """Private dirs a node may leave behind: its TMPDIR (``tfos-node-<cluster>-*``, made by the
    supervisor; of the given clusters only, if any) and a Unix feed socket's directory made
    outside one (``wire.framing.listen_unix``)."""
    tmp = tempfile.gettempdir()
    scratch = [f"tfos-node-{c[:12]}-*" for c in clusters] if clusters is not None else ["tfos-node-*"]
    return [d for pattern in ["tfos-feed-*", *scratch] for d in glob.glob(os.path.join(tmp, pattern))]


@pytest.fixture
def no_leftovers(request, monkeypatch):
    """After the test: no process of the clusters it started, no Spark job still running."""
    from tfonspark.driver import cluster as cluster_module

    started: list[str] = []
    original = cluster_module.Cluster.__init__

    def recording_init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        started.append(self.cluster_id)

    monkeypatch.setattr(cluster_module.Cluster, "__init__", recording_init)
    sockets_before = set(feed_socket_dirs())
    yield
    assert wait_until(lambda: not node_processes(started), 20), (
        f"node processes left behind: {[p.info.get('cmdline') for p in node_processes(started)]}"
    )
    assert wait_until(lambda: not set(feed_socket_dirs(started)) - sockets_before, 10), (
        f"feed sockets left behind: {sorted(set(feed_socket_dirs(started)) - sockets_before)}"
    )
    for name in ("sc", "sc_local", "standalone"):
        if name in request.fixturenames:
            sc = request.getfixturevalue(name)
            assert wait_until(lambda sc=sc: not sc.statusTracker().getActiveJobsIds(), 20), (
                "Spark jobs of the cluster are still running"
            )


def by_value(module_name: str) -> None:
    """Pickle a test module's functions by value: executors cannot import test modules."""
    import sys

    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[module_name])
