"""Every cluster setting in one table, resolved in one place, on the driver.

A setting is read from the first of these that has it:

1. the code: a field of :class:`Settings` passed as ``tfonspark.run(..., settings=Settings(...))``,
   or the same name as a keyword argument of ``run()`` (a shorthand merged into that
   ``Settings`` by :meth:`Settings.merged`); ``None`` = not given,
2. the Spark conf key ``spark.tfonspark.<camelCase name>``,
3. the driver's environment variable (names kept from TFoS where TFoS had them, else
   ``TFONSPARK_*``; an older name of ours is still read after the current one),
4. the default written in :data:`SETTINGS`.

:func:`resolve` does this once, in ``run()``, into :class:`Resolved`; what the cluster needs of
it (:class:`NodeSettings`) travels in ``NodeConfig``, which inherits those fields; nothing else
reads these variables on the driver. Two settings are also read on the node, because code there
read them before tfonspark existed: ``TENSORBOARD_PORT`` (TFoS read it on the executor) and
``TFONSPARK_COLLECTIVE`` (read by :func:`tfonspark.distribute.strategy`, which also runs outside
tfonspark). A node's own variable is used where the driver resolved the default (see
:func:`node_value`).

A bad value raises :class:`~tfonspark.errors.ConfigError` naming the key it came from, what is
valid and where it was read: ``TFOS_FEED_BUFFER_BYTES must be an integer >= 1048576 (1 MiB).
Received: 'abc' (from the environment)``. This module imports nothing heavy: the supervisor and
the TF process read it too.

Each wait has one setting (or one argument) and one meaning: ``feed_timeout`` (an argument of
``train()``/``inference()``) is how long a feed may make no progress; ``epoch_end_timeout`` how
long a restartable ``train()`` waits for its last epoch to be read; ``stream_stop_timeout`` how
long a graceful stop waits for a running micro-batch; ``heartbeat_timeout`` how long a silent
peer counts as alive. The waits derived from them (the feed server's holding limit, the
feed's pacing, heartbeats ...) are functions here, and rows of
:data:`tfonspark.settings_doc.DERIVED_WAITS`, which docs/settings.md lists.

A setting is declared once, as its row of :data:`SETTINGS`: keys, default, rule, meaning. The
docstring of :class:`Settings`, docs/settings.md's table (:mod:`tfonspark.settings_doc`) and
``NodeConfig``'s fields with their defaults are made from it. Where mypy must see a real type,
a typed declaration stays: a field of :class:`Settings` (what code may give), a key of
``SettingKeywords`` (the same, as keyword arguments of ``run()``), and a field of
:class:`Resolved`, or of :class:`NodeSettings` if the nodes need it (the value).
``tests/unit/test_settings.py`` checks each against the table and names every place a new
setting is still missing from.
"""

from __future__ import annotations

import dataclasses
import os
import re
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from . import parsers
from .errors import ConfigError

__all__ = [
    "COLLECTIVES",
    "BYTES_PER_PACK_ENV",
    "COLLECTIVE_ENV",
    "COLLECTIVE_TIMEOUT_ENV",
    "CONFIG_SETTINGS",
    "DEFAULT_COLLECTIVE",
    "DEFAULT_FEED_BUFFER_BYTES",
    "DEFAULT_EPOCH_END_TIMEOUT",
    "DEFAULT_HEARTBEAT_TIMEOUT",
    "DEFAULT_STREAM_STOP_TIMEOUT",
    "FEED_FIRST_MESSAGE_SECS",
    "FEED_STARVED_SECS",
    "FEED_WAIT_WARNING_SECS",
    "LEGACY_KERAS_MODES",
    "MAX_TIMEOUT_SECONDS",
    "MIN_FEED_BUFFER_BYTES",
    "SETTINGS",
    "NodeSettings",
    "Resolved",
    "Setting",
    "Settings",
    "check",
    "check_timeout",
    "feed_connect_timeout",
    "feed_hold_limit",
    "heartbeat_interval",
    "node_value",
    "pace_interval",
    "pace_quiet_limit",
    "port_range",
    "resolve",
]

