"""One settings path: keyword argument -> Spark conf -> environment -> default, resolved once."""

from __future__ import annotations

import dataclasses
import inspect
import re
import selectors
import socket
import threading
import typing
from collections.abc import Sequence
from pathlib import Path

import pytest

import tfonspark
from tfonspark import settings, settings_doc
from tfonspark.config import NodeConfig
from tfonspark.driver import plan as planning
from tfonspark.driver.options import RunOptions, SettingKeywords
from tfonspark.errors import ConfigError
from tfonspark.settings import SETTINGS, resolve
from tfonspark.testing import FakeSparkContext

REPO = Path(__file__).resolve().parents[2]
TFOS_NAMES = {"TFOS_SERVER_HOST", "TFOS_SERVER_PORT", "TENSORBOARD_PORT"}  # what TensorFlowOnSpark read
NODE = {"cluster_id": "settings-test", "driver_host": "127.0.0.1", "driver_port": 1, "secret_hex": "ab" * 32}

#: for each setting: a valid value as an argument, as text, and what the text parses to
VALUES = {
    "server_host": ("10.0.0.1", "10.0.0.2", "10.0.0.2"),
    "server_port": (5000, "5000-5010", "5000-5010"),
    "feed_buffer_bytes": (2 << 20, "3145728", 3 << 20),
    "tensorboard_port": (6006, "6007", 6007),
    "bind_host": ("0.0.0.0", "::", "::"),
    "port_range": (40000, "40000-40100", "40000-40100"),
    "heartbeat_timeout": (30, "12.5", 12.5),
    "collective": ("ring", "NCCL", "nccl"),
    "collective_timeout": (30, "12.5", 12.5),
    "collective_bytes_per_pack": (4096, "1048576", 1 << 20),
    "legacy_keras": ("on", "OFF", "off"),
    "epoch_end_timeout": (30, "45", 45.0),
    "stream_stop_timeout": (20, "7.5", 7.5),
    "spare_processes": (False, "OFF", False),
    "fork_server": (False, "off", False),
}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


# ---- the table ---------------------------------------------------------------------------------


def _where(obj: object) -> str:
    return str(Path(inspect.getsourcefile(obj)).relative_to(REPO))  # type: ignore[arg-type]


def _show(hint: object) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint)


def _owner(cls: type, name: str) -> str:
    """The class of ``cls``'s bases that declares field ``name`` (``NodeSettings`` for ``Resolved``'s shipped ones)."""
    return next(c.__name__ for c in cls.__mro__ if name in c.__dict__.get("__annotations__", {}))


