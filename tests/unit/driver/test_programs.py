"""driver/programs.py: the program each node runs, chosen from run()'s options, and the options refused."""

from __future__ import annotations

import pytest

from tfonspark.driver.options import ClusterOptions
from tfonspark.driver.programs import for_run
from tfonspark.errors import ConfigError
from tfonspark.tfprocess.data_worker import OnNodes


def main_fun(args, ctx):
    return ("ran", ctx.executor_id)


def node_program(map_fun, options, nodes):
    """What every node of ``run(map_fun, ..., nodes, **options)`` runs: its row of the program table."""
    return for_run(options).make(map_fun, options, nodes)


def test_executors_keep_map_fun_and_nodes_wrap_it():
    assert node_program(main_fun, ClusterOptions(data_service=2), 2) is main_fun
    program = node_program(main_fun, ClusterOptions(data_service=2, data_service_on="nodes", reservation_timeout=30), 3)
    assert program == OnNodes(main_fun, 2, 30.0)


@pytest.mark.parametrize(
    ("options", "nodes", "says"),
    [
        (ClusterOptions(data_service_on="spare"), 2, "must be one of 'executors', 'nodes'"),
        (ClusterOptions(data_service=0, data_service_on="nodes"), 2, "give 1..2. Received: 0"),
        (ClusterOptions(data_service=3, data_service_on="nodes"), 2, "give 1..2. Received: 3"),
        (ClusterOptions(data_service=1, data_service_on="nodes", coordinator=True), 2, "coordinator=True"),
        (ClusterOptions(data_service=1, data_service_on="nodes", max_restarts=1), 2, "max_restarts must be 0"),
        (ClusterOptions(data_service=1, data_service_on="nodes", driver_ps_nodes=True), 2, "driver_ps_nodes"),
    ],
)
def test_options_the_nodes_cannot_serve_are_refused(options, nodes, says):
    with pytest.raises(ConfigError, match="data_service_on") as info:
        node_program(main_fun, options, nodes)
    assert says in str(info.value), str(info.value)
