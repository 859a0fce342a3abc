"""How a cluster's node supervisors are started: as a Spark job, or as local threads.

The :class:`~tfonspark.driver.cluster.Cluster` only needs a :class:`Launcher`; swapping it is
the test seam that lets the cluster's lifecycle run without Spark (Spark's own distributor tests
swap their launcher the same way). Both launchers start the same thing: one
``tfonspark.executor.supervisor`` process per node (``executor/node.py``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

from ...config import InputMode, NodeConfig
from ...executor.node import node_task, start_node
from ...executor.preflight import guarded
from ...wire.errors import captured
from ..jobs import BackgroundJob
from . import environment

__all__ = ["LaunchHandle", "Launcher", "LocalLauncher", "SparkLauncher", "ended_tasks"]


class LaunchHandle(Protocol):
    """A running launch: ``done`` is set when every node task returned, ``error`` if one failed.

    A handle may also have ``ended_tasks() -> int``, how many of its node tasks have returned so
    far (:func:`ended_tasks`): one that returns while the nodes are still being reserved never
    registered its node, e.g. a preflight report of an executor without tfonspark.
    """

    done: threading.Event
    error: BaseException | None

    def cancel(self) -> None: ...

    def join(self, timeout: float | None = None) -> bool: ...


def ended_tasks(handle: LaunchHandle) -> int:
    """How many of a launch's node tasks have returned so far (0 where the handle cannot say)."""
    count = getattr(handle, "ended_tasks", None)
    if not callable(count):
        return 0
    try:
        return int(count())
    except Exception:  # noqa: BLE001 (a launch that cannot count says nothing)
        return 0


class Launcher(Protocol):
    """Starts one node supervisor per executor id and reports when they have all returned."""

    def launch(
        self, config: NodeConfig, payload: bytes, executor_ids: list[int], on_done: Callable[[], None]
    ) -> LaunchHandle: ...


class SparkLauncher:
    """One Spark task per node, as a barrier stage where the cluster manager allows it.

    Each task first checks that its executor's Python has the driver's tfonspark; where not, the
    job ends at once with :class:`~tfonspark.errors.ExecutorEnvironmentError`
    (``driver/nodes/environment.py``) instead of Spark's retries of a failing unpickle.
    """

    def __init__(self, sc: Any, barrier: bool) -> None:
        self.sc = sc
        self.barrier = barrier

    def launch(
        self, config: NodeConfig, payload: bytes, executor_ids: list[int], on_done: Callable[[], None]
    ) -> LaunchHandle:
        rdd = self.sc.parallelize(executor_ids, len(executor_ids))
        if self.barrier:
            rdd = rdd.barrier()
        from pyspark import cloudpickle

        # the executor checks its tfonspark before it unpickles the task (executor/preflight.py)
        pickled: bytes = cloudpickle.dumps(captured(node_task(config, payload)))  # type: ignore[no-untyped-call]
        task = guarded(pickled, config.version)

        def start() -> list[Any]:
            results: list[Any] = rdd.mapPartitions(task).collect()
            environment.check(results, self.sc, config.version)  # an unfit executor Python, at once
            return results

        return BackgroundJob(self.sc, f"tfonspark nodes {config.cluster_id[:8]}", start, on_done)


class LocalLauncher:
    """Each node's supervisor started from a thread of this process: driver-side ps nodes, tests.

    ``cancel`` cannot interrupt a supervisor; the cluster stops nodes through the rendezvous
    server first, and ``start_node`` is bounded by its own start-up deadline.
    """

    def __init__(self, wait_for_exit: bool | None = None) -> None:
        self.wait_for_exit = wait_for_exit  # None: as a Spark node task does (InputMode.TENSORFLOW)

    def launch(
        self, config: NodeConfig, payload: bytes, executor_ids: list[int], on_done: Callable[[], None]
    ) -> LaunchHandle:
        wait = config.input_mode == InputMode.TENSORFLOW if self.wait_for_exit is None else self.wait_for_exit
        return _LocalLaunch(config, payload, executor_ids, on_done, wait)


class _LocalLaunch:
    def __init__(
        self,
        config: NodeConfig,
        payload: bytes,
        executor_ids: list[int],
        on_done: Callable[[], None],
        wait_for_exit: bool,
    ) -> None:
        self.done = threading.Event()
        self.error: BaseException | None = None
        self._on_done = on_done
        self._pending = self._total = len(executor_ids)
        self._lock = threading.Lock()
        for executor_id in executor_ids:
            args = (config, executor_id, payload, wait_for_exit)
            threading.Thread(target=self._node, args=args, daemon=True, name=f"tfos-local-{executor_id}").start()
        if not executor_ids:
            self._finish()

    def _node(self, config: NodeConfig, executor_id: int, payload: bytes, wait_for_exit: bool) -> None:
        try:
            start_node(config, executor_id, payload, [], wait_for_exit)
        except BaseException as exc:  # reported to whoever waits on the launch
            with self._lock:
                self.error = self.error or exc
        with self._lock:
            self._pending -= 1
            last = self._pending == 0
        if last:
            self._finish()

    def _finish(self) -> None:
        self.done.set()
        self._on_done()

    def cancel(self) -> None:
        """Nothing to cancel: the supervisors are stopped through the rendezvous server."""

    def ended_tasks(self) -> int:
        """The nodes whose supervisor has returned so far."""
        with self._lock:
            return self._total - self._pending

    def join(self, timeout: float | None = None) -> bool:
        return self.done.wait(timeout)