MiB = 1024 * 1024
DEFAULT_FEED_BUFFER_BYTES = 64 * MiB
"""Bytes a node buffers per feed queue before backpressure stalls the feeders."""
MIN_FEED_BUFFER_BYTES = 1 * MiB
DEFAULT_HEARTBEAT_TIMEOUT = 10.0
"""Seconds of control-channel silence after which a node (or the driver) is taken as gone."""
DEFAULT_EPOCH_END_TIMEOUT = 600.0
"""Seconds a restartable ``train()`` waits, without progress, for its last epoch to be read."""
DEFAULT_STREAM_STOP_TIMEOUT = 600.0
"""Seconds a graceful stop of a stream waits for its running micro-batch."""
MAX_TIMEOUT_SECONDS = 7 * 24 * 3600
"""The longest timeout any setting may have: a week (604800 s).

Timeouts end up in ``socket.settimeout`` (fails past ~1e9 s), ``selectors``/``epoll``
(milliseconds in a C int: fails past 24.8 days) and ``threading`` waits; a week is far inside
all of them, and longer than any wait that still means "not gone"."""
_TIMEOUT_VALID = f"a number of seconds > 0 and <= {MAX_TIMEOUT_SECONDS} (a week)"
COLLECTIVES = ("auto", "ring", "nccl")
"""Collective implementations of ``MultiWorkerMirroredStrategy`` (``CommunicationImplementation``)."""
DEFAULT_COLLECTIVE = "auto"
COLLECTIVE_ENV = "TFONSPARK_COLLECTIVE"
#: the rest of TF's CommunicationOptions, read by tfonspark.distribute.strategy() on the node
COLLECTIVE_TIMEOUT_ENV = "TFONSPARK_COLLECTIVE_TIMEOUT"
BYTES_PER_PACK_ENV = "TFONSPARK_COLLECTIVE_BYTES_PER_PACK"
"""The variable :func:`tfonspark.distribute.strategy` reads in the TF process."""
LEGACY_KERAS_MODES = ("auto", "on", "off")
"""``legacy_keras``: ``auto`` = Keras 2 (tf_keras) for the TFoS face where installed, ``on``, ``off``."""

_ARGUMENT = "the keyword argument"
_CONF = "the Spark conf"
_ENVIRONMENT = "the environment"
_NODE_ENVIRONMENT = "the node's environment"
_DEFAULT = "the default"


# ---- the settings' own rules (the generic ones are in parsers.py): raw value -> value or ValueError


def port_range(spec: str) -> tuple[int, int]:
    """``"5000"`` or ``"5000-5010"`` as ``(low, high)``; ``""`` is ``(0, 0)`` (any free port).

    Raises ValueError for anything else (ports past 65535 included: ``bind`` raises
    OverflowError, not OSError, for them).
    """
    text = spec.strip()
    if not text:
        return 0, 0
    low_text, sep, high_text = text.partition("-")
    low = int(low_text)
    high = int(high_text) if sep else low
    if not 0 <= low <= high <= 65535:
        raise ValueError
    return low, high


def _port_spec(raw: object) -> str:
    """A port (int or text) or a range ``low-high``, normalised to text (``""`` = any free port)."""
    if isinstance(raw, bool) or not isinstance(raw, (int, str)):
        raise ValueError
    low, high = port_range(str(raw))
    if (low, high) == (0, 0):
        return ""
    return str(low) if low == high else f"{low}-{high}"


def _port_range_spec(raw: object) -> str:
    """``port_range``: a range ``low-high`` or one port, normalised as :func:`_port_spec` does
    (``""``: not confined). A bound of 0 is refused: port 0 means "any port", not a port."""
    spec = _port_spec(raw)
    if spec and port_range(spec)[0] == 0:
        raise ValueError
    return spec


def _feed_bytes(raw: object) -> int:
    return parsers.integer(raw, minimum=MIN_FEED_BUFFER_BYTES)


def _collective_timeout(raw: object) -> float:
    """``collective_timeout``: 0 (no timeout) or a timeout in seconds, as :func:`_timeout`."""
    if str(raw).strip() in ("0", "0.0"):
        return 0.0
    return _timeout(raw)


def _bytes_per_pack(raw: object) -> int:
    return parsers.integer(raw, minimum=0)


def _timeout(raw: object) -> float:
    """A timeout: seconds > 0 and at most :data:`MAX_TIMEOUT_SECONDS` (nan and inf are refused)."""
    return parsers.seconds(raw, longest=MAX_TIMEOUT_SECONDS)