def undeclared(table: Sequence[settings.Setting]) -> list[str]:
    """What is missing or wrong where a setting of ``table`` must be typed, one line per fix.

    A setting is declared once, as its row of ``SETTINGS``. Where mypy must see a real type the
    typed declarations stay, and this is the one check that they agree with the table: a field of
    ``Settings`` (the types code may give, or None), a key of ``SettingKeywords`` (the same, as
    keyword arguments), and a field of ``Resolved`` (the default's type), which the settings the
    nodes need take from ``NodeSettings``, the part ``NodeConfig`` inherits (never redeclares).
    ``Settings``' docstring and docs/settings.md's table are made from the table."""
    names = [s.name for s in table]
    given, keywords = typing.get_type_hints(settings.Settings), typing.get_type_hints(SettingKeywords)
    resolved = {k: v for k, v in typing.get_type_hints(settings.Resolved).items() if k != "sources"}
    shipped = settings.CONFIG_SETTINGS  # what NodeConfig carries
    node_defaults = {f.name: f.default for f in dataclasses.fields(NodeConfig)}
    doc = " ".join((settings.Settings.__doc__ or "").split())
    here, kw_file = _where(settings), _where(SettingKeywords)
    out: list[str] = []
    for s in table:
        kind, name = type(s.default), s.name
        hint = given.get(name)
        if hint is None:
            out.append(f"{name}: add `{name}: {kind.__name__} | None = None` to class Settings ({here})")
        elif not {kind, type(None)} <= set(typing.get_args(hint)):
            out.append(f"{name}: Settings.{name} is `{_show(hint)}`; it must take None (not given) and {kind.__name__}")
        elif dataclasses.fields(settings.Settings)[list(given).index(name)].default is not None:
            out.append(f"{name}: Settings.{name} must default to None (not given)")
        if name not in keywords:
            out.append(
                f"{name}: add `{name}: {_show(hint or kind.__name__ + ' | None')}` to class SettingKeywords ({kw_file})"
            )
        elif hint is not None and keywords[name] != hint:
            out.append(
                f"{name}: SettingKeywords.{name} is `{_show(keywords[name])}`, Settings.{name} `{_show(hint)}`: make them one"
            )
        elif name not in SettingKeywords.__optional_keys__:
            out.append(f"{name}: SettingKeywords.{name} must be optional (total=False): a keyword may be left out")
        if name not in resolved:
            out.append(
                f"{name}: add `{name}: {kind.__name__}` to class Resolved ({here}), or, if the nodes need it, "
                f'`{name}: {kind.__name__} = _default("{name}")` to class NodeSettings there'
            )
        elif resolved[name] is not kind:
            owner = _owner(settings.Resolved, name)
            out.append(
                f"{name}: {owner}.{name} is `{_show(resolved[name])}`, its default {s.default!r} a {kind.__name__}"
            )
        returns = typing.get_type_hints(s.parse).get("return")
        if returns is not None and returns is not kind:
            out.append(
                f"{name}: its parser {s.parse.__qualname__} returns {_show(returns)}, its default a {kind.__name__}"
            )
        if s.on_node and name not in shipped:
            out.append(f"{name}: it is read on the node (on_node=True): declare it in NodeSettings ({here})")
        if name in shipped and name in NodeConfig.__dict__.get("__annotations__", {}):
            out.append(
                f"{name}: NodeConfig declares it again ({_where(NodeConfig)}): remove it, it inherits NodeSettings'"
            )
        if name in shipped and node_defaults.get(name) != s.default:
            out.append(f"{name}: NodeConfig's default {node_defaults.get(name)!r} is not the table's {s.default!r}")
        if f"{name} : " not in doc or " ".join(s.valid.split()) not in doc:
            out.append(f"{name}: Settings' docstring does not describe it: it is made from SETTINGS at import ({here})")
    for where, declared in (("Settings", given), ("SettingKeywords", keywords), ("Resolved", resolved)):
        for name in declared:
            if name not in names:
                out.append(f"{name}: a field of {where} with no row in SETTINGS: add its row ({here}) or remove it")
        if [n for n in declared if n in names] != [n for n in names if n in declared] and where != "Resolved":
            out.append(f"the fields of {where} are not in the order of SETTINGS: {list(declared)}")
    if (REPO / "docs" / "settings.md").read_text(encoding="utf-8").count(settings_doc.markdown_table()) != 1:
        out.append("docs/settings.md: paste `settings_doc.markdown_table()` over its table of settings")
    return out


def test_a_setting_is_declared_once_and_every_typed_declaration_agrees_with_the_table():
    missed = undeclared(SETTINGS)
    if [s.name for s in SETTINGS] != list(VALUES):
        missed.append(
            f"VALUES ({_where(undeclared)}): one valid value per setting, in the table's order: {list(VALUES)}"
        )
    assert not missed, "\n".join(["settings declared in one place but not another:", *missed])


