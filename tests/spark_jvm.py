"""JVM options for every Spark JVM the tests start: C1 only, and Spark's classes from a CDS archive.

Every example, TFoS program, benchmark smoke run and PS driver a test runs starts its own
driver and executor JVMs, which live seconds to minutes. Two costs of such short JVMs are cut
here, for the tests only (benchmarks and users keep the JVM's defaults):

* C2's compiles of hot code cost more CPU than they save: C1 only (``-XX:TieredStopAtLevel=1``).
* Loading and verifying Spark's classes: a dynamic class-data-sharing (AppCDS) archive,
  written once per Java and pyspark version by a small job (:func:`build_archives`), maps them
  in ready-made. The JVM refuses an archive whose class path holds a non-empty directory, and
  Spark puts ``SPARK_CONF_DIR`` first on it: so the options travel in a properties file given
  by ``PYSPARK_SUBMIT_ARGS``, and ``SPARK_CONF_DIR`` is an empty directory. An archive that
  does not match is ignored by the JVM (``-Xshare:auto``), which then loads classes as usual.
  A ``local-cluster[2,1,1024]`` start and two small jobs: 20.5 -> 13.3 s of machine CPU, 13.2
  -> 8.7 s wall (3 runs each, C1 only both); writing the archives takes ~40 s once.

A user's own ``SPARK_CONF_DIR`` or ``PYSPARK_SUBMIT_ARGS`` wins: nothing is set then.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
C1_ONLY = "-XX:TieredStopAtLevel=1"
_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
_ROLES = ("driver", "executor")
_BUILD_SECS = 90  # the archive job takes ~40 s on 2 cores; on a timeout the tests run without archives

#: the archive-writing job: one executor (one writer per archive); the JVMs must exit on their own
_DUMP_JOB = """
import time
from pyspark import SparkConf, SparkContext
conf = SparkConf().setMaster("local-cluster[1,1,1024]").setAppName("tests-cds")
conf.set("spark.ui.enabled", "false").set("spark.driver.host", "127.0.0.1").set("spark.driver.bindAddress", "127.0.0.1")
sc = SparkContext(conf=conf)
sc.parallelize(range(100), 4).map(lambda x: (x % 3, x)).reduceByKey(lambda a, b: a + b).collect()
from pyspark.sql import SparkSession
SparkSession.builder.getOrCreate().range(100).selectExpr("id % 3 AS k").groupBy("k").count().collect()
sc.stop()
time.sleep(3)  # the executor JVM exits, writing its archive
SparkContext._gateway.shutdown()
"""


def _key() -> str:
    """Archives are valid for one Java and one Spark installation."""
    import pyspark

    java = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30).stderr
    return hashlib.sha256(f"{java}|{pyspark.__file__}|{pyspark.__version__}".encode()).hexdigest()[:16]


def _properties(path: Path, role_options: dict[str, str]) -> Path:
    """Written whole or not at all: another test process may be starting a JVM that reads it."""
    lines = [f"spark.{role}.extraJavaOptions  {C1_ONLY} {opts}\n" for role, opts in role_options.items()]
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text("".join(lines))
    partial.replace(path)
    return path


def _env(home: Path, properties: Path) -> dict[str, str]:
    empty = home / "conf"  # SPARK_CONF_DIR, empty: the class path may hold no non-empty directory
    empty.mkdir(exist_ok=True)
    return {"SPARK_CONF_DIR": str(empty), "PYSPARK_SUBMIT_ARGS": f"--properties-file {properties} pyspark-shell"}


def _archives(home: Path) -> dict[str, Path]:
    return {role: home / f"{role}.jsa" for role in _ROLES}


def _existing(home: Path) -> dict[str, Path] | None:
    archives = _archives(home)
    return archives if all(a.exists() for a in archives.values()) else None


def build_archives(home: Path) -> dict[str, Path] | None:
    """The driver's and executor's archives in the directory ``home``, written by a small job if missing;
    None where that failed (the tests then run without them). One process writes them: others
    (pytest-xdist's workers) wait for it, then use what it wrote."""
    with open(home / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when closed
        return _existing(home) or _build(home)


def _build(home: Path) -> dict[str, Path] | None:
    archives = _archives(home)
    dump = {role: f"-XX:ArchiveClassesAtExit={archives[role]} {_QUIET}" for role in _ROLES}
    env = dict(os.environ, **_env(home, _properties(home / "dump.conf", dump)))
    # its JVMs inherit the pipe: EOF means they have exited, having written their archives
    job = subprocess.Popen(
        [sys.executable, "-c", _DUMP_JOB],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        job.communicate(timeout=_BUILD_SECS)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)  # and a half-written archive is not kept
        job.communicate()
    else:
        if found := _existing(home):
            return found
    for archive in archives.values():
        archive.unlink(missing_ok=True)
    return None


def configure(environ: os._Environ[str]) -> None:
    """Set the tests' JVM options in ``environ``: C1 only, and the CDS archives (written here
    first where missing; used only where both exist). A user's own settings win."""
    if "SPARK_CONF_DIR" in environ or "PYSPARK_SUBMIT_ARGS" in environ:
        return
    environ.setdefault("SPARK_DAEMON_JAVA_OPTS", C1_ONLY)  # standalone master, workers
    home = REPO / "build" / "spark-jvm" / _key()
    home.mkdir(parents=True, exist_ok=True)
    archives = build_archives(home)
    if archives:
        options = {role: f"-XX:SharedArchiveFile={archives[role]} {_QUIET}" for role in _ROLES}
        properties = _properties(home / "cds.conf", options)
    else:
        properties = _properties(home / "c1.conf", dict.fromkeys(_ROLES, ""))
    environ.update(_env(home, properties))
