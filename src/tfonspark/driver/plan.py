"""A cluster starts in two steps: ``plan = prepare(...)`` checks and plans; ``plan.start(Handle)`` starts it.

:func:`prepare` does everything that can fail before a server or a node exists: the node
program (:mod:`.programs`), the role plan, the settings resolved once. :meth:`Plan.start` then
wires the running cluster's parts once (feed jobs and streams ask the running gang about the
nodes through :class:`~tfonspark.driver.nodes.gang.LiveNodes`; each gang hands its node events
to the feeds and the report log; a restart forms the next gang from the plan), starts the nodes
and hands the parts to a handle: a :class:`~tfonspark.driver.cluster.Cluster` for ``run()``, a
serve-only handle for ``ps_cluster`` and ``data_service`` (:mod:`.services.serving`). Every way
into a cluster takes this path: ``tfonspark.run``, ``TFCluster.run``, ``TFEstimator``, the
serve-only starts and the service beside a cluster (which gives ``start`` the service's target
and what to do once the nodes stop).
"""

from __future__ import annotations

import importlib.util
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from ..config import InputMode, NodeConfig
from ..errors import ConfigError, ReservationTimeout
from ..executor.gpus import requested_gpus
from ..executor.restart_in_place import SERVER_RESTARTS
from ..fs import default_fs
from ..host import local_ip_towards
from ..ports import PORT_RANGE_KEYS, PortHandover, hand_over_port, range_ports, reserve_port
from ..settings import Resolved, Settings, heartbeat_interval, resolve
from ..wire.framing import new_secret
from .cluster import Reserved, Running
from .feeds.feeding import Feeds
from .feeds.streaming import Streams
from .jobs import barrier_supported, check_fed_cluster_conf, memory_overhead_warning, wait_for_slots
from .nodes.gang import SPARK_SETTINGS, Gang, LiveNodes
from .nodes.launcher import Launcher, SparkLauncher
from .nodes.node_events import NodeEvents
from .nodes.rendezvous import RendezvousServer
from .nodes.reports import Report, ReportLog
from .nodes.restarts import Attempts, check_max_restarts
from .nodes.roles import CHIEF_ROLES, DATA_ROLES, NodeRole, plan_roles
from .options import ClusterOptions
from .programs import PROGRAMS, ProgramKind, for_run

if TYPE_CHECKING:
    from pyspark import SparkContext

__all__ = ["Plan", "driver_host", "prepare", "reserve_task", "task_address"]

_log = logging.getLogger(__name__)
_LEGACY_KERAS_KEYS = "legacy_keras=False (or spark.tfonspark.legacyKeras=off, or TFONSPARK_LEGACY_KERAS=off)"
_H = TypeVar("_H")


def driver_host(sc: SparkContext) -> str:
    """The driver's address executors reach: ``spark.driver.host``, else the address towards the outside."""
    host = sc.getConf().get("spark.driver.host", None)
    return host or local_ip_towards("8.8.8.8")


