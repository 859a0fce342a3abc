"""The tf.data service on a node: a ``WorkerServer`` per TF process, and the dataset guard.

A node of :func:`tfonspark.data_service` runs :func:`serve_data` instead of user code. Its
address (``host:port``) is the one its supervisor reserved and registered, so the driver knows
every worker's address before any worker starts and gives the list to the dispatcher
(``DispatcherConfig(worker_addresses=...)``, which FILE/DATA/HINT sharding needs). The reserved
port is handed to the ``WorkerServer`` as it binds it (:mod:`.server`'s hand-over: shared right
before, released right after): TF's data servers start through ``TF_DATA_NewWorkerServer``,
which the hand-over's hooks do not see, so this module does it around that call itself.

TF's ``WorkerServer.start()`` registers with the dispatcher and blocks, holding Python's GIL,
until it answers; so the node first waits (GIL free) until the dispatcher's port accepts, and
then serves with ``time.sleep`` rather than ``join()``, keeping the process's own threads (its
parent-death watchdog) running. The supervisor ends it with SIGTERM when the service stops.

:func:`check_serializable` and :func:`distribute` are for any process that reads from the
service, the driver (``svc.distribute``) and a TF process (``ctx.distribute_dataset``) alike: a dataset that calls back into Python (``py_function``, ``numpy_function``,
``from_generator``) cannot run on a worker, and TF 2.21 only says so while iterating
(``Could not find callback with key=pyfunc_0 in the registry``).

:class:`OnNodes` is ``run(..., data_service=N, data_service_on="nodes")``'s ``map_fun``: the
first ``N`` TF nodes each run a ``WorkerServer`` in their own TF process, beside ``map_fun``, on
a port the node reserves and reports (:data:`ADDRESS`) so the driver can start the dispatcher
with every worker's address. It lives and dies with the node's TF process.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..ports import PortHandover, confined, pending_handovers, release_handovers, reserve_port
from ..probes import servers_accepting
from .server import ServerNode

__all__ = [
    "ADDRESS",
    "PYTHON_OPS",
    "REGISTERED",
    "DataWorkerArgs",
    "OnNodes",
    "check_serializable",
    "distribute",
    "python_ops",
    "serve_beside",
    "serve_data",
    "split_address",
]

_log = logging.getLogger(__name__)

#: TF ops that call back into the Python process that built the dataset, by the API that makes them
PYTHON_OPS: dict[str, str] = {
    "EagerPyFunc": "tf.py_function",
    "PyFunc": "tf.numpy_function or Dataset.from_generator",
    "PyFuncStateless": "tf.numpy_function(stateful=False)",
}
_INSTEAD = (
    "Use TensorFlow ops instead (tf.image, tf.strings, tf.io ...), read files with tf.data "
    "(TFRecordDataset, TextLineDataset, list_files) rather than a Python generator, or keep the "
    "Python step after distribute(), where it runs in the reading process"
)
_SERVE_POLL_SECS = 1.0
#: the key of the report a data worker sends once the dispatcher has registered it
REGISTERED = "tfonspark.data_worker"
#: the key of the report a worker in a TF node sends with its address, before the dispatcher runs
ADDRESS = "tfonspark.data_worker_address"


@dataclass(frozen=True)
class DataWorkerArgs:
    """What every data-service node is told: the dispatcher's ``host:port`` and TF's worker options.

    ``dispatcher`` ``""``: the ``dispatcher`` task of the node's cluster spec (:func:`tfonspark.data_service`
    holds it in every spec).
    """

    dispatcher: str = ""
    heartbeat_interval_ms: int | None = None
    dispatcher_timeout_ms: int | None = None
    wait_secs: float = 600.0  #: how long to wait for the dispatcher to listen


def split_address(address: str) -> tuple[str, int]:
    """``("host", port)`` of ``"host:port"`` or ``"[v6]:port"``."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def serve_data(args: DataWorkerArgs, ctx: ServerNode) -> None:
    """A node of :func:`tfonspark.data_service`: a tf.data ``WorkerServer`` at the node's address until stopped.

    No user code runs here: the dispatcher on the driver hands out the work. Once registered
    with it, the node reports ``{REGISTERED: address}`` to the driver.
    """
    import tensorflow as tf

    address = ctx.cluster_spec[ctx.job_name][ctx.task_index]
    if not args.dispatcher:
        args = dataclasses.replace(args, dispatcher=ctx.cluster_spec["dispatcher"][0])
    _wait_dispatcher(args)
    config = tf.data.experimental.service.WorkerConfig(
        dispatcher_address=args.dispatcher,
        worker_address=address,
        port=split_address(address)[1],
        heartbeat_interval_ms=args.heartbeat_interval_ms,
        dispatcher_timeout_ms=args.dispatcher_timeout_ms,
    )
    for handover in pending_handovers():
        handover.share_with_server()  # TF's gRPC server binds the reserved port beside the reservation
    try:
        server = tf.data.experimental.service.WorkerServer(config)
    finally:
        release_handovers()
    _log.info("tf.data worker %s serving for dispatcher %s", address, args.dispatcher)
    report = getattr(ctx, "report", None)  # a NodeContext tells the driver: registered, serving
    if report is not None:
        report({REGISTERED: address})
    try:
        while True:
            time.sleep(_SERVE_POLL_SECS)
    finally:
        server.stop()


