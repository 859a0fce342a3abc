"""The node task's first step: a closure that checks the executor's tfonspark, then runs the task."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

from pyspark import cloudpickle

import tfonspark
from tfonspark.executor.preflight import REPORT, guarded


def _task(items):
    for item in items:
        yield item * 2


def test_the_same_version_runs_the_pickled_task():
    run = guarded(cloudpickle.dumps(_task), tfonspark.__version__)
    assert list(run(iter([1, 2]))) == [2, 4]


def test_no_version_known_is_not_compared():
    assert list(guarded(cloudpickle.dumps(_task), "")(iter([3]))) == [6]


def test_another_version_is_reported_not_run():
    (report,) = guarded(cloudpickle.dumps(_task), "0.0.1+other")(iter([1]))
    assert report[REPORT] == "version" and report["executor_version"] == tfonspark.__version__
    assert report["python"] == sys.executable and report["prefix"] == sys.prefix
    assert report["location"] == os.path.dirname(tfonspark.__file__)


def test_a_python_without_tfonspark_reports_itself(tmp_path: Path):
    """The closure unpickles and runs where tfonspark cannot be imported (no site-packages, only
    pyspark's zips on the path, as on an executor's worker): the report names that interpreter."""
    (tmp_path / "run.pkl").write_bytes(cloudpickle.dumps(guarded(cloudpickle.dumps(_task), "0.1.0")))
    lib = Path(cloudpickle.__file__).resolve().parents[1] / "python" / "lib"
    code = (
        "import pickle, sys; run = pickle.load(open(sys.argv[1], 'rb')); print(repr(list(run(iter([1])))));"
        "print([m for m in sys.modules if m.startswith('tfonspark')])"
    )
    env = {"PYTHONPATH": os.pathsep.join(str(p) for p in sorted(lib.glob("*.zip"))), "PATH": os.environ["PATH"]}
    done = subprocess.run(
        [sys._base_executable, "-S", "-c", code, str(tmp_path / "run.pkl")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    reports, loaded = done.stdout.splitlines()
    (report,) = ast.literal_eval(reports)
    assert report[REPORT] == "missing" and report["python"] == sys._base_executable
    assert report["error"] == "ModuleNotFoundError: No module named 'tfonspark'"
    assert loaded == "[]"