def test_a_setting_added_to_the_table_only_is_told_every_place_to_add():
    """What a developer who adds a row and nothing else reads (the check above, on a planted row)."""
    row = settings.Setting(
        "drain_timeout",
        "spark.tfonspark.drainTimeout",
        ("TFONSPARK_DRAIN_TIMEOUT",),
        30.0,
        next(s for s in SETTINGS if s.name == "heartbeat_timeout").parse,
        "a number of seconds",
        "seconds a node drains its feed",
        on_node=True,
    )
    missed = undeclared((*SETTINGS, row))
    told = [line for line in missed if line.startswith("drain_timeout: ")]
    assert told == [line for line in missed if "drain_timeout" in line]  # the rest holds
    assert any("`drain_timeout: float | None = None` to class Settings (src/tfonspark/settings.py)" in t for t in told)
    assert any("`drain_timeout: float | None` to class SettingKeywords (src/tfonspark/" in t for t in told)
    assert any("`drain_timeout: float` to class Resolved" in t for t in told)
    assert any("declare it in NodeSettings" in t for t in told)
    assert any("Settings' docstring does not describe it" in t for t in told)
    assert len(told) == 5, told
    dropped = undeclared(SETTINGS[1:])
    assert (
        "server_host: a field of Settings with no row in SETTINGS: add its row (src/tfonspark/settings.py) or remove it"
        in dropped
    )
    assert any(line.startswith("server_host: a field of SettingKeywords with no row") for line in dropped)
    assert any(line.startswith("server_host: a field of Resolved with no row") for line in dropped)


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.name)
def test_names_follow_one_scheme(setting):
    assert setting.conf_key == f"spark.tfonspark.{_camel(setting.name)}"
    first = setting.env[0]
    assert first in TFOS_NAMES or first.startswith("TFONSPARK_")  # TFoS's names kept, new ones one prefix
    assert setting.valid and setting.meaning


def test_defaults_are_written_once():
    defaults = resolve(environ={})
    assert defaults == settings.Resolved(**{s.name: s.default for s in SETTINGS})
    assert set(defaults.sources.values()) == {"the default"}
    assert defaults.feed_buffer_bytes == settings.DEFAULT_FEED_BUFFER_BYTES == 64 * 1024 * 1024
    node = NodeConfig(**NODE)  # what a node assumes when a field is missing is the same default
    for name in settings.CONFIG_SETTINGS:
        assert getattr(node, name) == getattr(defaults, name), name


# ---- precedence --------------------------------------------------------------------------------


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.name)
def test_argument_then_conf_then_environment_then_default(setting):
    argument, text, parsed = VALUES[setting.name]
    env = {setting.env[0]: text}
    conf = {setting.conf_key: text}
    name = setting.name
    assert getattr(resolve({name: argument}, conf, env), name) == settings.check(name, argument)
    assert resolve({name: argument}, conf, env).sources[name] == "the keyword argument"
    assert getattr(resolve({name: None}, conf, {}), name) == parsed
    assert resolve({}, conf, {setting.env[0]: "not even close"}).sources[name] == "the Spark conf"
    assert getattr(resolve({}, {}, env), name) == parsed
    assert resolve({}, None, env).sources[name] == "the environment"
    assert getattr(resolve({}, {setting.conf_key: "  "}, {setting.env[0]: ""}), name) == setting.default


def test_the_environment_defaults_to_os_environ(monkeypatch):
    monkeypatch.setenv("TFONSPARK_HEARTBEAT_TIMEOUT", "7")
    assert resolve().heartbeat_timeout == 7.0


def test_an_older_variable_name_is_still_read_after_the_current_one():
    assert resolve(environ={"TFOS_FEED_BUFFER_BYTES": str(2 << 20)}).feed_buffer_bytes == 2 << 20
    both = {"TFOS_FEED_BUFFER_BYTES": str(2 << 20), "TFONSPARK_FEED_BUFFER_BYTES": str(4 << 20)}
    assert resolve(environ=both).feed_buffer_bytes == 4 << 20


# ---- values and errors -------------------------------------------------------------------------


def test_an_error_names_the_key_what_is_valid_and_where_it_came_from():
    with pytest.raises(ConfigError) as info:
        resolve(environ={"TFOS_FEED_BUFFER_BYTES": "abc"})
    assert str(info.value) == (
        "TFOS_FEED_BUFFER_BYTES must be an integer >= 1048576 (1 MiB). Received: 'abc' (from the environment)"
    )
    with pytest.raises(ConfigError, match=r"^spark\.tfonspark\.heartbeatTimeout must be .* \(from the Spark conf\)$"):
        resolve({}, {"spark.tfonspark.heartbeatTimeout": "soon"}, {})
    with pytest.raises(ConfigError, match=r"^tensorboard_port must be .*Received: True \(from the keyword argument\)$"):
        resolve({"tensorboard_port": True}, None, {})


