"""``tfonspark.distribute.strategy()``: all of TF's CommunicationOptions, as arguments and from the node's environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tfonspark.distribute import strategies
from tfonspark.errors import ConfigError

_SHOW = textwrap.dedent(
    """
    import json, sys
    from tfonspark.distribute import strategy
    made = strategy(**json.loads(sys.argv[1]))
    options = made.extended._communication_options
    print(json.dumps({"bytes_per_pack": options.bytes_per_pack, "timeout_seconds": options.timeout_seconds,
                      "implementation": options.implementation.name}))
    """
)


def _options(kwargs: dict, env: dict | None = None) -> dict:
    """The options of the strategy a fresh process makes (a process holds one strategy)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TFONSPARK_COLLECTIVE") and k != "TF_CONFIG"}
    environ.update(env or {}, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(
        [sys.executable, "-c", _SHOW, json.dumps(kwargs)], env=environ, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_communication_option_given_reaches_the_strategy():
    given = _options({"communication": "ring", "bytes_per_pack": 4096, "timeout_seconds": 7.5})
    assert given == {"bytes_per_pack": 4096, "timeout_seconds": 7.5, "implementation": "RING"}


def test_the_options_not_given_come_from_the_nodes_environment(monkeypatch):
    monkeypatch.delenv(strategies.BYTES_PER_PACK_ENV, raising=False)
    monkeypatch.delenv(strategies.COLLECTIVE_TIMEOUT_ENV, raising=False)
    assert (strategies._bytes_per_pack(None), strategies._timeout_seconds(None)) == (0, None)
    monkeypatch.setenv(strategies.BYTES_PER_PACK_ENV, "1024")
    monkeypatch.setenv(strategies.COLLECTIVE_TIMEOUT_ENV, "30")
    assert (strategies._bytes_per_pack(None), strategies._timeout_seconds(None)) == (1024, 30.0)
    assert (strategies._bytes_per_pack(8), strategies._timeout_seconds(2)) == (8, 2.0)  # an argument wins


@pytest.mark.parametrize(
    "kwargs, named",
    [
        ({"bytes_per_pack": -1}, "bytes_per_pack"),
        ({"bytes_per_pack": 1.5}, "bytes_per_pack"),
        ({"timeout_seconds": 0}, "timeout_seconds"),
        ({"timeout_seconds": float("inf")}, "timeout_seconds"),
    ],
)
def test_an_option_out_of_range_is_a_config_error_naming_it(kwargs, named):
    with pytest.raises(ConfigError, match=rf"{named} must be .*Received"):
        strategies.strategy(**kwargs)


def test_a_bad_value_in_the_environment_names_the_variable(monkeypatch):
    monkeypatch.setenv(strategies.COLLECTIVE_TIMEOUT_ENV, "soon")
    with pytest.raises(ConfigError, match=f"{strategies.COLLECTIVE_TIMEOUT_ENV} must be .*'soon'"):
        strategies.strategy()