_KERAS_SYNONYMS = {"true": "on", "1": "on", "yes": "on", "false": "off", "0": "off", "no": "off"}


def _legacy_keras(raw: object) -> str:
    """``auto``/``on``/``off``; booleans and the usual spellings of them (``true``, ``0``...) too."""
    if isinstance(raw, bool):
        return "on" if raw else "off"
    return parsers.word(raw, LEGACY_KERAS_MODES, _KERAS_SYNONYMS)


def _collective(raw: object) -> str:
    return parsers.word(raw, COLLECTIVES)


# ---- the table --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    """One knob: where it is read from, its default, and what a valid value is."""

    name: str  #: keyword argument of ``run()``, field of :class:`Settings` and of :class:`Resolved`
    conf_key: str
    env: tuple[str, ...]  #: the documented variable first; later ones are older names still read
    default: Any  #: of the type of the value (the :class:`Resolved` field's), as ``parse`` returns it
    parse: Callable[[object], Any] = field(repr=False)
    valid: str  #: completes "<key> must be ..."
    meaning: str
    default_text: str = ""  #: the default as the docs say it, where ``repr(default)`` would not do
    on_node: bool = False  #: also read from the node's own environment where the driver has the default

    def describe_default(self) -> str:
        """The default as the settings table shows it."""
        return self.default_text or f"`{self.default!r}`"


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "server_host",
        "spark.tfonspark.serverHost",
        ("TFOS_SERVER_HOST",),
        "",
        parsers.text,
        "an address or host name",
        "address the driver's rendezvous server binds (a wildcard is bound but never advertised)",
        default_text="`spark.driver.host`",
    ),
    Setting(
        "server_port",
        "spark.tfonspark.serverPort",
        ("TFOS_SERVER_PORT",),
        "",
        _port_spec,
        "a port or a range like 5000-5010 (0-65535)",
        "port of the driver's rendezvous server, or a range (`5000-5010`) to take the first free port of",
        default_text="any free port",
    ),
    Setting(
        "feed_buffer_bytes",
        "spark.tfonspark.feedBufferBytes",
        ("TFONSPARK_FEED_BUFFER_BYTES", "TFOS_FEED_BUFFER_BYTES"),
        DEFAULT_FEED_BUFFER_BYTES,
        _feed_bytes,
        f"an integer >= {MIN_FEED_BUFFER_BYTES} (1 MiB)",
        "bytes each node buffers per feed queue before backpressure stalls the feeders",
        default_text="64 MiB",
    ),
    Setting(
        "tensorboard_port",
        "spark.tfonspark.tensorboardPort",
        ("TENSORBOARD_PORT",),
        0,
        parsers.port,
        "an integer port 0-65535 (0 = a free port)",
        "TensorBoard's port on the chief (`tensorboard=True`); also read on the node, as in TFoS",
        default_text="a free port",
        on_node=True,
    ),
    Setting(
        "bind_host",
        "spark.tfonspark.bindHost",
        ("TFONSPARK_BIND_HOST",),
        "",
        parsers.text,
        "an address or host name",
        "address node servers (feed server, TensorBoard) bind, e.g. `0.0.0.0` behind NAT",
        default_text="the node's advertised address",
    ),
    Setting(
        "port_range",
        "spark.tfonspark.portRange",
        ("TFONSPARK_PORT_RANGE",),
        "",
        _port_range_spec,
        "a port range like 40000-40100, or one port (1-65535)",
        "the ports every server of tfonspark and its TF processes listens on, for a firewall: the "
        "rendezvous server (unless `server_port` is set), feed servers, TF's gRPC servers, TensorBoard "
        "(unless `tensorboard_port` is set), the tf.data dispatcher and workers; each takes the first free "
        "port of the range on its host ([ports](ports.md))",
        default_text="any free port",
    ),
    Setting(
        "heartbeat_timeout",
        "spark.tfonspark.heartbeatTimeout",
        ("TFONSPARK_HEARTBEAT_TIMEOUT",),
        DEFAULT_HEARTBEAT_TIMEOUT,
        _timeout,
        _TIMEOUT_VALID,
        "seconds of control-channel silence after which a node (or the driver) is taken as gone",
        default_text="10 s",
    ),
    Setting(
        "collective",
        "spark.tfonspark.collective",
        (COLLECTIVE_ENV,),
        DEFAULT_COLLECTIVE,
        _collective,
        f"a collective implementation: one of {', '.join(COLLECTIVES)}",
        "collective implementation (`auto`, `ring`, `nccl`) of `tfonspark.distribute.strategy()`; also read on the node",
        default_text="`auto`",
        on_node=True,
    ),
    Setting(
        "collective_timeout",
        "spark.tfonspark.collectiveTimeout",
        (COLLECTIVE_TIMEOUT_ENV,),
        0.0,
        _collective_timeout,
        "0 (no timeout) or a number of seconds > 0 and <= 604800 (a week)",
        "seconds a collective of `tfonspark.distribute.strategy()` waits for its peers (TF's "
        "`CommunicationOptions.timeout_seconds`): then `DeadlineExceededError` instead of a hang on a lost "
        "host, and the driver's `NodeFailed` names first the peer it waited on where that peer's supervisor "
        "has gone silent; also read on the node",
        default_text="0 (no timeout)",
        on_node=True,
    ),
    Setting(
        "collective_bytes_per_pack",
        "spark.tfonspark.collectiveBytesPerPack",
        (BYTES_PER_PACK_ENV,),
        0,
        _bytes_per_pack,
        "a whole number of bytes >= 0",
        "gradients are all-reduced in packs of about this many bytes (TF's "
        "`CommunicationOptions.bytes_per_pack`; 0: TF's choice); also read on the node",
        default_text="0 (TF's choice)",
        on_node=True,
    ),
    Setting(
        "legacy_keras",
        "spark.tfonspark.legacyKeras",
        ("TFONSPARK_LEGACY_KERAS",),
        "auto",
        _legacy_keras,
        "one of auto, on, off (or true/false)",
        "Keras 2 (`tf_keras`, `TF_USE_LEGACY_KERAS=1`) in the TF processes: `auto` = for the TFoS face "
        "(`TFCluster.run`, `pipeline.TFEstimator`) where `tf_keras` is installed, `on` = always, `off` = Keras 3",
        default_text="`auto`",
    ),
    Setting(
        "epoch_end_timeout",
        "spark.tfonspark.epochEndTimeout",
        ("TFONSPARK_EPOCH_END_TIMEOUT",),
        DEFAULT_EPOCH_END_TIMEOUT,
        _timeout,
        _TIMEOUT_VALID,
        "seconds `train()` of a restartable cluster (`max_restarts` > 0) waits, while no node reports "
        "progress, for the data nodes to read its last epoch to the end before it returns (with a warning)",
        default_text="600 s",
    ),
    Setting(
        "stream_stop_timeout",
        "spark.tfonspark.streamStopTimeout",
        ("TFONSPARK_STREAM_STOP_TIMEOUT",),
        DEFAULT_STREAM_STOP_TIMEOUT,
        _timeout,
        _TIMEOUT_VALID,
        "seconds a graceful stop of a streaming query waits for its running micro-batch "
        "(at most what is left of `shutdown(timeout=...)`)",
        default_text="600 s",
    ),
    Setting(
        "spare_processes",
        "spark.tfonspark.spareProcesses",
        ("TFONSPARK_SPARE_PROCESSES",),
        True,
        parsers.switch,
        "on or off (or true/false, yes/no, 1/0)",
        "warm TF processes (TensorFlow imported, idle) for faster restarts: a spare per chief/worker while a "
        "restart may follow (`max_restarts`), a standby per worker that restarts in place (`ps_cluster`, "
        "`coordinator=True`); `off` starts neither, saving one idle TF process's memory per node "
        "([restarts](restarts.md)): restarts then start new processes (slower)",
        default_text="`on`",
    ),
    Setting(
        "fork_server",
        "spark.tfonspark.forkServer",
        ("TFONSPARK_FORK_SERVER",),
        True,
        parsers.switch,
        "on or off (or true/false, yes/no, 1/0)",
        "TF processes forked from one process per executor that has imported TensorFlow once and stays "
        "while the executor lives (idle for 5 minutes, it exits): a node then starts without importing "
        "TensorFlow again, saving 5-10 s of CPU per TF process; the nodes that use GPUs always start "
        "new processes. `off` starts every TF process anew and keeps no idle process on the executor "
        "([architecture](architecture.md))",
        default_text="`on`",
    ),
)

