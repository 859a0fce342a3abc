"""Independent TF instances on executors, no cluster between them (TFoS ``TFParallel.run``).

Each instance runs ``map_fn(tf_args, ctx)`` inside its Spark task; there is no TF cluster
between them. Asking for more instances than the cluster has task slots is an immediate error
instead of a barrier stage that waits forever. GPUs are given as for cluster nodes
(:mod:`tfonspark.executor.gpus`: the task's Spark GPUs, else nvidia-smi's free ones, narrowed
by ``tf_args.num_gpus``) through ``CUDA_VISIBLE_DEVICES``, which is restored after ``map_fn``:
the Spark Python worker runs other tasks afterwards. As in TFoS, it only takes effect if
TensorFlow was not yet initialised in that worker. Each task first checks its executor's
tfonspark, as a node task does (:mod:`tfonspark.executor.preflight`): an executor Python without
it, or with another version, is an ``ExecutorEnvironmentError`` naming that Python, not Spark's
retries of a failing unpickle.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

from ..config import this_version
from ..errors import ConfigError
from ..executor.gpus import assign, cuda_env, requested_gpus, spark_addresses
from ..executor.preflight import guarded
from ..fs import default_fs as fs_default
from ..tfprocess.context import NodeContext
from ..tfprocess.hints import hint_for
from .jobs import wait_for_slots
from .nodes import environment

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
    num_gpus = requested_gpus(tf_args)  # on the driver: unpickling tf_args on an executor may import TF

    def _run(items: Iterator[Any]) -> Iterator[Any]:
        index = next(iter(items))  # partition i of parallelize(range(n), n) holds i
        hosts: list[str] = []
        if use_barrier:
            from pyspark import BarrierTaskContext

            barrier = BarrierTaskContext.get()
            barrier.barrier()
            hosts = [info.address for info in barrier.getTaskInfos()]
        gpus = _instance_gpus(index, num_executors, hosts, num_gpus)
        with _cuda_environment(gpus):
            yield _call(map_fn, tf_args, index, num_executors, default_fs, gpus)

    from pyspark import cloudpickle

    version = this_version()
    # the executor checks its tfonspark before it unpickles the instances (executor/preflight.py)
    task = guarded(cloudpickle.dumps(_run), version, barrier=use_barrier)  # type: ignore[no-untyped-call]
    rdd = sc.parallelize(range(num_executors), num_executors)
    results: list[Any] = (rdd.barrier() if use_barrier else rdd).mapPartitions(task).collect()
    environment.check(results, sc, version)  # an executor Python without tfonspark, or another one
    return results


def _instance_gpus(index: int, count: int, hosts: list[str], num_gpus: int | None) -> list[str]:
    """This instance's GPUs: its task's Spark GPUs, else its turn among the instances on its host."""
    from pyspark import TaskContext

    task = TaskContext.get()
    spark = spark_addresses(task.resources() if task is not None else {})
    # barrier tasks know each instance's executor (host:port); otherwise, as in TFoS, the index decides
    spec = {"worker": hosts if len(hosts) == count else [f"instance:{i}" for i in range(count)]}
    return assign(spark, num_gpus, spec, "worker", index, os.environ)


@contextlib.contextmanager
def _cuda_environment(gpus: list[str]) -> Iterator[None]:
    """``CUDA_VISIBLE_DEVICES`` (and its order) for ``gpus`` while ``map_fn`` runs, then as before."""
    changes = cuda_env(gpus, os.environ)
    before = {name: os.environ.get(name) for name in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _call(
    map_fn: Callable[[Any, Any], Any], tf_args: Any, index: int, count: int, default_fs: str, gpus: list[str]
) -> Any:
    """``map_fn(tf_args, ctx)`` for instance ``index``; a known TFoS-era failure gets a hint."""
    ctx = NodeContext(
        executor_id=index,
        job_name="worker",
        task_index=index,
        cluster_spec={"worker": [f"instance-{i}" for i in range(count)]},
        default_fs=default_fs,
        working_dir=os.getcwd(),
        gpus=gpus,
    )
    try:
        return map_fn(tf_args, ctx)
    except Exception as exc:
        hint = hint_for(exc)
        if hint and hasattr(exc, "add_note"):  # Python >= 3.11: the note ends the traceback text
            exc.add_note(f"Hint: {hint}")
        raise
