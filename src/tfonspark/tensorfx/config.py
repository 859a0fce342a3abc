"""``Configuration``: this process's place in the training cluster, read from ``TF_CONFIG``.

TensorFX's ``Configuration`` in TF 2 terms. ``TF_CONFIG`` (written by tfonspark's supervisor
on every node, or by any other launcher) gives the cluster and the task; its optional ``job``
object (the hosting service's job description in TensorFX) and ``environment`` are kept as
they are. ``create_device_setter`` keeps its name but not its TF 1 meaning: there is no
``replica_device_setter`` in TF 2; placement is a distribution strategy's, so it returns the
strategy's scope, under which the model must be built and compiled:

* a cluster of ``chief``/``worker`` (and ``evaluator``) tasks: ``MultiWorkerMirroredStrategy``
  (:func:`tfonspark.distribute.strategy`, the process's one MWMS);
* a single process (no ``TF_CONFIG``): TensorFlow's default strategy;
* a cluster with ``ps`` tasks: ``ParameterServerStrategy``, which only its *coordinator* (the
  chief) creates; ps and worker tasks serve it with ``create_server().join()``
  (:func:`tfonspark.driver.services.ps.ps_cluster` and ``run(..., coordinator=True)`` arrange that).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from ..distribute.tf_config import ALL_ROLES, TF_CONFIG_ENV, is_chief, load_tf_config, task_info
from ..errors import ConfigError

__all__ = ["Configuration", "Task"]


@dataclass(frozen=True)
class Task:
    """A task of the cluster: its role (``type``: chief, worker, ps ...) and ``index``."""

    type: str
    index: int


class Configuration:
    """Where this process trains: its task, the cluster (None for one process), the job.

    Parameters
    ----------
    task : Task or Mapping, optional
        ``{"type": ..., "index": ...}``; None for a single process (its own chief).
    cluster : Mapping, optional
        Role -> list of ``host:port``; None for a single process.
    job : Mapping, optional
        ``TF_CONFIG``'s ``job`` object (the job's own arguments); ``{}`` when absent.
    env : str
        ``TF_CONFIG``'s ``environment`` (``"cloud"`` in a tfonspark node), ``"local"`` alone.

    Examples
    --------
    >>> config = Configuration({"type": "worker", "index": 1}, {"chief": ["a:1"], "worker": ["b:2", "c:3"]})
    >>> config.task.type, config.task.index, config.master, config.worker, config.distributed
    ('worker', 1, False, True, True)
    """

    def __init__(
        self,
        task: Task | Mapping[str, Any] | None = None,
        cluster: Mapping[str, Any] | None = None,
        job: Mapping[str, Any] | None = None,
        env: str = "local",
    ) -> None:
        document: dict[str, Any] = {}
        if cluster:
            document["cluster"] = {role: list(addresses) for role, addresses in cluster.items()}
        if task is not None:
            document["task"] = {"type": task.type, "index": task.index} if isinstance(task, Task) else dict(task)
        if document.get("task", {}).get("type", "chief") not in ALL_ROLES:
            raise ConfigError(
                f"TF_CONFIG task role {document['task']['type']!r} is not supported "
                f"(valid: {', '.join(ALL_ROLES)}). Received: task={document['task']!r}"
            )
        info = task_info(document, roles=ALL_ROLES) if document else None
        self._cluster = dict(info.cluster) if info is not None and info.cluster else None
        if info is None or info.task_type is None:
            self._task = Task("chief", 0)
        else:
            self._task = Task(info.task_type, info.task_id)
        self._job = dict(job or {})
        self._env = env

    @classmethod
    def environment(cls) -> Configuration:
        """The configuration ``TF_CONFIG`` describes; a single process without it.

        Returns
        -------
        Configuration
            Task, cluster, ``job`` and ``environment`` from ``TF_CONFIG``.

        Raises
        ------
        ConfigError
            When ``TF_CONFIG`` is malformed or names an unknown role (the error names the role
            and the valid ones).

        Examples
        --------
        >>> import os
        >>> os.environ["TF_CONFIG"] = '{"cluster": {"chief": ["a:1"]}, "task": {"type": "chief", "index": 0}}'
        >>> Configuration.environment().master
        True
        >>> del os.environ["TF_CONFIG"]
        """
        text = os.environ.get(TF_CONFIG_ENV, "").strip()
        if not text:
            return cls.local()
        document = load_tf_config(text)
        task_info(document, roles=ALL_ROLES)  # every field checked, the role named if unknown
        return cls(
            document.get("task"),
            document.get("cluster") or None,
            document.get("job") or {},
            str(document.get("environment") or "cloud"),
        )

    @classmethod
    def local(cls) -> Configuration:
        """A single process: no cluster, its own chief.

        Returns
        -------
        Configuration
            ``task`` is ``chief:0``, ``cluster`` None, ``distributed`` False.

        Examples
        --------
        >>> Configuration.local().distributed
        False
        """
        return cls(None, None, {}, "local")

    @property
    def cluster(self) -> dict[str, tuple[str, ...]] | None:
        """Role -> addresses of the cluster holding this process; None for a single process."""
        return None if self._cluster is None else dict(self._cluster)

    @property
    def task(self) -> Task:
        """This process's task (``.type``, ``.index``); ``chief:0`` for a single process."""
        return self._task

    @property
    def job(self) -> dict[str, Any]:
        """``TF_CONFIG``'s ``job`` object: the job's own description (``{}`` when absent)."""
        return dict(self._job)

    @property
    def env(self) -> str:
        """``TF_CONFIG``'s ``environment`` (``"cloud"`` on a tfonspark node), ``"local"`` alone."""
        return self._env

    @property
    def distributed(self) -> bool:
        """Whether more than one process trains (a cluster of two or more tasks)."""
        return self._cluster is not None and sum(len(a) for a in self._cluster.values()) > 1

    @property
    def master(self) -> bool:
        """Whether this task is the chief: ``chief`` (TFoS: ``master``), or ``worker`` 0 without one."""
        cluster = self._cluster or {}
        return self._task.type == "master" or is_chief(self._task.type, self._task.index, cluster)

    @property
    def param_server(self) -> bool:
        """Whether this task is a parameter server (``ps``)."""
        return self._task.type == "ps"

    @property
    def worker(self) -> bool:
        """Whether this task is a ``worker`` (the chief is not, even when it trains too)."""
        return self._task.type == "worker"

    @property
    def device(self) -> Any:
        """This task's ``tf.DeviceSpec``: ``/job:<type>/replica:0/task:<index>`` (``localhost`` alone)."""
        import tensorflow as tf

        if self._cluster is None:
            return tf.DeviceSpec(job="localhost", replica=0, task=0)
        return tf.DeviceSpec(job=self._task.type, replica=0, task=self._task.index)

    def create_server(self) -> Any:
        """Start this task's ``tf.distribute.Server``; None for a single process (it needs none).

        Parameter servers and the workers of a ``ParameterServerStrategy`` cluster serve with
        ``config.create_server().join()``; ``MultiWorkerMirroredStrategy`` starts its own. On a
        tfonspark node the server takes over the port the supervisor reserved.

        Returns
        -------
        tf.distribute.Server or None
            The started server.

        Examples
        --------
        >>> Configuration.local().create_server() is None
        True
        """
        if self._cluster is None:
            return None
        import tensorflow as tf

        spec = tf.train.ClusterSpec({role: list(addresses) for role, addresses in self._cluster.items()})
        return tf.distribute.Server(spec, job_name=self._task.type, task_index=self._task.index, start=True)

    def create_strategy(self) -> Any:
        """The distribution strategy this task trains under (see the module docstring).

        Returns
        -------
        tf.distribute.Strategy
            MWMS for a chief/worker cluster, the default strategy alone, PSS on a PS
            cluster's chief.

        Raises
        ------
        ConfigError
            On a ps or worker task of a parameter-server cluster (they serve, see
            :meth:`create_server`) and on an evaluator (it trains nothing).

        Examples
        --------
        >>> Configuration.local().create_strategy()  # doctest: +ELLIPSIS
        <tensorflow.python.distribute.distribute_lib._DefaultDistributionStrategy object at ...>
        """
        import tensorflow as tf

        if self._cluster is None:
            return tf.distribute.get_strategy()
        if self._task.type == "evaluator":
            raise ConfigError("an evaluator task trains nothing: it has no strategy. Received: task evaluator")
        if "ps" in self._cluster:
            return self._ps_strategy()
        from ..distribute.strategies import strategy

        return strategy()

    def _ps_strategy(self) -> Any:
        """ParameterServerStrategy, for the coordinator (the chief) only."""
        if not self.master:
            raise ConfigError(
                f"task {self._task.type}:{self._task.index} of a parameter-server cluster does not "
                "train: it serves the coordinator with config.create_server().join(). Only the "
                "chief creates ParameterServerStrategy."
            )
        import tensorflow as tf

        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        return tf.distribute.ParameterServerStrategy(resolver)

    def create_device_setter(self, args: Any = None) -> AbstractContextManager[Any]:
        """TF 2's device setter: the scope of :meth:`create_strategy`, for building the model.

        In TF 1 it assigned variables to ps tasks and ops to this worker; in TF 2 the strategy
        places both, and a model built and compiled under its scope is distributed.

        Parameters
        ----------
        args : ModelArguments, optional
            The job's arguments (kept for TensorFX's signature; placement does not use them).

        Returns
        -------
        contextlib.AbstractContextManager
            ``strategy.scope()``.

        Examples
        --------
        >>> with Configuration.local().create_device_setter():  # doctest: +SKIP
        ...     model = build_and_compile()
        """
        del args
        scope: AbstractContextManager[Any] = self.create_strategy().scope()
        return scope

    def __repr__(self) -> str:
        return f"Configuration(task={self._task.type}:{self._task.index}, cluster={self._cluster!r}, env={self._env!r})"
