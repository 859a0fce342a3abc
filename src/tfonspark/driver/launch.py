"""Start a cluster: resolve its settings, plan its roles, open the rendezvous, launch the nodes.

``tfonspark.run`` sorts its keywords in :mod:`.runner` and starts here.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

from ..config import InputMode, NodeConfig
from ..errors import ConfigError, ReservationTimeout
from ..executor.gpus import requested_gpus
from ..executor.supervisor import SERVER_RESTARTS
from ..fs import default_fs
from ..host import local_ip_towards
from ..settings import Resolved, Settings, heartbeat_interval, resolve
from ..tfprocess.debugging import Debug
from ..tfprocess.server import ChiefCoordinator
from ..wire.framing import new_secret
from .assemble import start_cluster
from .cluster import SPARK_SETTINGS, Cluster
from .jobs import barrier_supported, wait_for_slots
from .nodes.launcher import Launcher, SparkLauncher
from .nodes.rendezvous import RendezvousServer
from .nodes.reports import Report, ReportLog
from .nodes.restarts import check_max_restarts
from .nodes.roles import CHIEF_ROLES, plan_roles

if TYPE_CHECKING:
    from pyspark import SparkContext

    from .nodes.roles import NodeRole

__all__ = [
    "Begin",
    "ClusterOptions",
    "RunOptions",
    "SettingKeywords",
    "driver_host",
    "prepare",
    "split_options",
    "start",
]

_log = logging.getLogger(__name__)

#: :func:`prepare`'s result: ``begin(data_target, on_end)`` starts the nodes, told the tf.data
#: service's target (None: none); the cluster calls ``on_end()`` (None: nothing) once they stop.
Begin = Callable[[str | None, Callable[[], None] | None], Cluster]
_LEGACY_KERAS_KEYS = "legacy_keras=False (or spark.tfonspark.legacyKeras=off, or TFONSPARK_LEGACY_KERAS=off)"


def driver_host(sc: SparkContext) -> str:
    """The driver's address executors reach: ``spark.driver.host``, else the address towards the outside."""
    host = sc.getConf().get("spark.driver.host", None)
    return host or local_ip_towards("8.8.8.8")


@dataclass(frozen=True)
class ClusterOptions:
    """How ``run()`` lays out and starts the cluster: TFoS's options of ``TFCluster.run``,
    ``max_restarts`` and ``coordinator``. Each is also a keyword argument of :func:`tfonspark.run` (see there)."""

    num_ps: int = 0
    tensorboard: bool = False
    input_mode: InputMode | int = InputMode.TENSORFLOW
    log_dir: str | None = None
    driver_ps_nodes: bool = False
    master_node: str | None = None
    reservation_timeout: float = 600
    eval_node: bool = False
    release_port: bool = True
    max_restarts: int = 0
    coordinator: bool = False
    debug: Debug | None = None
    data_service: int = 0  #: executors reserved for tf.data service workers (driver/service_beside.py)
    data_service_on: str = "executors"  #: where those workers run: "executors" of their own, or "nodes"


class SettingKeywords(TypedDict, total=False):
    """The fields of :class:`~tfonspark.settings.Settings` as keyword arguments (``None`` = not given)."""

    server_host: str | None
    server_port: int | str | None
    feed_buffer_bytes: int | None
    tensorboard_port: int | None
    bind_host: str | None
    heartbeat_timeout: float | None
    collective: str | None
    legacy_keras: bool | str | None
    epoch_end_timeout: float | None
    stream_stop_timeout: float | None
    spare_processes: bool | str | None


class RunOptions(SettingKeywords, total=False):
    """The keyword arguments of :func:`tfonspark.run` after ``launcher``: the fields of :class:`ClusterOptions`
    and of :class:`~tfonspark.settings.Settings` (a shorthand for ``settings=``)."""

    num_ps: int
    tensorboard: bool
    input_mode: InputMode | int
    log_dir: str | None
    driver_ps_nodes: bool
    master_node: str | None
    reservation_timeout: float
    eval_node: bool
    release_port: bool
    max_restarts: int
    coordinator: bool
    debug: Debug | None
    data_service: int
    data_service_on: str


_OPTION_NAMES = frozenset(f.name for f in dataclasses.fields(ClusterOptions))
_SETTING_NAMES = frozenset(f.name for f in dataclasses.fields(Settings))


def split_options(keywords: Mapping[str, Any]) -> tuple[ClusterOptions, dict[str, Any]]:
    """``run()``'s keyword arguments as :class:`ClusterOptions` and the settings given by name."""
    unknown = sorted(set(keywords) - _OPTION_NAMES - _SETTING_NAMES)
    if unknown:
        raise TypeError(f"run() got unexpected keyword arguments: {', '.join(unknown)}")
    options = ClusterOptions(**{k: v for k, v in keywords.items() if k in _OPTION_NAMES})
    return options, {k: v for k, v in keywords.items() if k in _SETTING_NAMES}


