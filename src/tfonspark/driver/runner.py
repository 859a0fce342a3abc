"""``tfonspark.run``: sort its keyword arguments, prepare the cluster, start it (:mod:`.plan`).

With ``data_service=N`` a tf.data service starts first, beside the cluster
(:mod:`.services.beside`). ``run`` lives here, above both, because the service itself starts its
workers through :func:`tfonspark.driver.plan.prepare`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..settings import Settings
from .cluster import Cluster
from .options import RunOptions, split_options
from .plan import prepare
from .services.beside import start_beside

if TYPE_CHECKING:
    from typing import Unpack

    from pyspark import SparkContext

    from .nodes.launcher import Launcher
    from .nodes.reports import Report

__all__ = ["run"]


def run(
    sc: SparkContext,
    map_fun: Callable[[Any, Any], Any],
    tf_args: Any,
    num_executors: int,
    *,
    settings: Settings | None = None,
    on_report: Callable[[Report], Any] | None = None,
    launcher: Launcher | None = None,
    **options: Unpack[RunOptions],
) -> Cluster:
    """Start a TensorFlow cluster of ``num_executors`` nodes on Spark executors.

    ``map_fun(tf_args, ctx)`` runs in one TF process per node. Returns a :class:`Cluster` once
    every node is up. TFoS programs call ``TFCluster.run``, which takes TFoS's positional
    arguments; here everything after ``num_executors`` is a keyword.

    Parameters
    ----------
    sc : pyspark.SparkContext
        The Spark context.
    map_fun : callable
        ``map_fun(tf_args, ctx)``, called in every node's TF process (``ctx``: a
        :class:`~tfonspark.NodeContext`).
    tf_args : object
        Handed to ``map_fun`` as is (an ``argparse.Namespace``, a dict...).
    num_executors : int
        How many nodes (one per Spark executor, ps and evaluator included).
    settings : Settings, optional
        :class:`~tfonspark.settings.Settings`: each field given wins over its Spark conf key
        ``spark.tfonspark.<camelCase name>``, its environment variable and its default (docs/settings.md).
    on_report : callable, optional
        Called on the driver with each :class:`Report` a node sends (``ctx.report({...})``);
        default: logged at INFO on the ``tfonspark.report`` logger. All are in ``cluster.reports``.
    launcher : Launcher, optional
        Starts the node supervisors (default: a Spark job, a barrier stage where possible);
        ``tfonspark.testing.LocalLauncher`` starts them without Spark, for tests.
    **options : RunOptions
        The fields of :class:`ClusterOptions`, TFoS's options of ``TFCluster.run`` with its
        defaults: ``num_ps`` (0) parameter servers, ``tensorboard`` (False) on the chief,
        ``input_mode`` (``InputMode.TENSORFLOW``) how data reaches TF, ``log_dir`` (None) for
        TensorBoard, ``driver_ps_nodes`` (False) ps nodes on the driver, ``master_node`` (None)
        the chief's job name (``"chief"``/``"master"``), ``reservation_timeout`` (600) seconds for
        every node to register, ``eval_node`` (False) one evaluator node, ``release_port``
        (True) the node releases its reserved port before ``map_fun``; and ``max_restarts`` (0):
        after a node fails, tear the cluster down, reserve the executors again and start
        ``map_fun`` again on every node (``ctx.attempt`` counts), up to that many times (docs/restarts.md);
        and ``coordinator`` (False): ``map_fun`` runs on the ``chief`` only, as
        ``ParameterServerStrategy``'s coordinator (``ctx.cluster_resolver()``), while the
        workers and ps only serve (``tf.distribute.Server``, no user code) until it returns
        (docs/ps.md). ``num_executors`` is then 1 chief + workers + ``num_ps`` (>= 1);
        ``input_mode`` must be ``TENSORFLOW``. A flag named after TF's ``ClusterCoordinator``,
        like ``eval_node``: TF runs the coordinator as the chief, so there is no place to choose,
        and the driver as coordinator is :func:`tfonspark.ps_cluster`, not ``run()``.
        ``debug`` (None): :class:`~tfonspark.Debug`, ``tf.debugging`` on every node around
        ``map_fun`` (check numerics, Debugger V2 dumps, device-placement logging; docs/tensorfx.md).
        ``data_service`` (0): that many more executors run tf.data service workers, with the
        dispatcher on the driver, started before the nodes and stopped with the cluster;
        ``map_fun`` reads it with ``ctx.distribute_dataset(ds)`` (``ctx.data_service``: its
        target; docs/data_service.md). ``data_service_on`` (``"executors"``): with ``"nodes"``
        no executor is added; instead the first ``data_service`` nodes each run a worker in
        their TF process beside ``map_fun`` (not with ``coordinator``, ``max_restarts`` or
        ``driver_ps_nodes``).
        Then every field of ``Settings`` by name (``heartbeat_timeout=30``):
        a shorthand merged into ``settings``; giving one both ways is a ConfigError.

    Raises ReservationTimeout if the executors cannot be reserved in time, ConfigError for a bad
    argument or setting, TypeError for an unknown keyword.

    Examples
    --------
    >>> cluster = tfonspark.run(sc, main_fun, args, 2, input_mode=InputMode.SPARK,  # doctest: +SKIP
    ...                         settings=Settings(heartbeat_timeout=30))
    >>> cluster = tfonspark.run(sc, coordinate, args, 4, num_ps=1, coordinator=True)  # doctest: +SKIP
    >>> cluster.shutdown()  # doctest: +SKIP
    """
    cluster_options, by_name = split_options(options)
    chosen = (settings or Settings()).merged(by_name)
    plan = prepare(sc, map_fun, tf_args, num_executors, cluster_options, chosen, on_report=on_report, launcher=launcher)
    if cluster_options.data_service:
        return start_beside(plan)
    return plan.start(Cluster)
