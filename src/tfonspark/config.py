"""Settings that travel from the driver to every node, validated on construction."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from enum import IntEnum

from .errors import ConfigError

__all__ = ["InputMode", "NodeConfig"]


class InputMode(IntEnum):
    """How data reaches TensorFlow (values as in TFoS)."""

    TENSORFLOW = 0  #: each node reads its own files
    SPARK = 1  #: Spark RDDs/DataFrames are fed to the nodes


@dataclass(frozen=True)
class NodeConfig:
    """Everything a node needs to join its cluster; the secret never appears in its repr."""

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
    feed_buffer_bytes: int = 64 * 1024 * 1024
    tensorboard_port: int = 0
    bind_host: str = ""  # where node servers bind; "" = the node's advertised address
    heartbeat_secs: float = 5.0  # supervisor <-> driver liveness messages
    heartbeat_timeout: float = 60.0  # silence after which the other side is taken as gone

    def __post_init__(self) -> None:
        if self.input_mode not in (InputMode.TENSORFLOW, InputMode.SPARK):
            raise ConfigError(
                f"input_mode must be InputMode.TENSORFLOW (0) or InputMode.SPARK (1). Received: {self.input_mode!r}"
            )
        if self.reservation_timeout <= 0:
            raise ConfigError(f"reservation_timeout must be > 0 seconds. Received: {self.reservation_timeout!r}")
        if len(self.secret_hex) < 32:
            raise ConfigError("the cluster secret is too short")

    @property
    def secret(self) -> bytes:
        return bytes.fromhex(self.secret_hex)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> NodeConfig:
        return cls(**json.loads(text))
