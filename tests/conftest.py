"""Shared fixtures: one live SparkContext per master kind, environment restored after each test."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests import spark_jvm

REPO = Path(__file__).resolve().parents[1]
_UNIT = Path(__file__).resolve().parent / "unit"

# The pytest process drives core (Keras 3) and TFoS-face programs alike: a face module imported
# while collecting tests must not switch the whole session, and the nodes it starts, to Keras 2
# (tfonspark._tfos_keras respects a value the environment already sets).
os.environ.setdefault("TF_USE_LEGACY_KERAS", "0")
# Under pytest-xdist (make test runs the tests in 2 processes) each worker has its own temp
# dir: tests that check what they leave there (feed sockets, scratch dirs) see only their own.
# Its name carries the run's id too: two runs on one machine (a developer's and CI's) each have
# worker "gw0", and one must not empty the other's temp dir under its running tests.
_XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if _XDIST_WORKER:
    _RUN = os.environ.get("PYTEST_XDIST_TESTRUNUID", "")[:8]
    _WORKER_TMP = Path(tempfile.gettempdir()) / f"tfonspark-tests-{_RUN}-{_XDIST_WORKER}"
    shutil.rmtree(_WORKER_TMP, ignore_errors=True)
    _WORKER_TMP.mkdir()
    os.environ["TMPDIR"] = str(_WORKER_TMP)
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again
DATA_ROOT = Path(os.environ.get("TFONSPARK_TEST_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(autouse=True)
def _restore_environ():
    """Tests may set environment variables freely; each starts from the same environment."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(scope="session")
def mnist_dir() -> Path:
    path = DATA_ROOT / "mnist"
    if not (path / "train-images-idx3-ubyte.gz").exists():
        pytest.skip(f"MNIST idx files not found under {path}")
    return path


@pytest.fixture(scope="session")
def fashion_dir() -> Path:
    path = DATA_ROOT / "fashion"
    if not (path / "train-images-idx3-ubyte.gz").exists():
        pytest.skip(f"Fashion-MNIST idx files not found under {path}")
    return path


def _spark_manager():
    from tfonspark.testing import SparkManager

    return SparkManager.instance()


@pytest.fixture(scope="session")
def spark_manager():
    manager = _spark_manager()
    yield manager
    manager.stop()


@pytest.fixture
def sc(spark_manager):
    """A SparkContext on ``local-cluster[2,1,1024]``: two real executor JVMs."""
    return spark_manager.get("local-cluster[2,1,1024]")


@pytest.fixture
def spark(sc):
    from pyspark.sql import SparkSession

    return SparkSession.builder.getOrCreate()


@pytest.fixture
def sc_local(spark_manager):
    """A SparkContext on plain ``local[2]`` (a laptop: one JVM, two task slots)."""
    return spark_manager.get("local[2]")


@pytest.fixture
def standalone(spark_manager):
    """A SparkContext on a standalone master + 2 workers on 127.0.0.1, started by the tests."""
    return spark_manager.get("standalone:2")


_KIND_ORDER = {"sc": 1, "spark": 1, "sc_local": 2, "standalone": 3}
# Every fixture that gives a SparkContext or SparkSession (sc, spark, sc_local, standalone, and
# those of tests/ that start one) asks for spark_manager: a test that has it gets the ``spark``
# marker, so that ``-m "not spark"`` leaves out every test that needs a JVM.
_SPARK_FIXTURES = {"spark_manager"}


def pytest_collection_modifyitems(items):
    """Group tests by the Spark master they need, so each kind of cluster starts once. Under
    xdist (``make test``), whose workers take whole files in this order, the multi-host tests
    come first (one worker runs them all, on one shared cluster: :func:`pytest_xdist_make_scheduler`),
    the one that kills a host's Spark worker last of them, and the unit tests' many short
    files last: they fill the end, while the last long integration file runs."""

    def kind(item):
        names = getattr(item, "fixturenames", ())
        return max((_KIND_ORDER.get(n, 0) for n in names), default=0)

    def hosts(item):  # 0: a multi-host test, 1: one that breaks a host (after the others), 2: the rest
        return 1 if item.get_closest_marker("breaks_host") else 0 if item.get_closest_marker("hosts") else 2

    items.sort(key=lambda item: (_XDIST_WORKER is not None and _is_unit(item), hosts(item), kind(item)))
    for item in items:
        if _SPARK_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.spark)


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile``, except that every file of multi-host tests is one unit of work.

    Those files share one multi-host cluster (``tests/integration/hosts_fixture.py``, a session
    fixture of the xdist worker): one worker runs them all, one after the other, and starts the
    cluster once (about 26 s on 2 idle cores), and two of them never run side by side (each
    holds 4-6 JVMs and TF processes on the 2 cores, where a 10 s heartbeat timeout is tested).
    """
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    together = _host_files(Path(config.rootpath))

    class HostFilesTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return "multi-host tests" if scope in together else scope

    return HostFilesTogether(config, log)


def _host_files(root: Path) -> set[str]:
    """The test files (as node ids write them) of multi-host tests: those marked ``hosts``."""
    return {
        str(path.relative_to(root))
        for path in (root / "tests").rglob("test_*.py")
        if "pytest.mark.hosts" in path.read_text(encoding="utf-8")
    }


def _is_unit(item) -> bool:
    """A test of ``tests/unit`` (they start no JVM)."""
    return _UNIT in Path(item.path).resolve().parents  # tests/unit/ mirrors src/: its subpackages too


def pytest_collection_finish(session):
    """Every Spark JVM the tests start, here or in a subprocess (examples, TFoS programs,
    benchmarks), gets :mod:`tests.spark_jvm`'s options: C1 only, and Spark's classes from a CDS
    archive, written once per Java and pyspark version (under xdist by the first worker, while
    the other waits for it). Unit tests start no JVM."""
    if not all(_is_unit(item) for item in session.items):
        spark_jvm.configure(os.environ)


def pytest_sessionfinish(session):
    """An xdist worker removes its own temp dir (its name is this run's, never used again)."""
    if _XDIST_WORKER:
        shutil.rmtree(_WORKER_TMP, ignore_errors=True)
