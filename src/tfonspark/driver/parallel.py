"""Independent TF instances on executors, no cluster between them (TFoS ``TFParallel.run``).

Each instance runs ``map_fn(tf_args, ctx)`` inside its Spark task; there is no TF cluster
between them. Asking for more instances than the cluster has task slots is an immediate error
instead of a barrier stage that waits forever.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import ConfigError
from ..fs import default_fs as fs_default
from ..tfprocess.context import NodeContext
from ..tfprocess.hints import hint_for
from .jobs import wait_for_slots

__all__ = ["run"]


def run(
    sc: Any,
    map_fn: Callable[[Any, Any], Any],
    tf_args: Any,
    num_executors: int,
    use_barrier: bool = True,
    *,
    reservation_timeout: float = 60,
) -> list[Any]:
    """Run ``num_executors`` instances of ``map_fn`` in parallel; return their return values.

    A fresh SparkContext's executors register over some seconds: the task slots are counted once
    enough have registered, or after ``reservation_timeout`` seconds (as ``TFCluster.run`` waits).
    """
    if not isinstance(num_executors, int) or num_executors < 1:
        raise ConfigError(f"num_executors must be a positive integer. Received: {num_executors!r}")
    slots = wait_for_slots(sc, num_executors, reservation_timeout)
    if num_executors > slots:
        raise ConfigError(
            f"TFParallel.run asked for {num_executors} instances but the cluster has {slots} task "
            f"slots after waiting reservation_timeout={reservation_timeout:g}s; lower num_executors or add "
            "executors (spark.executor.instances, spark.executor.cores, spark.cores.max, or N in local[N])"
        )
    default_fs = fs_default(sc)

    def _run(index: int, _: Iterator[Any]) -> Iterator[Any]:
        if use_barrier:
            from pyspark import BarrierTaskContext

            BarrierTaskContext.get().barrier()
        ctx = NodeContext(
            executor_id=index,
            job_name="worker",
            task_index=index,
            cluster_spec={"worker": [f"instance-{i}" for i in range(num_executors)]},
            default_fs=default_fs,
            working_dir=os.getcwd(),
        )
        try:
            result = map_fn(tf_args, ctx)
        except Exception as exc:
            hint = hint_for(exc)
            if hint and hasattr(exc, "add_note"):  # Python >= 3.11: the note ends the traceback text
                exc.add_note(f"Hint: {hint}")
            raise
        yield result

    rdd = sc.parallelize(range(num_executors), num_executors)
    results: list[Any] = (rdd.barrier() if use_barrier else rdd).mapPartitionsWithIndex(_run).collect()
    return results
