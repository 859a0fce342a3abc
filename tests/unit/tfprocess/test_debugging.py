"""tf.debugging per node (tfprocess/debugging.py): the Debug option, its trip to the node, the wrapper."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tfonspark import Debug
from tfonspark.config import NodeConfig
from tfonspark.driver.options import split_options
from tfonspark.errors import ConfigError
from tfonspark.tfprocess.debugging import NumericsError, debugged, numerics_error


def test_debug_is_off_by_default_and_checked() -> None:
    assert not Debug().enabled and Debug().to_dict() is None
    assert Debug.from_dict(None) == Debug()
    on = Debug(dump_dir="/tmp/d", log_device_placement=True)
    assert Debug.from_dict(on.to_dict()) == on
    with pytest.raises(ConfigError, match="Debug.check_numerics must be True or False"):
        Debug(check_numerics=1)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="Debug.dump_dir must be None or a directory path"):
        Debug(dump_dir="")
    with pytest.raises(ConfigError, match="check_numerics and dump_dir cannot be on together"):
        Debug(check_numerics=True, dump_dir="/tmp/d")


def test_debug_travels_in_the_node_config() -> None:
    options, _ = split_options({"debug": Debug(check_numerics=True)})
    assert options.debug == Debug(check_numerics=True)
    assert split_options({})[0].debug is None
    config = NodeConfig("c", "h", 1, "ab" * 16, debug=Debug(dump_dir="/logs").to_dict())
    assert Debug.from_dict(NodeConfig.from_json(config.to_json()).debug) == Debug(dump_dir="/logs")
    assert NodeConfig("c", "h", 1, "ab" * 16).debug is None


def test_off_returns_map_fun_and_imports_nothing() -> None:
    code = (
        "import sys\n"
        "from tfonspark.tfprocess.debugging import Debug, debugged\n"
        "f = lambda a, c: a\n"
        "assert debugged(f, Debug(), 'worker', 0) is f\n"
        "assert 'tensorflow' not in sys.modules, 'tensorflow imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_check_numerics_names_op_role_and_index(tmp_path: Path) -> None:
    tf = pytest.importorskip("tensorflow")

    log = tf.function(tf.math.log)

    def map_fun(args: Any, ctx: Any) -> None:
        log(tf.constant([1.0, args]))

    debug = Debug(check_numerics=True)
    with pytest.raises(NumericsError, match=r"op .Log. produced NaN or Inf on worker:1: Detected Infinity or NaN"):
        debugged(map_fun, debug, "worker", 1)(-1.0, None)
    debugged(map_fun, debug, "worker", 1)(2.0, None)  # no NaN: runs through
    log = tf.function(tf.math.log)  # a fresh trace: the last one keeps its CheckNumerics ops
    debugged(map_fun, Debug(dump_dir=str(tmp_path)), "worker", 1)(-1.0, None)  # dumps: no error
    assert (tmp_path / "worker-1").is_dir()
    assert tf.math.log(tf.constant(-1.0)).numpy() != 0  # off again afterwards (NaN, no error)


def test_numerics_error_ignores_other_errors() -> None:
    assert numerics_error(ValueError("shapes differ"), "chief", 0) is None
