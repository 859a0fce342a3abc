"""``SparkClusterResolver``: a TensorFlow cluster resolver that knows the cluster from Spark.

TensorFlow's strategies (``MultiWorkerMirroredStrategy``, ``ParameterServerStrategy``) take a
``tf.distribute.cluster_resolver.ClusterResolver``. ``TFConfigClusterResolver`` reads the
``TF_CONFIG`` variable; this one is made from what tfonspark already knows (the cluster spec,
the task, the node's GPUs), so it also works where no ``TF_CONFIG`` is set: on the driver of a
parameter-server cluster, which holds the ``chief`` task. It resolves exactly as
``TFConfigClusterResolver`` does for the same cluster, except that ``num_accelerators()``
counts the node's assigned GPUs (TF's reads the local devices, which in eager mode match no
task and give ``{}``; ``MultiWorkerMirroredStrategy`` works around that for TF's resolver only).

The class subclasses TensorFlow's ``ClusterResolver``, so it is built on first access of
``SparkClusterResolver`` (PEP 562), which imports TensorFlow; importing this module does not.
Import the module, not the name, where TensorFlow must not load yet (a driver module).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from .tf_config import ALL_ROLES, task_info

__all__ = ["SparkClusterResolver"]


class SparkClusterResolver:
    """A ``tf.distribute.cluster_resolver.ClusterResolver`` for a tfonspark cluster's task.

    In a node, ``ctx.cluster_resolver()`` gives the node's own; the class is for the other
    places that know the cluster (the driver as a parameter-server coordinator, tests).
    ``task_type``, ``task_id`` and ``rpc_layer`` can be set afterwards, as on TF's resolvers.

    Parameters
    ----------
    cluster_spec : Mapping[str, Sequence[str]]
        Job name (``chief``, ``master``, ``worker``, ``ps``, ``evaluator``) -> the tasks'
        ``host:port`` addresses, in task order (a ``tf.train.ClusterSpec`` will do).
    task_type : str
        This process's job, one of ``cluster_spec``'s.
    task_id : int
        This process's index within its job.
    rpc_layer : str
        The protocol the servers speak (``master()``'s scheme); "" for none.
    num_gpus : int
        The GPUs this task was given: ``num_accelerators()`` is ``{"GPU": num_gpus}``, ``{}`` for 0.
    environment : str
        TF's ``environment`` ("" outside Google).

    Raises
    ------
    tfonspark.errors.ConfigError
        An empty or malformed spec, a task type not in it, an index out of range.

    Examples
    --------
    >>> from tfonspark.distribute import SparkClusterResolver
    >>> spec = {"chief": ["10.0.0.1:2222"], "worker": ["10.0.0.2:2222", "10.0.0.3:2222"],
    ...         "ps": ["10.0.0.4:2222"]}
    >>> resolver = SparkClusterResolver(spec, "worker", 1)
    >>> resolver.master(), resolver.master("ps", 0), resolver.num_accelerators()
    ('grpc://10.0.0.3:2222', 'grpc://10.0.0.4:2222', {})
    >>> resolver.cluster_spec().num_tasks("worker")
    2
    >>> strategy = tf.distribute.ParameterServerStrategy(resolver)  # doctest: +SKIP
    """

    def __init__(
        self,
        cluster_spec: Mapping[str, Sequence[str]],
        task_type: str,
        task_id: int,
        rpc_layer: str = "grpc",
        num_gpus: int = 0,
        environment: str = "",
    ) -> None:
        self._jobs = checked_spec(cluster_spec)
        check_task(self._jobs, task_type, task_id)
        if isinstance(num_gpus, bool) or not isinstance(num_gpus, int) or num_gpus < 0:
            raise ConfigError(f"num_gpus must be an integer >= 0. Received: num_gpus={num_gpus!r}")
        if not isinstance(rpc_layer, str):
            raise ConfigError(f"rpc_layer must be a string such as 'grpc' ('' for none). Received: {rpc_layer!r}")
        self._task_type = task_type
        self._task_id = task_id
        self._rpc_layer = rpc_layer
        self._num_gpus = num_gpus
        self._environment = environment

    @classmethod
    def from_tf_config(
        cls, tf_config: str | Mapping[str, Any] | None = None, *, num_gpus: int = 0, rpc_layer: str | None = None
    ) -> SparkClusterResolver:
        """The resolver ``TF_CONFIG`` describes (JSON text or a mapping; default: the variable).

        Parameters
        ----------
        tf_config : str or Mapping, optional
            The ``TF_CONFIG`` document; default: ``$TF_CONFIG``.
        num_gpus : int
            The GPUs this task was given.
        rpc_layer : str, optional
            Default: the document's ``rpc_layer``, else ``"grpc"``.

        Examples
        --------
        >>> from tfonspark.distribute import SparkClusterResolver
        >>> doc = '{"cluster": {"worker": ["a:1", "b:2"], "ps": ["c:3"]}, "task": {"type": "ps", "index": 0}}'
        >>> r = SparkClusterResolver.from_tf_config(doc)
        >>> r.task_type, r.task_id, r.master()
        ('ps', 0, 'grpc://c:3')
        """
        info = task_info(tf_config, roles=ALL_ROLES)
        if info.task_type is None or not info.cluster:
            raise ConfigError(
                f"TF_CONFIG names no cluster and task, so there is nothing to resolve. Received: {tf_config!r}"
            )
        rpc = rpc_layer if rpc_layer is not None else info.rpc_layer or "grpc"
        return cls(info.cluster, info.task_type, info.task_id, rpc_layer=rpc, num_gpus=num_gpus)

    def cluster_spec(self) -> Any:
        """The cluster as a ``tf.train.ClusterSpec`` (a new one per call).

        Examples
        --------
        >>> SparkClusterResolver({"worker": ["a:1", "b:2"]}, "worker", 0).cluster_spec().as_dict()
        {'worker': ['a:1', 'b:2']}
        """
        import tensorflow as tf

        return tf.train.ClusterSpec({job: list(addresses) for job, addresses in self._jobs.items()})

    def master(self, task_type: str | None = None, task_id: int | None = None, rpc_layer: str | None = None) -> str:
        """``rpc_layer://host:port`` of a task (default: this one), "" for a one-task cluster, as TF's.

        Parameters
        ----------
        task_type : str, optional
            Another task's job; default: this resolver's.
        task_id : int, optional
            Another task's index; default: this resolver's.
        rpc_layer : str, optional
            The scheme; default: :attr:`rpc_layer` ("" gives a bare ``host:port``).

        Examples
        --------
        >>> r = SparkClusterResolver({"chief": ["a:1"], "worker": ["b:2"]}, "chief", 0)
        >>> r.master(), r.master("worker", 0, rpc_layer="")
        ('grpc://a:1', 'b:2')
        """
        if sum(len(tasks) for tasks in self._jobs.values()) == 1:
            return ""  # as TFConfigClusterResolver: a lone task has no session master to reach
        job = self._task_type if task_type is None else task_type
        index = self._task_id if task_id is None else task_id
        check_task(self._jobs, job, index)
        scheme = self._rpc_layer if rpc_layer is None else rpc_layer
        address = self._jobs[job][index]
        return f"{scheme}://{address}" if scheme else address

    def num_accelerators(
        self, task_type: str | None = None, task_id: int | None = None, config_proto: Any = None
    ) -> dict[str, int]:
        """``{"GPU": n}`` for the ``num_gpus`` this task was given; ``{}`` without GPUs.

        tfonspark gives every node of a cluster the same GPU request, so the count is returned
        for any task of the cluster (as TF's ``SimpleClusterResolver`` does); the task, when
        given, is checked. ``config_proto`` is accepted for TF's signature and not used.

        Parameters
        ----------
        task_type : str, optional
            A task's job (checked against the spec).
        task_id : int, optional
            A task's index (checked against the spec).
        config_proto : optional
            Unused.

        Examples
        --------
        >>> SparkClusterResolver({"worker": ["a:1"]}, "worker", 0, num_gpus=2).num_accelerators()
        {'GPU': 2}
        """
        del config_proto
        if task_type is not None or task_id is not None:
            job = self._task_type if task_type is None else task_type
            check_task(self._jobs, job, self._task_id if task_id is None else task_id)
        return {"GPU": self._num_gpus} if self._num_gpus else {}

    @property
    def task_type(self) -> str:
        """This process's job, e.g. ``resolver.task_type == "ps"``; settable to another of the spec's."""
        return self._task_type

    @task_type.setter
    def task_type(self, task_type: str) -> None:
        check_task(self._jobs, task_type, None)  # the index is checked when set, or used
        self._task_type = task_type

    @property
    def task_id(self) -> int:
        """This process's index within its job, e.g. ``resolver.task_id == 0``; settable."""
        return self._task_id

    @task_id.setter
    def task_id(self, task_id: int) -> None:
        check_task(self._jobs, self._task_type, task_id)
        self._task_id = task_id

    @property
    def rpc_layer(self) -> str:
        """The servers' protocol, ``master()``'s scheme: ``resolver.rpc_layer == "grpc"``; settable."""
        return self._rpc_layer

    @rpc_layer.setter
    def rpc_layer(self, rpc_layer: str) -> None:
        self._rpc_layer = rpc_layer

    @property
    def environment(self) -> str:
        """TF's ``environment``: ``resolver.environment == ""`` outside Google."""
        return self._environment

    def __repr__(self) -> str:
        return (
            f"SparkClusterResolver({self._jobs!r}, task_type={self._task_type!r}, task_id={self._task_id}, "
            f"rpc_layer={self._rpc_layer!r}, num_gpus={self._num_gpus})"
        )


def checked_spec(cluster_spec: Any) -> dict[str, tuple[str, ...]]:
    """``cluster_spec`` (a mapping or a ``tf.train.ClusterSpec``) as job -> addresses, checked."""
    raw = cluster_spec.as_dict() if hasattr(cluster_spec, "as_dict") else cluster_spec
    if not isinstance(raw, Mapping) or not raw:
        raise ConfigError(
            "cluster_spec must be a non-empty mapping of job name -> 'host:port' addresses, e.g. "
            f"{{'worker': ['10.0.0.1:2222']}}. Received: {cluster_spec!r}"
        )
    jobs: dict[str, tuple[str, ...]] = {}
    for job, addresses in raw.items():
        if job not in ALL_ROLES:
            raise ConfigError(
                f"cluster_spec job {job!r} is not a TensorFlow task type (valid: {', '.join(ALL_ROLES)}). "
                f"Received: jobs={sorted(map(str, raw))}"
            )
        jobs[job] = _addresses(job, addresses)
    return jobs


def _addresses(job: str, addresses: Any) -> tuple[str, ...]:
    """One job's addresses: a non-empty sequence of ``host:port`` strings."""
    if isinstance(addresses, (str, bytes)) or not isinstance(addresses, Sequence) or not addresses:
        raise ConfigError(
            f"cluster_spec[{job!r}] must be a non-empty list of 'host:port' strings. Received: {addresses!r}"
        )
    for address in addresses:
        host, _, port = address.rpartition(":") if isinstance(address, str) else ("", "", "")
        if not host or not port.isdigit():
            raise ConfigError(
                f"cluster_spec[{job!r}] holds {address!r}, which is not a 'host:port' address. "
                f"Received: {list(addresses)!r}"
            )
    return tuple(addresses)


def check_task(jobs: Mapping[str, Sequence[str]], task_type: Any, task_id: Any) -> None:
    """Raise ConfigError unless ``task_type:task_id`` is a task of ``jobs`` (None: any index)."""
    if not isinstance(task_type, str) or task_type not in jobs:
        raise ConfigError(
            f"task_type {task_type!r} is not a job of the cluster spec (valid: {', '.join(jobs)}). "
            f"Received: task_type={task_type!r}"
        )
    if task_id is None:
        return
    count = len(jobs[task_type])
    if isinstance(task_id, bool) or not isinstance(task_id, int) or not 0 <= task_id < count:
        raise ConfigError(
            f"task_id must be an integer in 0..{count - 1} ({task_type!r} has {count} task(s)). "
            f"Received: task_id={task_id!r}"
        )


_BODY: type = SparkClusterResolver
if not TYPE_CHECKING:
    # At run time the name is the TF subclass, built on first access by __getattr__ below; the
    # class above is its body (type checkers see the class itself, which has the same members).
    del SparkClusterResolver

_lock = threading.Lock()


def __getattr__(name: str) -> Any:
    """Build ``SparkClusterResolver`` on first access: it needs TensorFlow's base class (PEP 562)."""
    if name != "SparkClusterResolver":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    with _lock:
        built = globals().get(name)
        if built is None:
            built = globals()[name] = _subclass_of_tf(_BODY)
    return built


def _subclass_of_tf(body: type) -> type:
    """A real ``tf.distribute.cluster_resolver.ClusterResolver`` subclass with ``body``'s members."""
    import tensorflow as tf

    base = tf.distribute.cluster_resolver.ClusterResolver
    namespace = {k: v for k, v in vars(body).items() if k not in ("__dict__", "__weakref__")}
    built: type = type(base)(body.__name__, (base,), namespace)
    return built
