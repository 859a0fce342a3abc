"""Real Spark for tests and demos: ``local[N]``, ``local-cluster[...]`` and a standalone cluster.

Only one SparkContext can live in a Python process, so :class:`SparkManager` keeps one and
switches master kinds on request (stopping the old context first). Tests that use the same kind
share one context for the whole session.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Protocol

from ..errors import ClusterError
from .ports import free_ports

__all__ = ["SparkManager", "StandaloneCluster", "embedded", "spark_conf", "spark_home", "wait_for_executors"]

_FAST_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.locality.wait": "0",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.executor.heartbeatInterval": "5s",
    "spark.network.timeout": "60s",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
}


def spark_home() -> str:
    """The Spark distribution inside the installed ``pyspark`` package (has bin/spark-class)."""
    import pyspark

    return os.environ.get("SPARK_HOME") or str(Path(pyspark.__file__).parent)


def embedded(master: str) -> bool:
    """Whether ``master``'s executors run on this machine, where :func:`spark_conf`'s pinning holds.

    ``local``, ``local[N]``, ``local-cluster[...]``, :class:`SparkManager`'s ``standalone:N`` and a
    standalone master on loopback (``spark://127.0.0.1:7077``, ``spark://localhost:7077``) are;
    any other (``spark://other-host:7077``, ``yarn``, ``k8s://...``) is another machine's cluster,
    whose executors cannot reach a driver pinned to 127.0.0.1 nor run this machine's Python.
    """
    if master == "local" or master.startswith(("local[", "local-cluster[", "standalone:")):
        return True
    if master.startswith("spark://"):
        hosts = [h.rsplit(":", 1)[0] for h in master.removeprefix("spark://").split(",")]
        return all(h == "localhost" or h.startswith("127.") for h in hosts)
    return False


def _python_path() -> str:
    src = str(Path(__file__).resolve().parents[2])
    parts = [src] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join(dict.fromkeys(parts))


def spark_conf(master: str, app_name: str = "tfonspark", **extra: str) -> Any:
    """A SparkConf tuned for small, fast, offline runs on one machine.

    It pins the driver to 127.0.0.1 and the executors to this process's Python and checkout
    (``extra`` may say otherwise): right for an :func:`embedded` master, and for hosts that share
    this machine's filesystem (:mod:`tfonspark.testing.hosts`); another machine's cluster takes
    its settings from ``spark-submit`` instead (:func:`tfonspark.demo.spark_context`).
    """
    from pyspark import SparkConf

    os.environ.setdefault("SPARK_HOME", spark_home())
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    conf = SparkConf().setMaster(master).setAppName(app_name)
    for key, value in _FAST_CONF.items():
        conf.set(key, value)
    conf.set("spark.test.home", spark_home())
    conf.set("spark.pyspark.python", sys.executable)
    conf.set("spark.executorEnv.PYTHONPATH", _python_path())
    for key, value in extra.items():
        conf.set(key.replace("__", "."), value)
    return conf


class Place(Protocol):
    """A host a JVM can run on (:class:`tfonspark.testing.hosts.Host`): its own address."""

    @property
    def address(self) -> str: ...


class Runner(Protocol):
    """What starts processes on a :class:`Place` (:class:`tfonspark.testing.hosts.Hosts`)."""

    def popen(
        self, host: Any, argv: Sequence[str], env: Any = None, log: IO[bytes] | None = None
    ) -> subprocess.Popen[bytes]: ...

    def run(
        self, host: Any, argv: Sequence[str], timeout: float, env: Any = None
    ) -> subprocess.CompletedProcess[str]: ...


class StandaloneCluster:
    """A Spark standalone master and ``workers`` workers, each in its own JVM: on 127.0.0.1, or
    with ``places`` (:meth:`tfonspark.testing.hosts.Hosts.spark`) the master on one host and a
    worker on each worker host, every JVM at its host's own address."""

    def __init__(
        self,
        workers: int = 2,
        cores: int = 1,
        memory: str = "1g",
        places: tuple[Runner, Place, Sequence[Place]] | None = None,
        worker_env: Mapping[str, str] | None = None,
    ) -> None:
        self.workers = workers
        self.worker_env = dict(worker_env or {})  #: more environment for the worker JVMs (SPARK_WORKER_OPTS)
        self.cores = cores
        self.memory = memory
        self._places = places
        if places is None:
            self.host = "127.0.0.1"
            self.port, self.ui_port = free_ports(2)
        else:  # a host of its own: its ports are free
            self.host, self.port, self.ui_port = places[1].address, 7077, 8080
        self.url = f"spark://{self.host}:{self.port}"
        self._procs: list[subprocess.Popen[bytes]] = []
        self._dir = tempfile.mkdtemp(prefix="tfos-standalone-")

    def _spawn(self, name: str, *args: str, on: Place | None = None, more: Mapping[str, str] | None = None) -> None:
        env = dict(
            os.environ,
            **(more or {}),
            SPARK_HOME=spark_home(),
            SPARK_LOCAL_IP=on.address if on else "127.0.0.1",
            SPARK_WORKER_DIR=os.path.join(self._dir, "work"),
            SPARK_LOG_DIR=self._dir,
            SPARK_NO_DAEMONIZE="1",
        )
        log = open(os.path.join(self._dir, f"{name}.log"), "wb")  # noqa: SIM115 (closed by process)
        cmd = [os.path.join(spark_home(), "bin", "spark-class"), *args]
        if self._places is not None and on is not None:
            self._procs.append(self._places[0].popen(on, cmd, env, log))
            return
        self._procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    def start(self, timeout: float = 90.0) -> StandaloneCluster:
        master = self._places[1] if self._places else None
        workers = list(self._places[2]) if self._places else [None] * self.workers
        self._spawn(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--webui-port",
            str(self.ui_port),
            on=master,
        )
        # a worker that finds no master yet retries only after 5-15 s (Spark's registration
        # back-off): the workers start once the master answers, which halves the start on 2 cores
        self._wait_for_workers(timeout, count=0)
        for i, place in enumerate(workers):
            self._spawn(
                f"worker{i}",
                "org.apache.spark.deploy.worker.Worker",
                self.url,
                "--host",
                place.address if place else "127.0.0.1",
                "-c",
                str(self.cores),
                "-m",
                self.memory,
                "--webui-port",
                "8081" if place else str(free_ports()[0]),
                on=place,
                more=self.worker_env,
            )
        self._wait_for_workers(timeout)
        return self

    def _alive_workers(self) -> int:
        """The master's count of registered workers (its web UI's JSON); raises OSError/ValueError until up."""
        url = f"http://{self.host}:{self.ui_port}/json/"
        if self._places is None:
            with urllib.request.urlopen(url, timeout=2) as r:
                return int(json.load(r).get("aliveworkers", 0))
        hosts, master = self._places[0], self._places[1]
        code = (
            f"import json,urllib.request as u; print(json.load(u.urlopen({url!r}, timeout=2)).get('aliveworkers', 0))"
        )
        done = hosts.run(master, [sys.executable, "-c", code], timeout=10)  # asked on its host
        if done.returncode != 0:
            raise OSError(done.stderr.strip()[-200:])
        return int(done.stdout.strip())

    def _wait_for_workers(self, timeout: float, count: int | None = None) -> None:
        """Wait until ``count`` (default: all) workers registered with the master; 0: until it answers."""
        wanted = self.workers if count is None else count
        deadline = time.monotonic() + timeout
        alive = 0
        while time.monotonic() < deadline:
            try:
                alive = self._alive_workers()
                if alive >= wanted:
                    return
            except (OSError, ValueError, subprocess.TimeoutExpired):  # not up yet, or its JSON page not yet
                pass
            time.sleep(0.5)
        self.stop()
        raise ClusterError(
            f"standalone cluster: {alive} of {wanted} workers registered with {self.url} "
            f"within {timeout:.0f}s; see the logs in {self._dir}"
        )

    def stop(self) -> None:
        for proc in reversed(self._procs):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, 15)
                except ProcessLookupError:
                    continue
        for proc in self._procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()
        self._procs.clear()
        shutil.rmtree(self._dir, ignore_errors=True)


class SparkManager:
    """Holds at most one live SparkContext, keyed by master kind, for a whole test session.

    Kinds: any Spark master URL (``local[2]``, ``local-cluster[2,1,1024]``) or
    ``standalone:N`` for N workers that this manager starts on 127.0.0.1.
    """

    _instance: SparkManager | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.kind: str | None = None
        self.sc: Any = None
        self._standalone: StandaloneCluster | None = None

    @classmethod
    def instance(cls) -> SparkManager:
        with cls._lock:
            if cls._instance is None:
                cls._instance = SparkManager()
            return cls._instance

    def get(self, kind: str, **conf: str) -> Any:
        from pyspark import SparkContext

        if self.kind == kind and self.sc is not None:
            return self.sc
        self.stop()
        master = kind
        if kind.startswith("standalone:"):
            self._standalone = StandaloneCluster(workers=int(kind.split(":", 1)[1])).start()
            master = self._standalone.url
            conf.setdefault("spark__cores__max", str(self._standalone.workers))
            conf.setdefault("spark__executor__cores", "1")
            conf.setdefault("spark__executor__memory", "1g")
        self.sc = SparkContext(conf=spark_conf(master, app_name=f"tfonspark-tests-{kind}", **conf))
        self.sc.setLogLevel("ERROR")
        self.kind = kind
        wait_for_executors(self.sc, _expected_executors(kind))
        return self.sc

    def stop(self) -> None:
        if self.sc is not None:
            try:
                from pyspark.sql import SparkSession

                active = SparkSession.getActiveSession()
                if active is not None:
                    active.stop()
            finally:
                self.sc.stop()
        self.sc = None
        self.kind = None
        if self._standalone is not None:
            self._standalone.stop()
            self._standalone = None


def _expected_executors(kind: str) -> int:
    if kind.startswith("standalone:"):
        return int(kind.split(":", 1)[1])
    if kind.startswith("local-cluster["):
        return int(kind[len("local-cluster[") :].split(",")[0])
    return 0


def wait_for_executors(sc: Any, count: int, timeout: float = 60.0) -> None:
    """Block until ``count`` executors have registered, so gang scheduling can start at once.

    ClusterError naming both numbers where fewer registered within ``timeout`` seconds."""
    if count <= 0:
        return
    deadline = time.monotonic() + timeout
    seen = 0
    while time.monotonic() < deadline:
        seen = sc._jsc.sc().getExecutorMemoryStatus().size() - 1  # minus the driver
        if seen >= count:
            return
        time.sleep(0.2)
    raise ClusterError(f"{seen} of {count} Spark executors registered within {timeout:.0f}s")
