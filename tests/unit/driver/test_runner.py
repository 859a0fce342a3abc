"""driver/runner.py: what run() refuses before any work starts."""

from __future__ import annotations

import pytest

import tfonspark
from tfonspark.config import InputMode
from tfonspark.errors import ConfigError
from tfonspark.testing import FakeSparkContext


def _map_fun(args, ctx):
    return ("coordinated", args, ctx.job_name)


def test_run_refuses_coordinator_without_ps_naming_both():
    with pytest.raises(ConfigError) as info:
        tfonspark.run(FakeSparkContext(), _map_fun, None, 3, coordinator=True)
    assert "coordinator=True" in str(info.value) and "num_ps=0" in str(info.value)


def test_run_refuses_coordinator_in_spark_input_mode():
    with pytest.raises(ConfigError, match="coordinator=True runs map_fun on the chief only") as info:
        tfonspark.run(FakeSparkContext(), _map_fun, None, 3, num_ps=1, coordinator=True, input_mode=InputMode.SPARK)
    assert "InputMode.TENSORFLOW" in str(info.value)