@pytest.mark.parametrize(
    ("name", "bad"),
    [
        ("server_port", "abc"),
        ("server_port", "10-5"),
        ("server_port", "70000"),
        ("server_port", 1.5),
        ("feed_buffer_bytes", "1000"),
        ("feed_buffer_bytes", 0),
        ("feed_buffer_bytes", "64MiB"),
        ("tensorboard_port", "-1"),
        ("tensorboard_port", 65536),
        ("heartbeat_timeout", "0"),
        ("heartbeat_timeout", "-5"),
        ("heartbeat_timeout", "nan"),
        ("heartbeat_timeout", "inf"),
        ("heartbeat_timeout", False),
        ("collective", "carrier-pigeon"),
        ("server_host", 42),
        ("port_range", "40100-40000"),
        ("port_range", "0-100"),
        ("port_range", "40000-70000"),
        ("port_range", "forty"),
        ("port_range", 2.5),
    ],
)
def test_bad_values_are_config_errors(name, bad):
    with pytest.raises(ConfigError, match=rf"^{name} must be .*Received: {re.escape(repr(bad))}"):
        resolve({name: bad}, None, {})


def test_a_timeout_past_the_documented_maximum_is_a_config_error():
    """heartbeat_timeout=1e10 was accepted; the socket timeout then overflowed and the node was
    lost with "Bad file descriptor" after 5 s instead of a ConfigError (issue 21, row 7)."""
    assert settings.MAX_TIMEOUT_SECONDS == 7 * 24 * 3600  # a week: what sockets, selectors and threads accept
    for bad, source, key in [
        (1e10, None, "heartbeat_timeout"),
        ("604801", "conf", "spark.tfonspark.heartbeatTimeout"),
        ("1e300", "env", "TFONSPARK_HEARTBEAT_TIMEOUT"),
    ]:
        arguments = {"heartbeat_timeout": bad} if source is None else {}
        conf = {key: bad} if source == "conf" else None
        env = {key: bad} if source == "env" else {}
        with pytest.raises(ConfigError) as info:
            resolve(arguments, conf, env)
        assert str(info.value).startswith(
            f"{key} must be a number of seconds > 0 and <= 604800 (a week). Received: {bad!r}"
        ), info.value
    with pytest.raises(
        ConfigError, match=r"^heartbeat_timeout must be .*<= 604800.*Received: 10000000000.0 \(from NodeConfig\)"
    ):
        NodeConfig(**NODE, heartbeat_timeout=1e10)
    assert resolve({"heartbeat_timeout": 604800}, None, {}).heartbeat_timeout == 604800.0  # the maximum itself


@pytest.mark.parametrize("name", [s.name for s in SETTINGS if s.name.endswith("timeout")])
def test_every_timeout_setting_has_the_maximum(name):
    with pytest.raises(ConfigError, match=rf"^{name} must be .*<= 604800"):
        resolve({name: settings.MAX_TIMEOUT_SECONDS * 2}, None, {})


@pytest.mark.parametrize("value", [1e10, 10**400, float("inf"), float("nan"), 0, -1, "x", True, None])
def test_check_timeout_names_the_setting_the_value_and_the_range(value):
    with pytest.raises(ConfigError) as info:
        settings.check_timeout("feed_timeout", value)
    assert str(info.value) == (
        f"feed_timeout must be a number of seconds > 0 and <= 604800 (a week). Received: {value!r} (from the argument)"
    )


def test_check_timeout_returns_seconds_as_a_float():
    assert settings.check_timeout("reservation_timeout", 600) == 600.0
    assert settings.check_timeout("reservation_timeout", "0.5") == 0.5


def test_the_maximum_is_one_every_timeout_api_takes():
    longest = settings.MAX_TIMEOUT_SECONDS
    with socket.socket() as sock:
        sock.settimeout(longest)  # 1e10 overflows here
    first, second = socket.socketpair()
    with first, second, selectors.DefaultSelector() as selector:  # epoll counts in int milliseconds: 24.8 days
        second.send(b"x")
        selector.register(first, selectors.EVENT_READ)
        assert selector.select(longest)
    assert longest < threading.TIMEOUT_MAX