@dataclass(frozen=True)
class OnNodes:
    """``map_fun`` of a cluster whose first ``workers`` nodes also run a tf.data worker (picklable).

    Node ``executor_id < workers`` reserves a port, reports ``{ADDRESS: "host:port"}``, waits for
    the dispatcher (``ctx.data_service``; the driver starts it once every such node reported),
    starts a ``WorkerServer`` there, then runs ``map_fun``; the server stops when ``map_fun``
    ends, and with the TF process in any case. The other nodes run ``map_fun`` alone.
    """

    map_fun: Callable[[Any, Any], Any]
    workers: int
    wait_secs: float = 600.0  #: how long to wait for the dispatcher to listen

    def __call__(self, args: Any, ctx: Any) -> Any:
        """Run ``map_fun(args, ctx)``, with a tf.data worker beside it on the first ``workers`` nodes."""
        if ctx.executor_id >= self.workers:
            return self.map_fun(args, ctx)
        server = serve_beside(ctx, self.wait_secs)
        try:
            return self.map_fun(args, ctx)
        finally:
            server.stop()


def serve_beside(ctx: Any, wait_secs: float) -> Any:
    """A ``WorkerServer`` in this TF process for the dispatcher at ``ctx.data_service``, registered.

    The port is reserved here and reported (:data:`ADDRESS`) first: the driver gives the
    dispatcher every worker's address before any registers (FILE/DATA/HINT sharding need them).
    """
    import tensorflow as tf

    dispatcher = str(ctx.data_service).split("://", 1)[-1]
    host = split_address(ctx.cluster_spec[ctx.job_name][ctx.task_index])[0]
    handover = PortHandover(reserve_port(port_range=confined(), what="the tf.data worker beside map_fun"))
    address = f"[{host}]:{handover.port}" if ":" in host else f"{host}:{handover.port}"
    try:
        ctx.report({ADDRESS: address})
        _wait_dispatcher(DataWorkerArgs(dispatcher, wait_secs=wait_secs))
        config = tf.data.experimental.service.WorkerConfig(
            dispatcher_address=dispatcher, worker_address=address, port=handover.port
        )
        handover.share_with_server()  # TF's gRPC server binds the reserved port beside the reservation
        server = tf.data.experimental.service.WorkerServer(config)
    finally:
        handover.release()
    _log.info("tf.data worker %s serving beside this node's map_fun, dispatcher %s", address, dispatcher)
    ctx.report({REGISTERED: address})
    return server


def _wait_dispatcher(args: DataWorkerArgs) -> None:
    """Wait, without holding the GIL, until the dispatcher's port accepts connections."""
    deadline = time.monotonic() + args.wait_secs
    while not servers_accepting({"dispatcher": [args.dispatcher]}, ("dispatcher",))["dispatcher:0"]:
        if time.monotonic() > deadline:
            raise ConfigError(
                f"the tf.data dispatcher at {args.dispatcher} did not listen within {args.wait_secs:.0f}s"
            )
        time.sleep(0.05)


def python_ops(dataset: Any) -> list[str]:
    """The Python-callback ops (:data:`PYTHON_OPS`) in ``dataset``'s graph and its function library, sorted."""
    import tensorflow as tf

    (variant,) = tf.nest.flatten(dataset, expand_composites=True)
    serialized = tf.raw_ops.DatasetToGraphV2(input_dataset=variant, external_state_policy=1)  # 1: ignore
    graph = tf.compat.v1.GraphDef.FromString(serialized.numpy())
    return sorted({op for op in _ops(graph) if op in PYTHON_OPS})


def _ops(graph: Any) -> Iterator[str]:
    for node in graph.node:
        yield node.op
    for function in graph.library.function:
        for node in function.node_def:
            yield node.op


def check_serializable(dataset: Any) -> None:
    """Raise ConfigError if ``dataset`` calls back into Python, which the tf.data service cannot run.

    Parameters
    ----------
    dataset : tf.data.Dataset
        The dataset to hand to the service (the part before ``distribute``).

    Examples
    --------
    >>> import tensorflow as tf  # doctest: +SKIP
    >>> check_serializable(tf.data.Dataset.range(4).map(lambda x: x * 2))  # doctest: +SKIP
    """
    found = python_ops(dataset)
    if found:
        apis = ", ".join(f"{op} ({PYTHON_OPS[op]})" for op in found)
        raise ConfigError(
            f"the tf.data service cannot serialize this dataset: it calls back into Python through {apis}, "
            f"which exists only in the process that built it, not on the service's workers. {_INSTEAD}."
        )


def distribute(
    dataset: Any,
    target: str,
    processing_mode: Any = "distributed_epoch",
    *,
    job_name: str | None = None,
    max_outstanding_requests: int | None = None,
) -> Any:
    """``dataset`` read through the tf.data service at ``target``, after :func:`check_serializable`.

    Parameters
    ----------
    dataset : tf.data.Dataset
        What the workers run.
    target : str
        The dispatcher, ``"grpc://host:port"`` (``svc.target``, ``ctx.data_service``).
    processing_mode : str or tf.data.experimental.service.ShardingPolicy
        ``"distributed_epoch"`` (each element once, split across workers), ``"parallel_epochs"``
        (every worker produces the whole dataset), or a ``ShardingPolicy``.
    job_name : str, optional
        Readers with the same job name share one job (and split its elements).
    max_outstanding_requests : int, optional
        As for ``tf.data.experimental.service.distribute``.

    Examples
    --------
    >>> ds = distribute(tf.data.Dataset.range(10), svc.target, job_name="train")  # doctest: +SKIP
    """
    import tensorflow as tf

    check_serializable(dataset)
    return dataset.apply(
        tf.data.experimental.service.distribute(
            processing_mode, target, job_name=job_name, max_outstanding_requests=max_outstanding_requests
        )
    )
