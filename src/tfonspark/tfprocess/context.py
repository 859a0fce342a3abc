"""The context object handed to ``map_fun(args, ctx)`` in every TF process (TFoS-compatible).

The TFoS helpers it offers (``start_cluster_server``, ``export_saved_model``) are implemented in
the core (:mod:`.server`, :mod:`tfonspark.distribute.checkpoint`); ``tfonspark.TFNode`` re-exports
them for TFoS programs, never the other way round.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..fs import qualify
from ..ports import PortHandover, hand_over_port
from .data_worker import distribute
from .report import report_payload
from .server import start_cluster_server as _start_cluster_server

if TYPE_CHECKING:
    from ..config import NodeConfig
    from ..distribute.resolver import SparkClusterResolver

__all__ = ["NodeContext", "hdfs_path"]

_report_log = logging.getLogger("tfonspark.report")


def hdfs_path(ctx: Any, path: str) -> str:
    """Resolve ``path`` against the cluster's default filesystem, as TFoS does (:func:`tfonspark.fs.qualify`).

    A path with a scheme is kept; an absolute path gets ``defaultFS``; a relative path goes under
    the working directory for ``file://`` and under ``/user/<user>/`` for hdfs and viewfs.
    Same as ``ctx.absolute_path(path)``.

    Parameters
    ----------
    ctx : NodeContext
        The ``ctx`` of ``map_fun(args, ctx)``: its ``defaultFS`` (the driver's Hadoop
        ``fs.defaultFS``) and ``working_dir`` (the node's working directory) are used.
    path : str
        A path or URI, e.g. from the command line.

    Returns
    -------
    str
        The fully qualified URI.

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> ctx = SimpleNamespace(defaultFS="hdfs://nn:8020", working_dir="/home/me/job")  # as a NodeContext
    >>> hdfs_path(ctx, "/data/mnist")
    'hdfs://nn:8020/data/mnist'
    >>> hdfs_path(ctx, "s3://bucket/model")
    's3://bucket/model'
    >>> hdfs_path(SimpleNamespace(defaultFS="file://", working_dir="/home/me/job"), "out/model")
    'file:///home/me/job/out/model'
    """
    return qualify(path, default_fs=str(ctx.defaultFS), working_dir=str(ctx.working_dir), tfos=True)


def _visible_gpus() -> list[str]:
    """``CUDA_VISIBLE_DEVICES`` as a list; CUDA stops at the first invalid entry (``-1`` hides all)."""
    out = []
    for item in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(","):
        if not item.strip() or item.strip().startswith("-"):
            break
        out.append(item.strip())
    return out


class NodeContext:
    """Who this node is in the cluster, where its data comes from, and TFoS helpers.

    ``map_fun(args, ctx)`` gets one, made by the node's TF process (:meth:`in_cluster`); tests
    and ``TFParallel`` make their own. ``ctx.tensorboard_url`` (the chief's TensorBoard, or "")
    and ``ctx.attempt`` (0 on the cluster's first start, n after the driver restarted it n times:
    resume from the last checkpoint when it is > 0) are set after construction.

    Parameters
    ----------
    executor_id : int
        The Spark executor this node runs on (TFoS's ``worker_num``).
    job_name : str
        The node's TF job: ``chief``, ``worker``, ``ps`` or ``evaluator``.
    task_index : int
        The node's index within its job.
    cluster_spec : dict
        TF's cluster spec, job name -> ``host:port`` addresses.
    default_fs : str
        The driver's Hadoop ``fs.defaultFS`` (``ctx.defaultFS``).
    working_dir : str
        The node's working directory.
    mgr : FeedServer, optional
        The node's feed server (TFoS's manager), read by :meth:`get_data_feed`.
    tmp_socket : socket.socket, optional
        The socket that holds the node's reserved TF port until :meth:`release_port`.
    reporter : callable, optional
        Sends :meth:`report`'s metrics to the driver; None logs them.
    gpus : sequence of str, optional
        The node's GPU addresses; default: its ``CUDA_VISIBLE_DEVICES``.

    Examples
    --------
    >>> ctx = NodeContext(executor_id=1, job_name="worker", task_index=1, cluster_spec={"worker": ["a:1", "b:2"]},
    ...                   default_fs="file://", working_dir="/tmp", gpus=[])
    >>> ctx.num_workers, ctx.is_chief
    (2, False)
    """

    def __init__(
        self,
        *,
        executor_id: int,
        job_name: str,
        task_index: int,
        cluster_spec: dict[str, list[str]],
        default_fs: str,
        working_dir: str,
        mgr: Any = None,
        tmp_socket: socket.socket | None = None,
        reporter: Callable[[dict[str, Any]], None] | None = None,
        gpus: Sequence[str] | None = None,
    ) -> None:
        self.executor_id = executor_id
        self.worker_num = executor_id
        self.job_name = job_name
        self.task_index = task_index
        self.cluster_spec = cluster_spec
        self.num_workers = sum(len(v) for k, v in cluster_spec.items() if k in ("chief", "master", "worker"))
        self.defaultFS = default_fs
        self.working_dir = working_dir
        self.mgr = mgr
        self.tmp_socket = tmp_socket
        self._handover: PortHandover | None = None  # the reserved port, until its server binds it
        self.tensorboard_url = ""  #: the chief's TensorBoard, set once it runs
        self._reporter = reporter
        #: the GPU addresses this node's TF process was given (its ``CUDA_VISIBLE_DEVICES`` unless
        #: passed in); [] = the CPU. Chosen by the supervisor (docs/gpus.md).
        self.gpus: list[str] = list(gpus) if gpus is not None else _visible_gpus()
        #: 0 on the cluster's first start, n after the driver restarted it n times (``max_restarts``):
        #: resume from the last checkpoint when it is > 0
        self.attempt = 0
        #: the tf.data service's dispatcher, ``"grpc://host:port"``, when the cluster was started
        #: with ``run(..., data_service=N)``; None without one (:meth:`distribute_dataset`)
        self.data_service: str | None = None
        self._data_jobs = 0  # distribute_dataset calls so far: the default job names

    @classmethod
    def in_cluster(
        cls,
        config: NodeConfig,
        placement: Mapping[str, Any],
        *,
        mgr: Any = None,
        tmp_socket: socket.socket | None = None,
        reporter: Callable[[dict[str, Any]], None] | None = None,
    ) -> NodeContext:
        """The context of a node of a cluster: from its ``NodeConfig`` and its place in the cluster.

        Parameters
        ----------
        config : NodeConfig
            What the driver sent every node (``default_fs``, ``attempt``).
        placement : Mapping
            The node's ``executor_id``, ``job_name``, ``task_index``, ``cluster_spec`` and
            ``working_dir`` (the supervisor's header).
        mgr : FeedServer, optional
            As for :class:`NodeContext`.
        tmp_socket : socket.socket, optional
            As for :class:`NodeContext`.
        reporter : callable, optional
            As for :class:`NodeContext`.

        Examples
        --------
        >>> from tfonspark.config import NodeConfig
        >>> config = NodeConfig("c1", "127.0.0.1", 1, "ab" * 32, attempt=2)
        >>> place = {"executor_id": 0, "job_name": "chief", "task_index": 0,
        ...          "cluster_spec": {"chief": ["a:1"]}, "working_dir": "/tmp"}
        >>> ctx = NodeContext.in_cluster(config, place)
        >>> ctx.attempt, ctx.is_chief
        (2, True)
        """
        ctx = cls(
            executor_id=placement["executor_id"],
            job_name=placement["job_name"],
            task_index=placement["task_index"],
            cluster_spec=placement["cluster_spec"],
            default_fs=config.default_fs,
            working_dir=placement["working_dir"],
            mgr=mgr,
            tmp_socket=tmp_socket,
            reporter=reporter,
        )
        ctx.attempt = config.attempt
        ctx.data_service = config.data_service
        return ctx

    @property
    def is_chief(self) -> bool:
        """True on the chief/master, or on worker 0 when the cluster has no chief.

        Examples
        --------
        >>> NodeContext(executor_id=0, job_name="worker", task_index=0, cluster_spec={"worker": ["a:1"]},
        ...             default_fs="file://", working_dir="/tmp", gpus=[]).is_chief
        True
        """
        if self.job_name in ("chief", "master"):
            return True
        has_chief = any(k in self.cluster_spec for k in ("chief", "master"))
        return self.job_name == "worker" and self.task_index == 0 and not has_chief

    def absolute_path(self, path: str) -> str:
        """``path`` resolved against the cluster's default filesystem: :func:`hdfs_path` (TFoS).

        Parameters
        ----------
        path : str
            A path or URI.

        Examples
        --------
        >>> ctx = NodeContext(executor_id=0, job_name="worker", task_index=0, cluster_spec={},
        ...                   default_fs="hdfs://nn:8020", working_dir="/home/me", gpus=[])
        >>> ctx.absolute_path("/data/mnist")
        'hdfs://nn:8020/data/mnist'
        """
        return hdfs_path(self, path)

    def release_port(self, *, now: bool = False) -> None:
        """Give the port reserved for this node to its TF server (``release_port=False`` clusters
        call it themselves, as in TFoS; otherwise the node does before ``map_fun``).

        The port stays held until the server binds it: the first TF server this process starts
        (``tf.distribute.Server``, ``MultiWorkerMirroredStrategy``, ``connect_to_cluster``) or a
        Python ``bind()`` of the port takes it as it binds. Until then no other process can bind
        it, except a ``SO_REUSEADDR`` socket in the milliseconds of TF's own server set-up
        (:mod:`tfonspark.ports` says exactly what is left). ``now=True``
        frees it at once, for a server started some other way (a child process, a library
        outside Python and TensorFlow). ``ctx.tmp_socket`` is None afterwards either way.

        Parameters
        ----------
        now : bool
            Free the port at once instead of handing it to the next server that binds it.

        Examples
        --------
        >>> ctx = NodeContext(executor_id=0, job_name="worker", task_index=0, cluster_spec={},
        ...                   default_fs="file://", working_dir="/tmp", gpus=[])
        >>> ctx.release_port(now=True)  # in map_fun of a release_port=False cluster
        >>> ctx.tmp_socket is None
        True
        """
        sock, self.tmp_socket = self.tmp_socket, None
        if sock is not None:
            if now:
                sock.close()
                return
            self._handover = hand_over_port(sock)
        elif now and self._handover is not None:
            self._handover.release()

    def get_data_feed(
        self, train_mode: bool = True, qname_in: str = "input", qname_out: str = "output", input_mapping: Any = None
    ) -> Any:
        """A :class:`~tfonspark.tfprocess.datafeed.DataFeed` on this node's fed data (``InputMode.SPARK``).

        Parameters
        ----------
        train_mode : bool
            True for ``cluster.train`` feeds; False for ``cluster.inference`` (results go back).
        qname_in : str
            The queue the driver feeds (``train(..., qname=...)``).
        qname_out : str
            The queue results go back on (TFoS; one per feed here).
        input_mapping : dict, optional
            Column names -> tensor names, for DataFrame feeds (TFoS).

        Examples
        --------
        >>> def map_fun(args, ctx):  # doctest: +SKIP
        ...     feed = ctx.get_data_feed(train_mode=True)
        ...     while not feed.should_stop():
        ...         batch = feed.next_batch(64)
        """
        from .datafeed import DataFeed

        return DataFeed(self.mgr, train_mode, qname_in, qname_out, input_mapping)

    def report(self, metrics: Mapping[str, Any]) -> None:
        """Send ``metrics`` to the driver: ``tfonspark.run(..., on_report=...)`` and ``cluster.reports``.

        For progress and results: ``ctx.report({"epoch": 3, "loss": 0.21})``. The driver receives
        a :class:`tfonspark.driver.nodes.reports.Report` with this node's ``role`` and ``index``.

        ``metrics`` is a mapping with ``str`` keys and JSON values (str, int, float, bool, None,
        lists and str-keyed dicts of them); numpy scalars and arrays and eager tensors are
        converted to Python numbers and lists. At most 64 KiB as JSON. Anything else raises
        :class:`~tfonspark.errors.ConfigError` naming the key, here, before anything is sent.

        It never blocks training for long and never raises once the metrics are valid: reports
        are sent in order by a background thread, over the node's existing authenticated
        channel to the driver; if the driver or the node's supervisor is gone they are dropped,
        and if more than 256 are waiting the oldest are. Reports still waiting when ``map_fun``
        returns are sent before the process exits (for up to 10 s). Outside a cluster (a
        context made by hand) reports are logged at INFO on the ``tfonspark.report`` logger.

        Parameters
        ----------
        metrics : Mapping
            ``str`` keys, JSON values.

        Examples
        --------
        >>> ctx = NodeContext(executor_id=0, job_name="worker", task_index=0, cluster_spec={},
        ...                   default_fs="file://", working_dir="/tmp", gpus=[])
        >>> ctx.report({"epoch": 3, "loss": 0.21})  # outside a cluster: logged
        """
        payload = report_payload(metrics)
        if self._reporter is None:
            _report_log.info("%s:%d reports %s", self.job_name, self.task_index, payload)
            return
        self._reporter(payload)

    def cluster_resolver(self) -> SparkClusterResolver:
        """This node's ``tf.distribute.cluster_resolver.ClusterResolver``, for a strategy's ``cluster_resolver=``.

        A :class:`~tfonspark.distribute.SparkClusterResolver` of this node's task in the cluster
        spec (every job: chief, workers, ps, evaluator), with this node's GPUs (``ctx.gpus``) as
        ``num_accelerators()``. It resolves as ``TFConfigClusterResolver`` does from the node's
        ``TF_CONFIG``, in ``MultiWorkerMirroredStrategy`` and parameter-server
        (``tfonspark.run(..., num_ps=N)``) clusters alike, but counts the GPUs the node was
        given. Imports TensorFlow. A context without a cluster spec raises
        :class:`~tfonspark.errors.ConfigError`.

        Examples
        --------
        >>> def map_fun(args, ctx):  # doctest: +SKIP
        ...     import tensorflow as tf
        ...     strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=ctx.cluster_resolver())
        >>> ctx = NodeContext(executor_id=1, job_name="worker", task_index=1,
        ...                   cluster_spec={"chief": ["a:1"], "worker": ["b:2", "c:3"], "ps": ["d:4"]},
        ...                   default_fs="file://", working_dir="/tmp", gpus=[])
        >>> ctx.cluster_resolver().master()
        'grpc://c:3'
        """
        from ..distribute import resolver

        return resolver.SparkClusterResolver(self.cluster_spec, self.job_name, self.task_index, num_gpus=len(self.gpus))

    def start_cluster_server(self, num_gpus: int = 1, rdma: bool = False) -> tuple[Any, Any]:
        """Start this node's ``tf.distribute.Server`` (TFoS): see :func:`tfonspark.tfprocess.server.start_cluster_server`.

        Parameters
        ----------
        num_gpus : int
            GPUs the server may use (TFoS).
        rdma : bool
            Use RDMA (TFoS; ignored where TF has none).

        Examples
        --------
        >>> cluster, server = ctx.start_cluster_server(num_gpus=0)  # doctest: +SKIP
        """
        return _start_cluster_server(self, num_gpus, rdma)

    def export_saved_model(
        self,
        model: Any,
        export_dir: str | os.PathLike[str],
        signatures: Any = None,
        is_chief: bool = True,
    ) -> str | None:
        """TFoS ``export_saved_model``: see :func:`tfonspark.distribute.checkpoint.export_saved_model`.

        A Keras model built under a strategy is exported by every worker and kept by the chief;
        anything else is written only where ``is_chief`` is true.

        Parameters
        ----------
        model : keras.Model or tf.Module
            A Keras model or a ``tf.Module``.
        export_dir : str or PathLike
            Where the SavedModel goes.
        signatures : optional
            As for ``tf.saved_model.save``.
        is_chief : bool
            Whether this node keeps the export (TFoS).

        Examples
        --------
        >>> ctx.export_saved_model(model, args.export_dir, is_chief=ctx.is_chief)  # doctest: +SKIP
        """
        from ..distribute.checkpoint import export_saved_model

        return export_saved_model(model, export_dir, signatures=signatures, is_chief=is_chief)

    def distribute_dataset(
        self, dataset: Any, processing_mode: Any = "distributed_epoch", *, job_name: str | None = None
    ) -> Any:
        """``dataset`` read through the cluster's tf.data service (``run(..., data_service=N)``).

        The service's workers run ``dataset``; this node reads their output. Every node that
        makes the same call shares one job: its ``job_name``, by default
        ``"tfonspark-a<attempt>-<n>"`` for this node's n-th call, the same on every node as long
        as they all make the same calls in the same order (as MWMS nodes do). With
        ``"distributed_epoch"`` the nodes split the elements, so their counts differ: give an
        endless dataset (``.repeat()``) and ``steps_per_epoch``, or MWMS nodes wait for each
        other. A dataset that calls back into Python (``py_function``...) raises ConfigError here.

        Parameters
        ----------
        dataset : tf.data.Dataset
            What the service's workers run (before batching for one replica or after: yours).
        processing_mode : str or tf.data.experimental.service.ShardingPolicy
            ``"distributed_epoch"`` (each element to one node), ``"parallel_epochs"`` (every
            worker produces the whole dataset), or a ``ShardingPolicy``.
        job_name : str, optional
            The job the nodes share; default: one per call, as above.

        Examples
        --------
        >>> def dataset_fn(input_context):  # doctest: +SKIP
        ...     return ctx.distribute_dataset(tf.data.Dataset.range(10**6).map(augment).batch(32).repeat())
        """
        if not self.data_service:
            raise ConfigError(
                "this cluster has no tf.data service: start it with tfonspark.run(..., data_service=N) "
                "(N: executors for its workers)"
            )
        self._data_jobs += 1
        name = job_name or f"tfonspark-a{self.attempt}-{self._data_jobs}"
        return distribute(dataset, self.data_service, processing_mode, job_name=name)

    def __repr__(self) -> str:
        return (
            f"NodeContext(executor_id={self.executor_id}, job_name={self.job_name!r}, "
            f"task_index={self.task_index}, num_workers={self.num_workers}, gpus={self.gpus}, attempt={self.attempt})"
        )