def test_values_are_normalised():
    assert resolve({"server_port": " 0 "}, None, {}).server_port == ""  # any free port
    assert resolve({"server_port": "6000-6000"}, None, {}).server_port == "6000"
    assert resolve({"bind_host": " 0.0.0.0 "}, None, {}).bind_host == "0.0.0.0"
    assert resolve({"heartbeat_timeout": 1}, None, {}).heartbeat_timeout == 1.0
    assert settings.port_range("") == (0, 0) and settings.port_range("5-9") == (5, 9)


def test_an_unknown_argument_is_refused():
    with pytest.raises(ConfigError, match=r"unknown settings \['feed_buffer'\]"):
        resolve({"feed_buffer": 1})


# ---- on the node --------------------------------------------------------------------------------


def test_a_node_reads_its_own_variable_where_the_driver_had_the_default():
    node_env = {"TENSORBOARD_PORT": "6010", "TFONSPARK_COLLECTIVE": "ring", "TFONSPARK_FEED_BUFFER_BYTES": "2097152"}
    config = NodeConfig(**NODE).on_node(node_env)
    assert (config.tensorboard_port, config.collective) == (6010, "ring")  # TFoS read TENSORBOARD_PORT there
    assert config.feed_buffer_bytes == settings.DEFAULT_FEED_BUFFER_BYTES  # a driver-only setting
    chosen = NodeConfig(**NODE, tensorboard_port=7000, collective="nccl").on_node(node_env)
    assert (chosen.tensorboard_port, chosen.collective) == (7000, "nccl")  # the driver's choice wins
    with pytest.raises(ConfigError, match=r"TENSORBOARD_PORT must be .*\(from the node's environment\)"):
        NodeConfig(**NODE).on_node({"TENSORBOARD_PORT": "x"})


def test_node_config_checks_the_settings_it_carries():
    with pytest.raises(ConfigError, match=r"^feed_buffer_bytes must be .*Received: 10 \(from NodeConfig\)"):
        NodeConfig(**NODE, feed_buffer_bytes=10)
    with pytest.raises(ConfigError, match="collective"):
        NodeConfig(**NODE, collective="pigeon")
    config = NodeConfig(**NODE, collective="ring", tensorboard_port=6006)
    assert NodeConfig.from_json(config.to_json()) == config


# ---- run() -------------------------------------------------------------------------------------

TFOS_POSITIONAL = [
    "sc",
    "map_fun",
    "tf_args",
    "num_executors",
    "num_ps",
    "tensorboard",
    "input_mode",
    "log_dir",
    "driver_ps_nodes",
    "master_node",
    "reservation_timeout",
    "queues",
    "eval_node",
    "release_port",
]


