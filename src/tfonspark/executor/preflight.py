"""The node task's first step on an executor: is this Python's tfonspark the driver's?

A node task reaches its executor as a pickle of tfonspark's own functions, so unpickling it
imports tfonspark. Where the executor's Python has none (the driver's virtualenv was not
shipped, ``PYSPARK_PYTHON`` names another interpreter), that import fails inside Spark's worker,
before any code of ours runs: Spark retries the task, and the driver finally gets a bare
``ModuleNotFoundError`` that does not say which Python failed. And where the executor has
another tfonspark version, the nodes start and then fail in ways far from the cause.

:func:`guarded` wraps the node task so that what Spark unpickles first needs only the standard
library: the function it returns is a closure (cloudpickle sends closures by value, never by a
reference to this module) that imports nothing of tfonspark before it has checked. It imports
tfonspark itself, compares its ``__version__`` with the driver's, and only then unpickles and
runs the real task. When either check fails it does not raise, since Spark would retry what fails
the same way every time: it returns one :data:`REPORT` dict per task (which Python ran, where,
what it found), and the driver raises :class:`~tfonspark.errors.ExecutorEnvironmentError` from
them at once (``driver/nodes/environment.py``).

Keep this module free of imports of tfonspark: the closure must run in a Python without it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["REPORT", "guarded"]

REPORT = "tfonspark-executor-environment"
"""The key that marks a preflight report among a node job's results."""


def guarded(task_pickle: bytes, driver_version: str, barrier: bool = False) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """A ``mapPartitions`` function: check this executor's tfonspark, then run the pickled task.

    ``task_pickle`` is the real task (a node task, TFParallel's instances), pickled on the driver
    (cloudpickle); ``driver_version`` the driver's ``tfonspark.__version__`` (``""``: not known,
    not compared). Yields the task's results, or one report dict (``{REPORT: problem, "python":
    sys.executable, ...}``) instead of running it where ``import tfonspark`` fails (problem
    ``"missing"``) or finds another version (``"version"``). ``barrier``: the task calls
    ``BarrierTaskContext.barrier()`` once, so a task that reports takes part in that barrier
    before it returns, and the others are not left waiting in it.
    """
    key = REPORT  # closure cells, not globals: the closure travels without this module
    package = __name__.partition(".")[0]  # "tfonspark", imported by name: no import of the package here

    def report(problem: dict[str, Any]) -> dict[str, Any]:
        if barrier:
            from pyspark import BarrierTaskContext

            BarrierTaskContext.get().barrier()
        return problem

    def preflight(items: Iterator[Any]) -> Iterator[Any]:
        import importlib
        import os
        import pickle
        import socket
        import sys

        where = {
            "python": sys.executable,
            "prefix": sys.prefix,
            "python_version": sys.version.split()[0],
            "host": socket.gethostname(),
            "pyspark_python": os.environ.get("PYSPARK_PYTHON", ""),
        }
        try:
            tfonspark = importlib.import_module(package)
        except Exception as exc:  # ModuleNotFoundError, or an install broken on import
            yield report({key: "missing", **where, "error": f"{type(exc).__name__}: {exc}"})
            return
        found = str(getattr(tfonspark, "__version__", ""))
        if driver_version and found != driver_version:
            location = os.path.dirname(str(getattr(tfonspark, "__file__", "") or ""))
            yield report({key: "version", **where, "executor_version": found, "location": location})
            return
        yield from pickle.loads(task_pickle)(items)

    return preflight
