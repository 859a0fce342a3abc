"""Spark jobs the driver runs on behalf of a cluster: in the background, cancellable by group."""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from ..errors import ConfigError

__all__ = [
    "NODE_MEMORY_MIB",
    "SPARE_MEMORY_MIB",
    "BackgroundJob",
    "barrier_supported",
    "check_fed_cluster_conf",
    "memory_overhead_warning",
    "task_slots",
    "wait_for_slots",
]

log = logging.getLogger(__name__)

#: what one TF node holds outside the JVM, measured (issue 45: TF 2.21 CPU, Keras 3.15): its TF
#: process ~756 MiB RSS after training a small Conv2D model, its supervisor ~22 MiB; rounded up
NODE_MEMORY_MIB = 800
#: a spare TF process (``spare_processes``, for restarts) holds TensorFlow imported: ~700 MiB more
SPARE_MEMORY_MIB = 700
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)
_MIB_PER_UNIT = {"k": 1 / 1024, "": 1, "m": 1, "g": 1024, "t": 1024 * 1024}


class BackgroundJob:
    """Run ``action()`` (a Spark action) in a thread, under its own cancellable job group."""

    def __init__(
        self, sc: Any, description: str, action: Callable[[], Any], on_done: Callable[[], None] | None = None
    ) -> None:
        self.sc = sc
        self.group = f"tfonspark-{uuid.uuid4().hex[:12]}"
        self.description = description
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self._action = action
        self._on_done = on_done
        self._thread = threading.Thread(target=self._run, name=f"tfos-job-{description}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.sc.setJobGroup(self.group, self.description, interruptOnCancel=True)
            self.result = self._action()
        except BaseException as exc:  # reported to whoever waits on this job
            self.error = exc
        finally:
            self.done.set()
            if self._on_done is not None:
                self._on_done()

    def cancel(self) -> None:
        if not self.done.is_set():
            with contextlib.suppress(Exception):  # the context may already be stopped
                self.sc.cancelJobGroup(self.group)

    def join(self, timeout: float | None = None) -> bool:
        return self.done.wait(timeout)

    def ended_tasks(self) -> int:
        """Tasks of this job group's jobs that have completed so far, as Spark's status tracker
        counts them (0 once the context is stopped): a node job's tasks normally run as long as
        their nodes, so one that ended early says its node will not come."""
        try:
            tracker = self.sc.statusTracker()
            ended = 0
            for job_id in tracker.getJobIdsForGroup(self.group):
                job = tracker.getJobInfo(job_id)
                for stage_id in list(job.stageIds) if job is not None else []:
                    stage = tracker.getStageInfo(stage_id)
                    ended += int(stage.numCompletedTasks) if stage is not None else 0
            return ended
        except Exception:  # noqa: BLE001 (a stopped context, a JVM gone: nothing to say)
            return 0


def run_in_group(sc: Any, group: str, description: str, action: Callable[[], Any]) -> Any:
    """Run ``action`` on the calling thread under ``group`` so another thread can cancel it."""
    sc.setJobGroup(group, description, interruptOnCancel=True)
    try:
        return action()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
        sc.setLocalProperty("spark.job.description", None)


def _dynamic_allocation(conf: Any) -> bool:
    """Whether ``spark.dynamicAllocation.enabled`` is on (a boolean as Spark reads one: trimmed)."""
    return str(conf.get("spark.dynamicAllocation.enabled", "false")).strip().lower() == "true"


def barrier_supported(sc: Any) -> bool:
    """Barrier mode needs a static set of executors: not with dynamic allocation."""
    return not _dynamic_allocation(sc.getConf())


def check_fed_cluster_conf(sc: Any) -> None:
    """Raise ConfigError where Spark's own settings cannot keep a fed cluster's nodes alive.

    With dynamic allocation, Spark removes an executor that has run no task for
    ``spark.dynamicAllocation.executorIdleTimeout`` (60 s by default). A fed node's task returns
    once the node is up (its slot is for feed tasks), so between feeds its executor is idle, and
    removing it takes the node with it: the cluster fails a minute in, far from the cause. Local
    masters (``local``, ``local[N]``) have no dynamic allocation; ``local-cluster`` has.
    """
    conf = sc.getConf()
    master = str(getattr(sc, "master", "") or conf.get("spark.master", ""))
    if master.startswith("local") and not master.startswith("local-cluster"):
        return
    if _dynamic_allocation(conf):
        raise ConfigError(
            "InputMode.SPARK needs a fixed set of executors, but spark.dynamicAllocation.enabled=true: Spark "
            "removes an executor idle for spark.dynamicAllocation.executorIdleTimeout, and with it the TF node "
            "it holds. Start the application with --conf spark.dynamicAllocation.enabled=false (or use "
            "InputMode.TENSORFLOW, whose node tasks keep their executors busy). Received: master="
            f"{master!r}, spark.dynamicAllocation.enabled={conf.get('spark.dynamicAllocation.enabled')!r}"
        )


def _mib(text: object) -> float | None:
    """A Spark memory size (``"2g"``, ``"512m"``, ``"1024"`` = MiB) in MiB; None if unreadable."""
    found = _SIZE.match(str(text))
    return float(found.group(1)) * _MIB_PER_UNIT[found.group(2).lower()] if found else None


def memory_overhead_warning(conf: Any, master: str, spare: bool) -> str:
    """Why an executor's container may be too small for its TF node, or ``""``.

    On YARN and Kubernetes a container holds the executor's JVM heap (``spark.executor.memory``)
    plus ``spark.executor.memoryOverhead`` (default: ``memoryOverheadFactor`` (0.10) of the heap,
    at least 384 MiB) and ``spark.executor.pyspark.memory`` where set; everything else the
    executor runs, a TF node included, must fit in the overhead, or the container is killed
    (YARN's "running beyond physical memory limits", Kubernetes' OOMKilled) with no word of why.
    A node needs :data:`NODE_MEMORY_MIB`, with a spare :data:`SPARE_MEMORY_MIB` more. Standalone
    and local masters impose no such limit: no warning there.
    """
    if not (master.startswith("yarn") or master.startswith("k8s://")):
        return ""
    heap = _mib(conf.get("spark.executor.memory", "1g")) or 1024.0
    given = conf.get("spark.executor.memoryOverhead", None)
    if given is not None:
        overhead = _mib(given)
        if overhead is None:
            return ""  # Spark itself refuses a size it cannot read, naming it
    else:
        try:
            factor = float(conf.get("spark.executor.memoryOverheadFactor", "0.1"))
        except ValueError:
            factor = 0.1
        overhead = max(384.0, factor * heap)
    pyspark = _mib(conf.get("spark.executor.pyspark.memory", "0")) or 0.0
    need = NODE_MEMORY_MIB + (SPARE_MEMORY_MIB if spare else 0)
    if overhead + pyspark >= need:
        return ""
    spare_text = f" and a spare TF process (spare_processes) {SPARE_MEMORY_MIB} MiB" if spare else ""
    return (
        f"each executor's container leaves {overhead + pyspark:.0f} MiB outside the JVM heap "
        f"(spark.executor.memoryOverhead={given if given is not None else f'{overhead:.0f}m (the default)'}"
        f"{f', spark.executor.pyspark.memory={pyspark:.0f}m' if pyspark else ''}), but a TF node needs about "
        f"{NODE_MEMORY_MIB} MiB there{spare_text}: {master} may kill the container. Set --conf "
        f"spark.executor.memoryOverhead={-(-need // 1024)}g (or more for larger models)"
    )


def task_slots(sc: Any) -> int:
    """How many tasks the cluster can run at once right now (what barrier stages need)."""
    jsc = sc._jsc.sc()
    try:
        profile = jsc.resourceProfileManager().defaultResourceProfile()
        return int(jsc.maxNumConcurrentTasks(profile))
    except Exception:  # older or unusual Spark: fall back to registered executors (excluding driver)
        return max(int(jsc.getExecutorMemoryStatus().size()) - 1, int(sc.defaultParallelism))


def wait_for_slots(sc: Any, needed: int, timeout: float) -> int:
    """Wait up to ``timeout`` for ``needed`` task slots; return how many there are."""
    deadline = time.monotonic() + timeout
    slots = task_slots(sc)
    while slots < needed and time.monotonic() < deadline:
        time.sleep(min(0.5, max(deadline - time.monotonic(), 0)))
        slots = task_slots(sc)
    return slots
