"""Helpers for integration tests: find leftover node processes and ports, run driver scripts."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from tests import waiting
from tfonspark.testing import free_ports

from .hosts_fixture import hosts  # noqa: F401  (the multi-host tests' shared cluster)

NODE_MARKERS = (
    "tfonspark.tfprocess.entry",
    "tfonspark.executor.supervisor",
    "tfonspark.executor.spare",  # the keeper of a warm spare TF process (executor/spare.py)
    "tensorboard.main",
)


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


def supervisor_of(cluster, tf_pid: int) -> psutil.Process:
    """The supervisor of ``cluster``'s TF process ``tf_pid``: found by its command line
    (``--executor N --cluster ID``), since a TF process forked from the executor's fork server
    (``executor/forkserver.py``) is not its supervisor's child."""
    nodes = cluster._attempts.gang.server.nodes.values()  # a Cluster's, a serving cluster's alike
    node = next(n for n in nodes if n.up is not None and n.up.tf_pid == tf_pid)
    marks = ("tfonspark.executor.supervisor", f"--executor {node.role.executor_id}", cluster.cluster_id[:12])
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info.get("cmdline") or [])
        if all(mark in cmd for mark in marks):
            return proc
    raise LookupError(f"no supervisor of TF process {tf_pid} ({node.role})")


def wait_until(predicate, timeout: float, interval: float = 0.2) -> bool:
    """:func:`tests.waiting.wait_until`, asking less often: these predicates scan processes and ports."""
    return waiting.wait_until(predicate, timeout, interval)


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


def run_tf_workers(script: Path, args_of, tmp: Path, *, timeout: float = 300.0, **extra_env: str) -> list[dict]:
    """Run ``script`` as two MWMS workers over 127.0.0.1 (TF_CONFIG set, no Spark); wait for both.

    ``args_of(index)`` gives worker ``index``'s command-line arguments after the script, the last
    of which is where it writes its JSON result; returns the results by task id. A worker that
    fails or outlives ``timeout`` fails the test with the tail of its log.
    """
    addresses = [f"127.0.0.1:{p}" for p in free_ports(2)]
    scratch = tmp / "scratch"
    scratch.mkdir(exist_ok=True)
    procs, logs, results = [], [], []
    for index in range(2):
        env = dict(os.environ)
        env.update(
            TF_CONFIG=json.dumps({"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}}),
            TF_CPP_MIN_LOG_LEVEL="2",
            TF_NUM_INTRAOP_THREADS="1",
            CUDA_VISIBLE_DEVICES="",
            TMPDIR=str(scratch),
            **extra_env,
        )
        args = [str(a) for a in args_of(index)]
        results.append(Path(args[-1]))
        log_path = tmp / f"{script.stem}-{index}-{time.monotonic_ns()}.log"
        logs.append(log_path)
        with open(log_path, "w") as log:
            procs.append(
                subprocess.Popen([sys.executable, str(script), *args], env=env, stdout=log, stderr=subprocess.STDOUT)
            )
    deadline = time.monotonic() + timeout
    try:
        for proc in procs:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for index, proc in enumerate(procs):
        if proc.returncode != 0:
            tail = logs[index].read_text()[-3000:]
            pytest.fail(f"{script.name} worker {index} exited with {proc.returncode}:\n{tail}")
    return [json.loads(path.read_text()) for path in results]


def run_driver(script: Path, *args: str, out: Path, timeout: float = 240.0) -> dict:
    """Run the driver script ``script`` (``MASTER OUT_JSON ...`` in ``args``, ``out`` among them) in a
    subprocess and return the JSON it wrote to ``out``.

    ``ps_cluster``'s coordinator (TF's threads, its in-process ``chief`` server) lives as long as
    its process, which must not be the pytest process. A driver that fails, or writes nothing,
    fails the test with the tail of its log (next to ``out``), gRPC's noise left out.
    """
    log = out.with_name(f"{out.stem}-{script.stem}.log")
    # a native crash (TF's coordinator threads) then prints every thread's Python stack into the log
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    with open(log, "w") as f:
        proc = subprocess.run(
            [sys.executable, str(script), *args],
            stdout=f,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            check=False,
            env=env,
        )
    if proc.returncode != 0 or not out.exists():
        tail = "\n".join(line for line in log.read_text().splitlines() if "GRPC" not in line)[-4000:]
        pytest.fail(f"{script.name} exited with {proc.returncode}:\n{tail}")
    return json.loads(out.read_text())