def start(
    sc: SparkContext,
    map_fun: Callable[[Any, Any], Any],
    tf_args: Any,
    num_executors: int,
    options: ClusterOptions,
    chosen: Settings,
    *,
    on_report: Callable[[Report], Any] | None = None,
    launcher: Launcher | None = None,
    tfos_face: bool = False,
    driver_tasks: Mapping[str, Sequence[str]] | None = None,
) -> Cluster:
    """:func:`tfonspark.run` once its keyword arguments are sorted; ``TFCluster.run``, ``TFEstimator`` and
    ``ps_cluster`` start here too (``tfos_face=True``: the TFoS face's Keras 2 default for the
    nodes; ``driver_tasks``: tasks in every node's cluster spec that the driver holds itself)."""
    begin = prepare(
        sc,
        map_fun,
        tf_args,
        num_executors,
        options,
        chosen,
        on_report=on_report,
        launcher=launcher,
        tfos_face=tfos_face,
        driver_tasks=driver_tasks,
    )
    return begin(None, None)


def prepare(
    sc: SparkContext,
    map_fun: Callable[[Any, Any], Any],
    tf_args: Any,
    num_executors: int,
    options: ClusterOptions,
    chosen: Settings,
    *,
    on_report: Callable[[Report], Any] | None = None,
    launcher: Launcher | None = None,
    tfos_face: bool = False,
    driver_tasks: Mapping[str, Sequence[str]] | None = None,
) -> Begin:
    """As :func:`start`, but checked and planned only: ``begin(data_target, on_end)`` starts the
    nodes, telling them the tf.data service's dispatcher (``ctx.data_service``; None: no service)."""
    plan = _plan(sc, map_fun, tf_args, num_executors, options, chosen, tfos_face)
    if driver_tasks:
        plan = dataclasses.replace(plan, driver_tasks=dict(driver_tasks))
    return functools.partial(_launch, plan, launcher, on_report, (map_fun, tf_args))


def _launch(
    plan: _Plan,
    launcher: Launcher | None,
    on_report: Callable[[Report], Any] | None,
    program: tuple[Callable[[Any, Any], Any], Any],
    data_target: str | None,
    on_end: Callable[[], None] | None,
) -> Cluster:
    """Start ``plan``'s nodes (a barrier stage where Spark has one), told the tf.data service's target;
    the cluster calls ``on_end()`` once its nodes stop (the service beside it)."""
    plan = dataclasses.replace(plan, data_target=data_target, on_end=on_end)
    use_barrier = launcher is None and barrier_supported(plan.sc)
    launcher = launcher or SparkLauncher(plan.sc, barrier=use_barrier)
    reserve = plan.reserver() if use_barrier else None
    return _begin(plan, launcher, reserve, on_report, (plan.program(program[0]), program[1]))


