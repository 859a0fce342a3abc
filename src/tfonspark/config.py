"""What travels from the driver to every node, validated on construction.

The settings among it are the fields ``NodeConfig`` inherits from
:class:`tfonspark.settings.NodeSettings` (feed buffer, TensorBoard port, bind address, the
``port_range`` every listener of the node takes its port from, heartbeat timeout, collective,
spare processes, and the driver-side waits ``epoch_end_timeout`` and ``stream_stop_timeout``
that the driver's ``Cluster`` reads from its config), resolved once on
the driver by :func:`tfonspark.settings.resolve`; their types, defaults and checks live in
:mod:`tfonspark.settings`, not here.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum

from . import settings
from .errors import ConfigError

__all__ = ["InputMode", "NodeConfig", "this_version"]


def this_version() -> str:
    """This tfonspark's ``__version__`` (its package, loaded before any of its modules is)."""
    return str(getattr(sys.modules.get(__name__.rpartition(".")[0]), "__version__", ""))


class InputMode(IntEnum):
    """How data reaches TensorFlow (values as in TFoS)."""

    TENSORFLOW = 0  #: each node reads its own files
    SPARK = 1  #: Spark RDDs/DataFrames are fed to the nodes


@dataclass(frozen=True)
class NodeConfig(settings.NodeSettings):
    """Everything a node needs to join its cluster; the secret never appears in its repr.

    Its settings (:class:`~tfonspark.settings.NodeSettings`, keyword-only) come from
    :meth:`tfonspark.settings.Resolved.node_fields`, and are checked here again."""

    cluster_id: str
    driver_host: str
    driver_port: int
    secret_hex: str = field(repr=False)
    input_mode: int = InputMode.TENSORFLOW
    tensorboard: bool = False
    log_dir: str | None = None
    release_port: bool = True
    reservation_timeout: float = 600.0
    default_fs: str = "file://"
    chief_job: str = "worker"
    heartbeat_secs: float = 5.0  # supervisor <-> driver liveness messages
    # Keras 2 for the TF process: "" = leave it (Keras 3 unless the user set TF_USE_LEGACY_KERAS),
    # "auto" = TF_USE_LEGACY_KERAS=1 where tf_keras is installed on the node, "on" = required
    legacy_keras: str = ""
    tfos_face: bool = False  # started by the TFoS face (TFCluster.run, pipeline.TFEstimator)
    num_gpus: int | None = None  # tf_args.num_gpus (executor/gpus.py); None = not given
    attempt: int = 0  # 0 for the first start of the cluster, n after the driver's n-th restart (ctx.attempt)
    server_restarts: int = 0  # times a worker that only serves (PS training) restarts in place; 0: never
    keep_spare: bool = False  # a restart may follow (attempt < max_restarts): keep a warm spare TF process
    debug: dict[str, object] | None = None  # tf.debugging per node (tfprocess/debugging.Debug.to_dict); None: off
    data_service: str | None = None  # the tf.data dispatcher of run(data_service=N), "grpc://host:port"
    # settings read on the node too that the driver took as the default (the node's own variable may
    # replace those only); None: not known (a config made by hand), compare with the default
    defaulted: tuple[str, ...] | None = None
    # the driver's tfonspark: a node task refuses another one on its executor (executor/preflight.py)
    version: str = field(default_factory=this_version)

    def __post_init__(self) -> None:
        if self.input_mode not in (InputMode.TENSORFLOW, InputMode.SPARK):
            raise ConfigError(
                f"input_mode must be InputMode.TENSORFLOW (0) or InputMode.SPARK (1). Received: {self.input_mode!r}"
            )
        settings.check_timeout("reservation_timeout", self.reservation_timeout)
        if self.legacy_keras not in ("", "auto", "on"):
            raise ConfigError(f"legacy_keras must be '', 'auto' or 'on'. Received: {self.legacy_keras!r}")
        if self.num_gpus is not None and (isinstance(self.num_gpus, bool) or self.num_gpus < 0):
            raise ConfigError(f"num_gpus must be None or a whole number >= 0. Received: {self.num_gpus!r}")
        if isinstance(self.attempt, bool) or not isinstance(self.attempt, int) or self.attempt < 0:
            raise ConfigError(f"attempt must be a whole number >= 0. Received: {self.attempt!r}")
        if len(self.secret_hex) < 32:
            raise ConfigError("the cluster secret is too short")
        for name in settings.CONFIG_SETTINGS:
            settings.check(name, getattr(self, name), source="NodeConfig")
        if self.defaulted is not None:  # from JSON: a list
            object.__setattr__(self, "defaulted", tuple(str(name) for name in self.defaulted))

    def on_node(self, environ: Mapping[str, str] | None = None) -> NodeConfig:
        """This config as a node sees it: settings also read on the node (``TENSORBOARD_PORT``,
        ``TFONSPARK_COLLECTIVE``) take the node's own variable where the driver had the default."""
        known = self.defaulted
        changes = {
            s.name: settings.node_value(
                s.name, getattr(self, s.name), environ, defaulted=None if known is None else s.name in known
            )
            for s in settings.SETTINGS
            if s.on_node
        }
        return dataclasses.replace(self, **changes)

    @property
    def secret(self) -> bytes:
        """The cluster secret that authenticates every connection."""
        return bytes.fromhex(self.secret_hex)

    def to_json(self) -> str:
        """JSON for the bootstrap a node process reads (the secret included: it travels on a pipe)."""
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> NodeConfig:
        """The inverse of :meth:`to_json`."""
        return cls(**json.loads(text))