def task_address(host: str, port: int) -> str:
    """The ``host:port`` of a task, as TF's cluster specs write it (IPv6 in brackets)."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def reserve_task(host: str, task: str, *, hand_over: bool = False, port_range: str = "") -> Reserved:
    """Reserve the port of the driver's task ``task`` at ``host`` (``plan.host``).

    ``hand_over``: to the next TF server this process starts (the coordinator's, which TF's
    ``ParameterServerStrategy`` makes), else to the server that shares it itself (the dispatcher).
    ``port_range``: the setting; the first port of it free here (ConfigError where none is).
    """
    sock = reserve_port(port_range=port_range, what=f"the driver's {task} task")
    handover = hand_over_port(sock) if hand_over else PortHandover(sock)
    return Reserved(task, handover, task_address(host, handover.port))


def prepare(
    sc: SparkContext,
    map_fun: Callable[[Any, Any], Any] | None,
    tf_args: Any,
    num_executors: int,
    options: ClusterOptions,
    chosen: Settings,
    *,
    program: ProgramKind | None = None,
    on_report: Callable[[Report], Any] | None = None,
    launcher: Launcher | None = None,
    tfos_face: bool = False,
) -> Plan:
    """Check the arguments, choose the node program, plan the roles and resolve the settings.

    ``program``: the kind of cluster (:data:`~tfonspark.driver.programs.PROGRAMS`), or None for
    the one ``options`` say (``run()``'s: ``map_fun``, ``coordinator`` or ``data_on_nodes``).
    ``tfos_face``: the TFoS face's Keras 2 default for the nodes. Nothing starts and nothing is
    reserved here; :meth:`Plan.start` starts the nodes.

    Examples
    --------
    >>> plan = prepare(sc, main_fun, args, 2, ClusterOptions(), Settings())  # doctest: +SKIP
    >>> cluster = plan.start(Cluster)  # doctest: +SKIP
    """
    row = PROGRAMS[program] if program is not None else for_run(options)
    work = row.make(map_fun, options, num_executors)
    host = driver_host(sc)
    o = options
    check_max_restarts(o.max_restarts)
    roles = plan_roles(num_executors, o.num_ps, o.master_node, o.eval_node, o.driver_ps_nodes, o.coordinator)
    mode = InputMode(o.input_mode)
    if o.coordinator and mode is InputMode.SPARK:
        raise ConfigError(
            "coordinator=True runs map_fun on the chief only, so no worker reads fed data: use "
            "InputMode.TENSORFLOW and read data in the coordinator's dataset_fn. Received: input_mode=InputMode.SPARK"
        )
    if mode is InputMode.SPARK:
        check_fed_cluster_conf(sc)
    resolved = resolve(chosen, sc.getConf())
    master = str(getattr(sc, "master", "") or sc.getConf().get("spark.master", ""))
    too_small = memory_overhead_warning(sc.getConf(), master, bool(resolved.spare_processes))
    if too_small:
        _log.warning("tfonspark: %s", too_small)
    plan = Plan(
        sc,
        host,
        roles,
        mode,
        options,
        chosen,
        resolved,
        keras=_node_keras(resolved.legacy_keras, tfos_face),
        num_gpus=requested_gpus(tf_args),  # TFoS's tf_args.num_gpus: how many GPUs each node takes
        tfos_face=tfos_face,
        work=(work, tf_args),
        serves=row.serves,
        launcher=launcher,
        on_report=on_report,
    )
    plan.check_port_range()  # a range too small for one host fails here, before anything starts
    return plan


@dataclass(frozen=True)
class Plan:
    """What :func:`prepare` worked out before any server or node exists; :meth:`start` starts it.

    It also forms each attempt (:meth:`form`): a restart starts the same plan again, with a
    fresh rendezvous server and secret.
    """

    sc: SparkContext
    host: str  #: the driver's address executors reach (:func:`driver_host`)
    roles: list[NodeRole]
    mode: InputMode
    options: ClusterOptions
    settings: Settings  #: as given (the service beside a cluster starts with them too)
    resolved: Resolved
    keras: str  #: ``NodeConfig.legacy_keras``
    num_gpus: int | None
    tfos_face: bool
    work: tuple[Callable[[Any, Any], Any], Any]  #: ``(program, tf_args)``: what every node runs
    serves: bool  #: the workers only serve a TF server (:mod:`.programs`)
    launcher: Launcher | None = None  #: None: a Spark job, a barrier stage where Spark has one
    on_report: Callable[[Report], Any] | None = None
    cluster_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def num_executors(self) -> int:
        """How many nodes the cluster has (driver-side ps nodes included)."""
        return len(self.roles)

    def start(
        self,
        handle: Callable[[Running], _H],
        data_target: str | None = None,
        on_end: Callable[[], None] | None = None,
        *,
        hold: str | None = None,
        hand_over: bool = False,
    ) -> _H:
        """Start the nodes and hand the running cluster to ``handle`` (``Cluster``); torn down if either fails.

        ``data_target``: the tf.data service's dispatcher, told to every node
        (``ctx.data_service``; None: no service); ``on_end()`` runs once the running cluster's
        nodes stop (the service beside it), not when it cannot start. ``hold``: a job whose one
        task the driver holds itself in every node's spec (``"chief"``), its port reserved here
        (:func:`reserve_task`, ``hand_over`` as there) and handed to the
        handle in ``Running.held``; released if the start fails.

        Examples
        --------
        >>> cluster = prepare(sc, main_fun, args, 2, ClusterOptions(), Settings()).start(Cluster)  # doctest: +SKIP
        """
        self.check_port_range(hold)
        held = reserve_task(self.host, hold, hand_over=hand_over, port_range=self.resolved.port_range) if hold else None
        try:
            return self._launch(handle, data_target, on_end, held)
        except BaseException:
            if held is not None:
                held.release()
            raise

    def _launch(
        self,
        handle: Callable[[Running], _H],
        data_target: str | None,
        on_end: Callable[[], None] | None,
        held: Reserved | None,
    ) -> _H:
        """:meth:`start`, its port (if any) reserved: wire the parts once, start the nodes, hand them on."""
        from pyspark import cloudpickle

        driver_tasks = {held.task: [held.address]} if held else {}
        use_barrier = self.launcher is None and barrier_supported(self.sc)
        launcher = self.launcher or SparkLauncher(self.sc, barrier=use_barrier)
        reports = ReportLog(self.on_report)
        running: list[Attempts] = []  # the one Attempts, once made: LiveNodes asks it for the running gang
        nodes = LiveNodes(lambda: running[0].gang)
        feeds = Feeds(self.sc, "", nodes)

        def form(attempt: int) -> Gang:
            server, config = self.form(attempt, data_target, driver_tasks)
            feeds.secret_hex = config.secret_hex
            return Gang(server, config, self.roles, launcher, NodeEvents(reports, feeds), feeds.cancel)

        first = form(0)
        streams = Streams(feeds, nodes, label=self.cluster_id[:8], stop_timeout=first.config.stream_stop_timeout)
        reserve = self._reserve_slots if use_barrier else None

        def restartable() -> bool:
            return not (streams.queries or streams.contexts)

        attempts = Attempts(first, self.options.max_restarts, form, reserve, restartable)
        running.append(attempts)
        try:
            payload: bytes = cloudpickle.dumps(self.work)  # type: ignore[no-untyped-call]  # untyped in pyspark
            attempts.begin(payload)
            return handle(Running(self.sc, self.mode, attempts, feeds, streams, reports, on_end, held))
        except BaseException:
            attempts.gang.teardown(grace_secs=0, final=True)  # no restart follows
            raise

    @property
    def heartbeat_secs(self) -> float:
        """Supervisor <-> driver liveness messages: four per ``heartbeat_timeout``, at most 5 s apart."""
        return heartbeat_interval(self.resolved.heartbeat_timeout)

    def form(
        self, attempt: int, data_target: str | None = None, driver_tasks: Mapping[str, Sequence[str]] | None = None
    ) -> tuple[RendezvousServer, NodeConfig]:
        """A rendezvous server with a fresh secret, and the nodes' config for ``attempt``."""
        secret = new_secret()
        server = RendezvousServer(
            self.cluster_id,
            self.roles,
            secret,
            self.host,
            self.resolved.server_port or self.resolved.port_range,  # an explicit server_port wins
            bind_host=self.resolved.server_host or None,
            heartbeat_secs=self.heartbeat_secs,
            heartbeat_timeout=self.resolved.heartbeat_timeout,
            fixed_tasks=driver_tasks,
        )
        return server, self.node_config(server.address, secret, attempt, data_target)

    def node_config(
        self, address: tuple[str, int], secret: bytes, attempt: int, data_target: str | None = None
    ) -> NodeConfig:
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
            data_service=data_target,
            **self.resolved.node_fields(),
        )

    def ports_needed(self, hold: str | None = None) -> dict[str, list[str]]:
        """What takes a port of ``port_range`` on the driver's host and on each node's: ``{"the
        driver": [...], "worker:0": [...], ...}`` (``hold``: the driver's task, as for :meth:`start`).

        The least each host needs: nodes that share a host (or the driver's) need the sum of theirs.
        """
        o, r = self.options, self.resolved
        beside = o.data_service if o.data_service_on == "nodes" else 0
        chief = next((role for role in self.roles if role.job_name in CHIEF_ROLES), None)
        chief = chief or next((role for role in self.roles if role.job_name == "worker"), None)
        driver = [] if r.server_port else ["the rendezvous server"]
        driver += [f"the driver's {hold} task"] if hold else []
        driver += ["the tf.data dispatcher"] if beside else []
        needs: dict[str, list[str]] = {"the driver": driver}
        for role in self.roles:
            mine = ["its TF port"]
            mine += ["its feed server"] if self.mode is InputMode.SPARK and role.job_name in DATA_ROLES else []
            mine += ["TensorBoard"] if o.tensorboard and role is chief and not r.tensorboard_port else []
            mine += ["its tf.data worker"] if role.executor_id < beside else []
            if role.on_driver:
                needs["the driver"] += [f"{role.name}'s {what.removeprefix('its ')}" for what in mine]
            else:
                needs[role.name] = mine
        return needs

    def check_port_range(self, hold: str | None = None) -> None:
        """A ConfigError, before anything starts, where ``port_range`` is smaller than what one
        host needs at least (:meth:`ports_needed`): naming the setting, the range and what needs the ports."""
        spec = self.resolved.port_range
        if not spec:
            return
        size = len(range_ports(spec))
        where, needs = max(self.ports_needed(hold).items(), key=lambda item: len(item[1]))
        if len(needs) > size:
            raise ConfigError(
                f"port_range {spec!r} holds {size} port{'s' * (size != 1)}, but {where} needs {len(needs)} on its "
                f"host: {', '.join(needs)}. Every server of the cluster takes its own port of the range on its "
                f"host (docs/ports.md); widen the range with {PORT_RANGE_KEYS}"
            )

    @property
    def server_restarts(self) -> int:
        """How often each worker that only serves restarts in place (executor/supervisor.py); 0 elsewhere."""
        return max(SERVER_RESTARTS, self.options.max_restarts) if self.serves else 0

    def _reserve_slots(self) -> None:
        """Barrier stages need every task slot at once: wait for them, or say which settings to change."""
        needed = sum(1 for r in self.roles if not r.on_driver)
        timeout = float(self.options.reservation_timeout)
        slots = wait_for_slots(self.sc, needed, timeout)
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