def test_run_takes_four_positional_arguments_and_every_setting_by_keyword():
    from tfonspark import TFCluster

    params = inspect.signature(tfonspark.run).parameters
    positional = [p.name for p in params.values() if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    assert positional == TFOS_POSITIONAL[:4]
    tfos = inspect.signature(TFCluster.run).parameters
    assert [p.name for p in tfos.values() if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD] == TFOS_POSITIONAL
    for setting in SETTINGS:  # by name, as a shorthand for settings=Settings(...)
        assert setting.name in SettingKeywords.__annotations__
        assert setting.name in RunOptions.__annotations__
    assert params["settings"].kind is inspect.Parameter.KEYWORD_ONLY


def test_settings_by_keyword_and_by_settings_take_one_path():
    chosen = settings.Settings(heartbeat_timeout=30).merged({"collective": "ring", "bind_host": None})
    assert chosen.given() == {"heartbeat_timeout": 30, "collective": "ring"}
    assert resolve(chosen, None, {}).sources["collective"] == "the keyword argument"
    with pytest.raises(ConfigError, match=r"both .*\['heartbeat_timeout'\]"):
        settings.Settings(heartbeat_timeout=30).merged({"heartbeat_timeout": 40})
    with pytest.raises(ConfigError, match="unknown settings"):
        settings.Settings().merged({"heartbeat": 1})
    with pytest.raises(ConfigError, match=r"heartbeat_timeout must be .*Received: -1"):
        settings.Settings(heartbeat_timeout=-1)
    with pytest.raises(TypeError, match="unexpected keyword arguments: queues"):
        tfonspark.run(FakeSparkContext({}), print, None, 1, queues=["input"])


def test_the_feed_hold_limit_is_derived_from_feed_timeout():
    assert settings.feed_hold_limit(10) == 20.0 and settings.feed_hold_limit(600) > 600


class _Stop(Exception):
    pass


def test_run_resolves_once_and_hands_the_values_on(monkeypatch):
    seen: dict[str, object] = {}

    class FakeServer:
        address = ("127.0.0.1", 1)

        def __init__(self, cluster_id, roles, secret, host, port_spec=None, **kwargs):
            seen.update(port_spec=port_spec, **kwargs)

    def fake_begin(plan, *args, **kwargs):
        seen["config"] = plan.form(0)[1]
        raise _Stop

    monkeypatch.setattr(planning, "RendezvousServer", FakeServer)
    monkeypatch.setattr(planning.Plan, "start", fake_begin)
    monkeypatch.setenv("TFONSPARK_BIND_HOST", "0.0.0.0")
    monkeypatch.setenv("TFOS_SERVER_HOST", "127.0.0.2")
    sc = FakeSparkContext({"spark.tfonspark.serverPort": "5000-5009", "spark.tfonspark.collective": "ring"})
    with pytest.raises(_Stop):
        tfonspark.run(sc, print, None, 1, feed_buffer_bytes=2 << 20, settings=settings.Settings(heartbeat_timeout=8))
    assert seen["port_spec"] == "5000-5009" and seen["bind_host"] == "127.0.0.2"
    assert seen["heartbeat_timeout"] == 8.0 and seen["heartbeat_secs"] == 2.0
    config = seen["config"]
    assert isinstance(config, NodeConfig)
    assert (config.feed_buffer_bytes, config.bind_host, config.collective) == (2 << 20, "0.0.0.0", "ring")
    assert (config.heartbeat_timeout, config.tensorboard_port) == (8.0, 0)


def test_run_refuses_a_bad_setting_before_any_work_starts(monkeypatch):
    monkeypatch.setattr(planning, "RendezvousServer", None)  # never reached
    sc = FakeSparkContext({"spark.tfonspark.feedBufferBytes": "lots"})
    with pytest.raises(ConfigError, match=r"spark\.tfonspark\.feedBufferBytes .*\(from the Spark conf\)"):
        tfonspark.run(sc, print, None, 1)


def test_run_refuses_a_malformed_port_range_naming_the_setting_and_the_value(monkeypatch):
    monkeypatch.setattr(planning, "RendezvousServer", None)  # never reached
    with pytest.raises(
        ConfigError, match=r"^port_range must be a port range .*Received: '40100-40000' \(from the keyword"
    ):
        tfonspark.run(FakeSparkContext({}), print, None, 1, port_range="40100-40000")
    sc = FakeSparkContext({"spark.tfonspark.portRange": "40000:40100"})
    with pytest.raises(
        ConfigError, match=r"^spark\.tfonspark\.portRange must be .*Received: '40000:40100' \(from the Spark conf"
    ):
        tfonspark.run(sc, print, None, 1)


def test_run_refuses_a_heartbeat_timeout_that_would_overflow_before_any_work_starts(monkeypatch):
    monkeypatch.setattr(planning, "RendezvousServer", None)  # never reached: no node is lost 5 s later
    with pytest.raises(
        ConfigError, match=r"<= 604800 \(a week\)\. Received: 10000000000\.0 \(from the keyword argument\)$"
    ):
        tfonspark.run(FakeSparkContext({}), print, None, 1, heartbeat_timeout=1e10)


# ---- docs ---------------------------------------------------------------------------------------


# ---- a user's value is never replaced silently (issue 43, item 5) -------------------------------


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.name)
def test_an_explicit_value_equal_to_the_default_still_wins_over_conf_and_environment(setting):
    """The least visible explicit value (the default's, or a falsy one) is the user's choice too."""
    _, text, _ = VALUES[setting.name]
    conf, env = {setting.conf_key: text}, {setting.env[0]: text}
    for given in (setting.default, *(v for v in (0, False, "") if _valid(setting, v))):
        for chosen in ({setting.name: given}, settings.Settings(**{setting.name: given})):
            resolved = resolve(chosen, conf, env)
            assert getattr(resolved, setting.name) == settings.check(setting.name, given), chosen
            assert resolved.sources[setting.name] == "the keyword argument"