_BY_NAME = {s.name: s for s in SETTINGS}


@dataclass(frozen=True)
class Settings:
    """Settings chosen in code, for ``tfonspark.run(..., settings=Settings(...))``.

    A field left at ``None`` is read from the Spark conf key, else the environment variable, else
    its default (see :data:`SETTINGS`); a given one wins over all three. Values are checked here,
    so a bad one fails where it is written. One field per row of :data:`SETTINGS`, which also
    writes the Parameters of this docstring (``help(Settings)``).

    Examples
    --------
    >>> Settings(heartbeat_timeout=30).given()
    {'heartbeat_timeout': 30}
    >>> cluster = tfonspark.run(sc, main_fun, args, 2, settings=Settings(heartbeat_timeout=30))  # doctest: +SKIP
    """

    server_host: str | None = None
    server_port: int | str | None = None
    feed_buffer_bytes: int | None = None
    tensorboard_port: int | None = None
    bind_host: str | None = None
    port_range: int | str | None = None
    heartbeat_timeout: float | None = None
    collective: str | None = None
    collective_timeout: float | None = None
    collective_bytes_per_pack: int | None = None
    legacy_keras: bool | str | None = None
    epoch_end_timeout: float | None = None
    stream_stop_timeout: float | None = None
    spare_processes: bool | str | None = None
    fork_server: bool | str | None = None

    def __post_init__(self) -> None:
        for name, value in self.given().items():
            _parse(_BY_NAME[name], value, name, _ARGUMENT)

    def given(self) -> dict[str, object]:
        """The fields set (not ``None``), by name."""
        return {s.name: getattr(self, s.name) for s in SETTINGS if getattr(self, s.name) is not None}

    def merged(self, keywords: Mapping[str, Any]) -> Settings:
        """These settings plus ``run()``'s shorthand keyword arguments (``None`` = not given).

        The one path from keyword arguments to settings; a setting given both here and in
        ``keywords`` is a ConfigError, an unknown name too.
        """
        given = {name: value for name, value in keywords.items() if value is not None}
        _check_names(given)
        twice = sorted(set(given) & set(self.given()))
        if twice:
            raise ConfigError(f"settings given both as keyword arguments and in settings=Settings(...): {twice}")
        return dataclasses.replace(self, **given) if given else self


