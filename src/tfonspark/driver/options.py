"""The options of a cluster start, given once: :class:`ClusterOptions` and ``run()``'s keywords.

:class:`ClusterOptions` is the one list of the options (TFoS's of ``TFCluster.run``, then
tfonspark's); :class:`RunOptions`, the keyword arguments of :func:`tfonspark.run`, names the same
fields for ``Unpack``, where Python's typing cannot derive a ``TypedDict`` from a dataclass:
``tests/unit/driver/test_options.py`` holds the two against each other, name by name and type by type.
:class:`SettingKeywords` are the fields of :class:`~tfonspark.settings.Settings` as keywords.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from ..config import InputMode
from ..errors import ConfigError
from ..settings import Settings
from ..tfprocess.debugging import Debug

__all__ = ["PLACES", "ClusterOptions", "RunOptions", "SettingKeywords", "service_workers", "split_options"]

#: ``data_service_on``: tf.data workers on executors of their own, or in the TF nodes' processes
PLACES = ("executors", "nodes")


@dataclass(frozen=True)
class ClusterOptions:
    """How ``run()`` lays out and starts the cluster: TFoS's options of ``TFCluster.run`` (in its
    order), then tfonspark's. Each is also a keyword argument of :func:`tfonspark.run` (see there)."""

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
    data_service: int = 0  #: executors reserved for tf.data service workers (driver/services/beside.py)
    data_service_on: str = "executors"  #: where those workers run: one of PLACES


class SettingKeywords(TypedDict, total=False):
    """The fields of :class:`~tfonspark.settings.Settings` as keyword arguments (``None`` = not given)."""

    server_host: str | None
    server_port: int | str | None
    feed_buffer_bytes: int | None
    tensorboard_port: int | None
    bind_host: str | None
    port_range: int | str | None
    heartbeat_timeout: float | None
    collective: str | None
    collective_timeout: float | None
    collective_bytes_per_pack: int | None
    legacy_keras: bool | str | None
    epoch_end_timeout: float | None
    stream_stop_timeout: float | None
    spare_processes: bool | str | None
    fork_server: bool | str | None


class RunOptions(SettingKeywords, total=False):
    """The keyword arguments of :func:`tfonspark.run` after ``launcher``: the fields of :class:`ClusterOptions`
    (the same names and types, checked by ``tests/unit/driver/test_options.py``) and of
    :class:`~tfonspark.settings.Settings` (a shorthand for ``settings=``)."""

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


def service_workers(options: ClusterOptions) -> int:
    """``options.data_service``, the tf.data workers of ``run(..., data_service=N)``, if a whole number >= 0."""
    count = options.data_service
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ConfigError(f"data_service must be a whole number of executors >= 0. Received: {count!r}")
    return count