@dataclass(frozen=True)
class _Plan:
    """What ``run()`` works out before any server or node exists, and how it forms each attempt."""

    sc: SparkContext
    roles: list[NodeRole]
    mode: InputMode
    options: ClusterOptions
    resolved: Resolved
    keras: str  #: ``NodeConfig.legacy_keras``
    num_gpus: int | None
    tfos_face: bool
    cluster_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    driver_tasks: Mapping[str, Sequence[str]] = field(default_factory=dict)  #: tasks the driver holds
    on_end: Callable[[], None] | None = None  #: ``Cluster``'s, once its nodes stop
    data_target: str | None = None  #: ``NodeConfig.data_service``

    @property
    def heartbeat_secs(self) -> float:
        """Supervisor <-> driver liveness messages: four per ``heartbeat_timeout``, at most 5 s apart."""
        return heartbeat_interval(self.resolved.heartbeat_timeout)

    def form(self, attempt: int) -> tuple[RendezvousServer, NodeConfig]:
        """A rendezvous server with a fresh secret, and the nodes' config for ``attempt``."""
        secret = new_secret()
        server = RendezvousServer(
            self.cluster_id,
            self.roles,
            secret,
            driver_host(self.sc),
            self.resolved.server_port,
            bind_host=self.resolved.server_host or None,
            heartbeat_secs=self.heartbeat_secs,
            heartbeat_timeout=self.resolved.heartbeat_timeout,
            fixed_tasks=self.driver_tasks,
        )
        return server, self.node_config(server.address, secret, attempt)

    def node_config(self, address: tuple[str, int], secret: bytes, attempt: int) -> NodeConfig:
        """The nodes' config for ``attempt``, joining the rendezvous server at ``address``."""
        opts = self.options
        return NodeConfig(
            cluster_id=self.cluster_id,
            driver_host=address[0],
            driver_port=address[1],
            secret_hex=secret.hex(),
            input_mode=self.mode,
            tensorboard=opts.tensorboard,
            log_dir=opts.log_dir,
            release_port=opts.release_port,
            reservation_timeout=float(opts.reservation_timeout),
            default_fs=default_fs(self.sc),
            chief_job=opts.master_node if opts.master_node in CHIEF_ROLES else "worker",
            heartbeat_secs=self.heartbeat_secs,
            legacy_keras=self.keras,
            tfos_face=self.tfos_face,
            num_gpus=self.num_gpus,
            attempt=attempt,
            server_restarts=self.server_restarts,
            debug=opts.debug.to_dict() if opts.debug else None,
            data_service=self.data_target,
            **self.resolved.node_fields(),
        )

    @property
    def server_restarts(self) -> int:
        """How often each worker that only serves restarts in place (executor/supervisor.py); 0 elsewhere."""
        serving = self.options.coordinator or bool(self.driver_tasks)  # driver_tasks: ps_cluster's chief
        return max(SERVER_RESTARTS, self.options.max_restarts) if serving else 0

    def program(self, map_fun: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        """What every node runs: ``map_fun``, or with ``coordinator`` a :class:`ChiefCoordinator` of it."""
        if not self.options.coordinator:
            return map_fun
        return ChiefCoordinator(map_fun, float(self.options.reservation_timeout))

    def reserver(self) -> Callable[[], None]:
        """Wait for every Spark task slot a barrier stage of the nodes needs."""
        needed = sum(1 for r in self.roles if not r.on_driver)
        return lambda: _reserve_slots(self.sc, needed, float(self.options.reservation_timeout))


def _plan(
    sc: SparkContext,
    map_fun: Callable[[Any, Any], Any],
    tf_args: Any,
    num_executors: int,
    options: ClusterOptions,
    chosen: Settings,
    tfos_face: bool,
) -> _Plan:
    """Check the arguments and resolve the settings: everything that can fail before a server starts."""
    if not callable(map_fun):
        raise ConfigError(f"map_fun must be callable. Received: {type(map_fun).__name__}")
    o = options
    check_max_restarts(o.max_restarts)
    roles = plan_roles(num_executors, o.num_ps, o.master_node, o.eval_node, o.driver_ps_nodes, o.coordinator)
    mode = InputMode(o.input_mode)
    if o.coordinator and mode is InputMode.SPARK:
        raise ConfigError(
            "coordinator=True runs map_fun on the chief only, so no worker reads fed data: use "
            "InputMode.TENSORFLOW and read data in the coordinator's dataset_fn. Received: input_mode=InputMode.SPARK"
        )
    num_gpus = requested_gpus(tf_args)  # TFoS's tf_args.num_gpus: how many GPUs each node takes
    resolved = resolve(chosen, sc.getConf())
    keras = _node_keras(resolved.legacy_keras, tfos_face)
    return _Plan(sc, roles, mode, o, resolved, keras, num_gpus, tfos_face)


def _begin(
    plan: _Plan,
    launcher: Launcher,
    reserve: Callable[[], None] | None,
    on_report: Callable[[Report], Any] | None,
    program: tuple[Callable[[Any, Any], Any], Any],
) -> Cluster:
    """The :class:`Cluster` (it forms attempt 0 with ``plan.form``), its nodes started; torn down if they cannot."""
    return start_cluster(
        plan.sc,
        plan.roles,
        plan.mode,
        plan.form,
        program,
        reports=ReportLog(on_report),
        launcher=launcher,
        max_restarts=plan.options.max_restarts,
        reserve=reserve,
        on_end=plan.on_end,
    )


def _reserve_slots(sc: SparkContext, needed: int, timeout: float) -> None:
    """Barrier stages need every task slot at once: wait for them, or say which settings to change."""
    slots = wait_for_slots(sc, needed, timeout)
    if slots < needed:
        raise ReservationTimeout(
            f"the cluster needs {needed} Spark task slots for its TensorFlow nodes but only {slots} were "
            f"available after {timeout}s; check {SPARK_SETTINGS} or lower num_executors.",
            registered=slots,
            required=needed,
        )


def _node_keras(mode: str, tfos_face: bool) -> str:
    """``NodeConfig.legacy_keras`` for the ``legacy_keras`` setting, said in one log line."""
    if mode == "off" or (mode == "auto" and not tfos_face):
        return ""
    if mode == "on":
        _log.info("TF processes use Keras 2 (tf_keras, TF_USE_LEGACY_KERAS=1): legacy_keras=on")
        return "on"
    if importlib.util.find_spec("tf_keras") is None:
        _log.warning(
            "TFoS face: tf_keras is not installed, so TF processes use Keras 3, where model.fit under "
            "MultiWorkerMirroredStrategy fails; pip install 'tfonspark[tfos]' to run TFoS Keras programs unchanged"
        )
    else:
        _log.info(
            "TFoS face: TF processes use Keras 2 (tf_keras, TF_USE_LEGACY_KERAS=1) as TFoS programs expect; "
            "%s keeps Keras 3",
            _LEGACY_KERAS_KEYS,
        )
    return "auto"