def _rst(text: str) -> str:
    return re.sub(r"`([^`]+)`", r"``\1``", text)


def _parameters(doc: str) -> str:
    """``doc`` with a Parameters section, one entry per row of :data:`SETTINGS`, before its Examples."""
    lines = ["Parameters", "----------"]
    for s in SETTINGS:
        env = " (or ".join(f"``{name}``" for name in s.env) + ")" * (len(s.env) - 1)
        text = f"{s.meaning[:1].upper()}{s.meaning[1:]}: {s.valid}. Else read from ``{s.conf_key}``, then {env}"
        given = Settings.__annotations__.get(s.name, "?")  # a row without its field: the test says where
        lines.append(f"{s.name} : {given.removesuffix(' | None')}, optional")
        lines += textwrap.wrap(
            _rst(f"{text}; default: {s.describe_default()}."),
            96,
            initial_indent="    ",
            subsequent_indent="    ",
            break_long_words=False,
            break_on_hyphens=False,
        )
    return doc.replace("    Examples\n", "".join(f"    {line}\n" for line in lines) + "\n    Examples\n", 1)


Settings.__doc__ = _parameters(Settings.__doc__ or "")


def _default(name: str) -> Any:
    """The default of setting ``name`` (:data:`SETTINGS`), for the typed field that takes it."""
    return _BY_NAME[name].default