def _valid(setting: settings.Setting, value: object) -> bool:
    try:
        settings.check(setting.name, value)
    except ConfigError:
        return False
    return True


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.name)
def test_a_setting_given_both_as_keyword_and_in_settings_is_an_error_even_when_equal(setting):
    value = VALUES[setting.name][0]
    for keyword in (value, setting.default):
        with pytest.raises(ConfigError, match=rf"both as keyword arguments and in settings=.*\['{setting.name}'\]"):
            settings.Settings(**{setting.name: value}).merged({setting.name: keyword})
    merged = settings.Settings(**{setting.name: value}).merged({setting.name: None})  # None: not given
    assert merged.given() == {setting.name: value}


def _conflicting_calls(sc):
    from tfonspark import TFCluster

    both = {"settings": settings.Settings(heartbeat_timeout=30), "heartbeat_timeout": 40}
    return {
        "run": lambda: tfonspark.run(sc, print, None, 1, **both),
        "TFCluster.run": lambda: TFCluster.run(sc, print, None, 1, 0, **both),
        "ps_cluster": lambda: tfonspark.ps_cluster(sc, 1, 1, **both),
        "data_service": lambda: tfonspark.data_service(sc, 1, **both),
    }


@pytest.mark.parametrize("entry", ["run", "TFCluster.run", "ps_cluster", "data_service"])
def test_every_entry_point_refuses_a_setting_given_both_ways_before_any_work(entry, monkeypatch):
    monkeypatch.setattr(planning, "RendezvousServer", None)  # never reached
    call = _conflicting_calls(FakeSparkContext({}))[entry]
    with pytest.raises(ConfigError, match=r"both as keyword arguments and in settings=.*\['heartbeat_timeout'\]"):
        call()


@pytest.mark.parametrize("setting", [s for s in SETTINGS if s.on_node], ids=lambda s: s.name)
def test_an_explicit_driver_value_equal_to_the_default_is_not_replaced_on_the_node(setting):
    node_env = {setting.env[0]: VALUES[setting.name][1]}
    default_text = str(setting.default)
    for chosen, conf in (({setting.name: setting.default}, None), ({}, {setting.conf_key: default_text})):
        resolved = resolve(chosen, conf, {})
        assert resolved.sources[setting.name] != "the default"
        config = NodeConfig(**NODE, **resolved.node_fields()).on_node(node_env)
        assert getattr(config, setting.name) == setting.default, (chosen, conf)
    left = NodeConfig(**NODE, **resolve({}, None, {}).node_fields()).on_node(node_env)  # truly the default
    assert getattr(left, setting.name) == VALUES[setting.name][2]


@pytest.mark.parametrize(
    "raw, value", [(True, "on"), (False, "off"), ("OFF", "off"), ("0", "off"), ("true", "on"), ("auto", "auto")]
)
def test_legacy_keras_setting_takes_modes_and_booleans(raw, value):
    assert settings.resolve({"legacy_keras": raw}, environ={}).legacy_keras == value


def test_legacy_keras_setting_rejects_anything_else_naming_the_key():
    with pytest.raises(ConfigError, match=r"TFONSPARK_LEGACY_KERAS must be one of auto, on, off.*'maybe'"):
        settings.resolve(environ={"TFONSPARK_LEGACY_KERAS": "maybe"})
