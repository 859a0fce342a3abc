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
from pathlib import Path
from typing import Any

from ..errors import ClusterError
from .ports import free_ports

__all__ = ["SparkManager", "StandaloneCluster", "spark_conf", "spark_home"]

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


def _python_path() -> str:
    src = str(Path(__file__).resolve().parents[2])
    parts = [src] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join(dict.fromkeys(parts))


def spark_conf(master: str, app_name: str = "tfonspark", **extra: str) -> Any:
    """A SparkConf tuned for small, fast, offline runs on one machine."""
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


class StandaloneCluster:
    """A Spark standalone master and ``workers`` workers on 127.0.0.1, each in its own JVM."""

    def __init__(self, workers: int = 2, cores: int = 1, memory: str = "1g") -> None:
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.port, self.ui_port = free_ports(2)
        self.url = f"spark://127.0.0.1:{self.port}"
        self._procs: list[subprocess.Popen[bytes]] = []
        self._dir = tempfile.mkdtemp(prefix="tfos-standalone-")

    def _spawn(self, name: str, *args: str) -> None:
        env = dict(
            os.environ,
            SPARK_HOME=spark_home(),
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_WORKER_DIR=os.path.join(self._dir, "work"),
            SPARK_LOG_DIR=self._dir,
            SPARK_NO_DAEMONIZE="1",
        )
        log = open(os.path.join(self._dir, f"{name}.log"), "wb")  # noqa: SIM115 (closed by process)
        cmd = [os.path.join(spark_home(), "bin", "spark-class"), *args]
        self._procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    def start(self, timeout: float = 90.0) -> StandaloneCluster:
        self._spawn(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--webui-port",
            str(self.ui_port),
        )
        for i in range(self.workers):
            self._spawn(
                f"worker{i}",
                "org.apache.spark.deploy.worker.Worker",
                self.url,
                "--host",
                "127.0.0.1",
                "-c",
                str(self.cores),
                "-m",
                self.memory,
                "--webui-port",
                str(free_ports()[0]),
            )
        self._wait_for_workers(timeout)
        return self

    def _wait_for_workers(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        alive = 0
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=2) as r:
                    alive = int(json.load(r).get("aliveworkers", 0))
                if alive >= self.workers:
                    return
            except (OSError, ValueError):  # not up yet, or its JSON page not yet (HTML comes first)
                pass
            time.sleep(0.5)
        self.stop()
        raise ClusterError(
            f"standalone cluster: {alive} of {self.workers} workers registered with {self.url} "
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
        _wait_for_executors(self.sc, _expected_executors(kind))
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


def _wait_for_executors(sc: Any, count: int, timeout: float = 60.0) -> None:
    """Block until ``count`` executors have registered, so gang scheduling can start at once."""
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