@dataclass(frozen=True, kw_only=True)
class NodeSettings:
    """The resolved settings ``NodeConfig`` carries (it inherits these fields): those the nodes
    need, and the driver-side waits the driver's ``Cluster`` reads from its config. The
    rendezvous server's and ``legacy_keras``, which ``run()`` turns into the nodes' choice, stay
    in :class:`Resolved`. What each means and its default: its row of :data:`SETTINGS`."""

    feed_buffer_bytes: int = _default("feed_buffer_bytes")
    tensorboard_port: int = _default("tensorboard_port")  # 0: the node's TENSORBOARD_PORT, else a free port
    bind_host: str = _default("bind_host")  # "": the node's advertised address
    port_range: str = _default("port_range")  # "": any free port; "low-high": every listener of the node in it
    heartbeat_timeout: float = _default("heartbeat_timeout")
    collective: str = _default("collective")  # the TF process's TFONSPARK_COLLECTIVE
    collective_timeout: float = _default("collective_timeout")  # its TFONSPARK_COLLECTIVE_TIMEOUT (0: none)
    collective_bytes_per_pack: int = _default("collective_bytes_per_pack")  # ... _BYTES_PER_PACK (0: TF's)
    epoch_end_timeout: float = _default("epoch_end_timeout")
    stream_stop_timeout: float = _default("stream_stop_timeout")
    spare_processes: bool = _default("spare_processes")
    fork_server: bool = _default("fork_server")


#: The settings ``NodeConfig`` carries (:meth:`Resolved.node_fields`): the fields of :class:`NodeSettings`.
CONFIG_SETTINGS = tuple(f.name for f in dataclasses.fields(NodeSettings))


@dataclass(frozen=True, kw_only=True)
class Resolved(NodeSettings):
    """The resolved value of every setting, and where each came from (see :data:`SETTINGS`): those
    that travel to the nodes (:class:`NodeSettings`) and those that stay on the driver."""

    server_host: str
    server_port: str
    legacy_keras: str
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)
    """name -> "the keyword argument", "the Spark conf", "the environment" or "the default"."""

    def node_fields(self) -> dict[str, Any]:
        """The settings ``NodeConfig`` carries, as its keyword arguments: those the nodes need,
        and the driver-side waits the driver's ``Cluster`` reads from its config (the rendezvous
        server's and ``legacy_keras``, which ``run()`` turns into the nodes' choice, stay here),
        and ``defaulted``: the settings read on the node too that the driver took as the default,
        which the node may take from its own environment (:func:`node_value`)."""
        fields: dict[str, Any] = {name: getattr(self, name) for name in CONFIG_SETTINGS}
        on_node = [s.name for s in SETTINGS if s.on_node]
        known = all(name in self.sources for name in on_node)  # a Resolved made by hand may not know
        fields["defaulted"] = tuple(n for n in on_node if self.sources[n] == _DEFAULT) if known else None
        return fields


class _Conf(Protocol):
    """What :func:`resolve` needs of a ``SparkConf``."""

    def get(self, key: str, /) -> str | None: ...


def _parse(setting: Setting, raw: object, key: str, source: str) -> Any:
    """``setting.parse(raw)``, or a ConfigError naming ``key``, what is valid and ``source``."""
    try:
        return setting.parse(raw)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{key} must be {setting.valid}. Received: {raw!r} (from {source})") from None


def _env_value(setting: Setting, environ: Mapping[str, str], source: str) -> tuple[bool, Any]:
    """``(True, value)`` from the first of ``setting.env`` set (non-empty) in ``environ``."""
    for name in setting.env:
        raw = environ.get(name, "")
        if raw.strip():
            return True, _parse(setting, raw, name, source)
    return False, None


def _resolve_one(setting: Setting, argument: object, conf: _Conf | None, environ: Mapping[str, str]) -> tuple[Any, str]:
    """The value of one setting and the source it came from, first source first."""
    if argument is not None:
        return _parse(setting, argument, setting.name, _ARGUMENT), _ARGUMENT
    raw = conf.get(setting.conf_key) if conf is not None else None
    if raw is not None and raw.strip():
        return _parse(setting, raw, setting.conf_key, _CONF), _CONF
    found, value = _env_value(setting, environ, _ENVIRONMENT)
    if found:
        return value, _ENVIRONMENT
    return setting.default, _DEFAULT


def _check_names(arguments: Mapping[str, object]) -> None:
    unknown = sorted(set(arguments) - set(_BY_NAME))
    if unknown:
        raise ConfigError(f"unknown settings {unknown}; valid: {sorted(_BY_NAME)}")


