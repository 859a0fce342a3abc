"""Which Python the executors run, and the error when it cannot start a node.

The node job's tasks check their executor's tfonspark before anything else
(:mod:`tfonspark.executor.preflight`) and return a report instead of failing where it is missing
or another version. :func:`check` turns those reports into one
:class:`~tfonspark.errors.ExecutorEnvironmentError` naming the Python each executor ran, how
Spark chose it (``spark.pyspark.python``, ``PYSPARK_PYTHON``, or the default ``python3``), and the
two ways to give the executors the driver's environment: ship it as an archive, or install
tfonspark in their Python.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from ...errors import ExecutorEnvironmentError
from ...executor.preflight import REPORT

__all__ = ["SHIP_HINT", "check", "chosen_python"]

SHIP_HINT = (
    "Give the executors the driver's environment: pack it (venv-pack -o env.tar.gz, or conda-pack) and "
    "submit with --archives env.tar.gz#env --conf spark.pyspark.python=./env/bin/python (without "
    "spark-submit: spark.archives=env.tar.gz#env and PYSPARK_PYTHON=./env/bin/python in the driver's "
    "environment), or install tfonspark {version} in that Python on every executor host"
)


def chosen_python(sc: Any) -> str:
    """How Spark chose the executors' Python, in words (from the driver's conf and environment).

    PySpark starts its workers with the driver's ``PYSPARK_PYTHON`` (``spark-submit`` sets it
    from ``spark.pyspark.python``), else ``python3`` found on each executor's ``PATH``.
    """
    conf = sc.getConf()
    asked = str(getattr(sc, "pythonExec", "") or os.environ.get("PYSPARK_PYTHON", "") or "python3")
    named = conf.get("spark.pyspark.python", None)
    env = os.environ.get("PYSPARK_PYTHON", "")
    if named:
        how = f"spark.pyspark.python={named!r}"
    elif env:
        how = f"PYSPARK_PYTHON={env!r} on the driver"
    else:
        how = "the default (PYSPARK_PYTHON and spark.pyspark.python are unset), found on each executor's PATH"
    executor_env = conf.get("spark.executorEnv.PYSPARK_PYTHON", None)
    extra = f"; spark.executorEnv.PYSPARK_PYTHON={executor_env!r}" if executor_env else ""
    return f"Spark started {asked!r}, from {how}{extra}"


def reports(results: Iterable[Any]) -> list[dict[str, Any]]:
    """The preflight reports among a node job's results (the other results are task statuses)."""
    return [r for r in results if isinstance(r, dict) and REPORT in r]


def check(results: Iterable[Any], sc: Any, driver_version: str) -> None:
    """Raise ExecutorEnvironmentError if any node task found its executor's Python unfit."""
    found = reports(results)
    if not found:
        return
    first = found[0]
    python, host = str(first.get("python", "")), str(first.get("host", ""))
    ran = f"{python!r} (Python {first.get('python_version', '?')}, sys.prefix {first.get('prefix', '?')!r})"
    others = sorted({f"{r.get('python')} on {r.get('host')}" for r in found[1:]} - {f"{python} on {host}"})
    also = f"; also {', '.join(others)}" if others else ""
    tasks = f"{len(found)} node task{'s' if len(found) != 1 else ''}"
    if first[REPORT] == "missing":
        executor_version = ""
        what = (
            f"tfonspark cannot be imported on the executors ({tasks}): the executor on host {host!r} ran "
            f"{ran}{also}, and it said {first.get('error', '')}."
        )
    else:
        executor_version = str(first.get("executor_version", ""))
        what = (
            f"the executors run another tfonspark than the driver ({tasks}): the executor on host {host!r} ran "
            f"{ran}{also}, whose tfonspark is {executor_version!r} (from {first.get('location', '?')!r}); "
            f"the driver's is {driver_version!r}."
        )
    hint = SHIP_HINT.format(version=driver_version or "(the driver's version)")
    raise ExecutorEnvironmentError(
        f"{what} {chosen_python(sc)}. {hint}.",
        python=python,
        host=host,
        driver_version=driver_version,
        executor_version=executor_version,
    )
