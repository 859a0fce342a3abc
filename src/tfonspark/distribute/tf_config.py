"""``TF_CONFIG``, written and read in one place: pure functions, no TensorFlow import.

``TF_CONFIG`` is the JSON document every tfonspark node process gets, e.g.::

    {"cluster": {"chief": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2223"]},
     "task": {"type": "worker", "index": 0}, "environment": "cloud"}

The supervisor writes it (:func:`build_tf_config`) into the TF process's environment;
TensorFlow's ``TFConfigClusterResolver`` and :func:`task_info` read it. Only ``chief`` and
``worker`` tasks take part in ``MultiWorkerMirroredStrategy``; an ``evaluator`` task may be
listed (it runs on its own). Without ``TF_CONFIG`` the process is a single worker and its own
chief. The supervisor imports this module in a Spark Python worker, so it must stay free of
TensorFlow and Keras (a unit test checks).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError

__all__ = [
    "ALL_ROLES",
    "MWMS_ROLES",
    "TF_CONFIG_ENV",
    "TaskInfo",
    "build_tf_config",
    "is_chief",
    "load_tf_config",
    "task_info",
]

TF_CONFIG_ENV = "TF_CONFIG"
_TRAINING_ROLES = ("chief", "worker")
#: the task types a ``MultiWorkerMirroredStrategy`` cluster may list (:func:`task_info`'s default)
MWMS_ROLES = (*_TRAINING_ROLES, "evaluator")
#: every task type a tfonspark cluster may hold: TFoS's ``master`` and the parameter servers too
ALL_ROLES = ("chief", "master", "worker", "ps", "evaluator")


@dataclass(frozen=True)
class TaskInfo:
    """This process's place in the cluster, as ``TF_CONFIG`` describes it."""

    task_type: str | None
    task_id: int
    cluster: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: ``TF_CONFIG``'s optional ``rpc_layer`` (e.g. ``"grpc"``); "" when it names none
    rpc_layer: str = ""

    @property
    def training_tasks(self) -> list[str]:
        """The tasks that train together, ``chief:0, worker:0, ...``, in a fixed order (the chief first)."""
        return [f"{role}:{i}" for role in _TRAINING_ROLES for i in range(len(self.cluster.get(role, ())))]

    @property
    def num_workers(self) -> int:
        """How many processes train together (chief and workers); 1 without a cluster."""
        return max(1, len(self.training_tasks))

    @property
    def is_chief(self) -> bool:
        """Whether this process writes checkpoints and exports (see :func:`is_chief`)."""
        return is_chief(self.task_type, self.task_id, self.cluster)


def build_tf_config(cluster_spec: Mapping[str, Sequence[str]], job_name: str, task_index: int) -> str:
    """The ``TF_CONFIG`` JSON for one node, as ``TFConfigClusterResolver`` and :func:`task_info` read it."""
    if job_name not in cluster_spec or not 0 <= task_index < len(cluster_spec[job_name]):
        raise ConfigError(
            f"task {job_name}:{task_index} is not in the cluster spec. Received: jobs={sorted(cluster_spec)}"
        )
    return json.dumps(
        {
            "cluster": {job: list(hosts) for job, hosts in cluster_spec.items()},
            "task": {"type": job_name, "index": task_index},
            "environment": "cloud",
        }
    )


def is_chief(task_type: str | None, task_id: int, cluster: Mapping[str, Any]) -> bool:
    """The chief is the ``chief`` task, else ``worker`` 0 when the cluster has no chief.

    A process without a task type (no ``TF_CONFIG``) is alone and therefore chief.
    """
    if task_type is None or task_type == "chief":
        return True
    return task_type == "worker" and task_id == 0 and not cluster.get("chief")


def task_info(tf_config: str | Mapping[str, Any] | None = None, *, roles: Sequence[str] = MWMS_ROLES) -> TaskInfo:
    """Parse ``tf_config`` (JSON text or a mapping; default: the ``TF_CONFIG`` variable).

    ``roles`` are the task types the cluster may list: those of MWMS by default, :data:`ALL_ROLES`
    for a parameter-server cluster (:class:`~tfonspark.distribute.resolver.SparkClusterResolver`).
    Raises :class:`~tfonspark.errors.ConfigError` naming the bad field when the document is
    malformed, so that a broken launch fails before any TensorFlow work starts.
    """
    if tf_config is None:
        tf_config = os.environ.get(TF_CONFIG_ENV, "")
    config = load_tf_config(tf_config)
    if not config:
        return TaskInfo(task_type=None, task_id=0, cluster={})
    cluster = _cluster(config.get("cluster", {}), roles)
    task = config.get("task", {})
    if not isinstance(task, Mapping):
        raise ConfigError(f"TF_CONFIG 'task' must be an object. Received: task={task!r}")
    task_type = task.get("type")
    if task_type is None:
        if cluster:
            raise ConfigError(f"TF_CONFIG has a cluster but no task type. Received: task={dict(task)!r}")
        return TaskInfo(task_type=None, task_id=0, cluster=cluster)
    task_id = _task_index(task.get("index", 0))
    if cluster and len(cluster.get(task_type, ())) <= task_id:
        raise ConfigError(
            f"TF_CONFIG task {task_type}:{task_id} is not in the cluster. Received: cluster={dict(cluster)!r}"
        )
    rpc_layer = str(config.get("rpc_layer") or "")
    return TaskInfo(task_type=str(task_type), task_id=task_id, cluster=cluster, rpc_layer=rpc_layer)


def load_tf_config(tf_config: str | Mapping[str, Any]) -> Mapping[str, Any]:
    """JSON text or a mapping to a mapping; empty text means no cluster (``{}``).

    Raises ConfigError naming what was received when the text is not a JSON object.
    """
    if isinstance(tf_config, Mapping):
        return tf_config
    if not tf_config.strip():
        return {}
    try:
        config = json.loads(tf_config)
    except json.JSONDecodeError as err:
        raise ConfigError(f"TF_CONFIG is not valid JSON ({err}). Received: {tf_config!r}") from err
    if not isinstance(config, Mapping):
        raise ConfigError(f"TF_CONFIG must be a JSON object. Received: {tf_config!r}")
    return config


def _cluster(raw: Any, roles: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """Validate the ``cluster`` object: ``roles`` mapping to lists of ``host:port``."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"TF_CONFIG 'cluster' must be an object. Received: cluster={raw!r}")
    cluster: dict[str, tuple[str, ...]] = {}
    for role, addresses in raw.items():
        if role not in roles:
            strategy = " by MultiWorkerMirroredStrategy" if tuple(roles) == MWMS_ROLES else ""
            raise ConfigError(
                f"TF_CONFIG role {role!r} is not supported{strategy} "
                f"(valid: {', '.join(roles)}). Received: cluster={dict(raw)!r}"
            )
        if isinstance(addresses, str) or not all(isinstance(a, str) for a in addresses):
            raise ConfigError(
                f"TF_CONFIG cluster[{role!r}] must be a list of 'host:port' strings. Received: {addresses!r}"
            )
        cluster[role] = tuple(addresses)
    return cluster


def _task_index(raw: Any) -> int:
    """The task index as a non-negative int (JSON may carry it as a string)."""
    try:
        index = int(raw)
    except (TypeError, ValueError):
        index = -1
    if index < 0:
        raise ConfigError(f"TF_CONFIG task index must be an integer >= 0. Received: index={raw!r}")
    return index