def resolve(
    arguments: Settings | Mapping[str, object] | None = None,
    conf: _Conf | None = None,
    environ: Mapping[str, str] | None = None,
) -> Resolved:
    """Resolve every setting: keyword argument -> Spark conf -> environment -> default.

    ``arguments``: the :class:`Settings` chosen in code, or a mapping of setting names to
    values (``None`` = not given);
    ``conf`` is the ``SparkConf`` (``sc.getConf()``); ``environ`` defaults to ``os.environ``.
    Raises ConfigError for an unknown name or a bad value, naming where it came from.
    """
    arguments = arguments.given() if isinstance(arguments, Settings) else dict(arguments or {})
    _check_names(arguments)
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for setting in SETTINGS:
        values[setting.name], sources[setting.name] = _resolve_one(setting, arguments.get(setting.name), conf, environ)
    return Resolved(**values, sources=sources)


def check(name: str, value: object, key: str | None = None, source: str = "the argument") -> Any:
    """Validate ``value`` for setting ``name`` where it is given directly in code (a helper's
    argument, a ``NodeConfig`` field); errors name ``key`` (default: ``name``) and ``source``."""
    return _parse(_BY_NAME[name], value, key or name, source)


def check_timeout(name: str, value: object, source: str = "the argument") -> float:
    """``value`` as seconds for a timeout given in code (``feed_timeout``, ``reservation_timeout``...),
    with the settings' rule: > 0 and at most :data:`MAX_TIMEOUT_SECONDS`; else a ConfigError
    naming ``name``, the value received, the valid range and ``source``."""
    try:
        return _timeout(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{name} must be {_TIMEOUT_VALID}. Received: {value!r} (from {source})") from None


def feed_hold_limit(feed_timeout: float) -> float:
    """How long a node's feed server holds a feeder waiting for room (``map_fun`` not reading)
    before it drops the connection: derived from ``feed_timeout``, ``1.5 * feed_timeout + 5`` s,
    always past the feeder's own ``feed_timeout`` so that the feeder reports the stall first
    (``FeedTimeout`` naming the node) and this side only frees what the stalled feed held."""
    return 1.5 * feed_timeout + 5.0


def pace_interval(feed_timeout: float) -> float:
    """While a node holds a training partition's Ack (pacing), how often it tells the waiting
    feeder ``Pending`` so that the feeder's ``feed_timeout`` starts over: a quarter of it."""
    return feed_timeout / 4


def pace_quiet_limit(feed_timeout: float) -> float:
    """How long a held Ack waits while ``map_fun`` reads nothing before it goes anyway: half of
    ``feed_timeout``. A last resort: the driver releases held Acks once holding them can only
    stall (every partition handed out, or another data node starving)."""
    return feed_timeout / 2


def heartbeat_interval(heartbeat_timeout: float) -> float:
    """How often the driver and each supervisor send a ``Heartbeat``: 5 s, or a quarter of
    ``heartbeat_timeout`` if that is shorter."""
    return min(5.0, heartbeat_timeout / 4)


def feed_connect_timeout(feed_timeout: float) -> float:
    """How long a feed task waits to connect (and authenticate) to its node: 30 s at most."""
    return min(FEED_FIRST_MESSAGE_SECS, feed_timeout)


FEED_FIRST_MESSAGE_SECS = 30.0
"""How long a node's feed server waits for a new connection's first message (``FeedStart``)."""
FEED_WAIT_WARNING_SECS = 30.0
"""A wait of the feed that lasts this long is logged as a WARNING on the driver, naming the node."""
FEED_STARVED_SECS = 2.0
"""A node's reader waiting this long for training data, with nothing queued or arriving, reports
it: the driver then releases the Acks the other nodes hold."""


def node_value(
    name: str,
    resolved: Any,
    environ: Mapping[str, str] | None = None,
    source: str = _NODE_ENVIRONMENT,
    defaulted: bool | None = None,
) -> Any:
    """On a node: the driver's ``resolved`` value, or the node's own variable where the driver
    resolved the default (only for settings read on the node, e.g. ``TENSORBOARD_PORT``).

    ``defaulted``: whether the driver took the default, i.e. no keyword, Spark conf or driver
    environment gave the setting (:meth:`Resolved.node_fields` ships it). A value given on the
    driver is never replaced, even one equal to the default (``run(collective="auto")``).
    None (unknown: a config made by hand, or code outside a cluster) compares with the default.
    ``environ`` defaults to ``os.environ``; ``source`` names it in errors.
    """
    setting = _BY_NAME[name]
    if defaulted is None:
        defaulted = resolved == setting.default
    if not setting.on_node or not defaulted:
        return resolved
    found, value = _env_value(setting, os.environ if environ is None else environ, source)
    return value if found else resolved
