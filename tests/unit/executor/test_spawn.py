"""What a node's TF process is started with: the collective's options from the resolved settings."""

from __future__ import annotations

import pytest

from tfonspark.config import NodeConfig
from tfonspark.executor.spawn import Spawner
from tfonspark.settings import BYTES_PER_PACK_ENV, COLLECTIVE_ENV, COLLECTIVE_TIMEOUT_ENV
from tfonspark.wire import messages as m

NODE = {"cluster_id": "spawn-test", "driver_host": "127.0.0.1", "driver_port": 1, "secret_hex": "ab" * 32}
READY = m.ClusterReady("worker", 0, {"worker": ["10.0.0.1:2222", "10.0.0.2:2222"]})


@pytest.fixture(autouse=True)
def _no_node_variables(monkeypatch):
    for name in (COLLECTIVE_ENV, COLLECTIVE_TIMEOUT_ENV, BYTES_PER_PACK_ENV):
        monkeypatch.delenv(name, raising=False)


def test_the_collectives_options_reach_the_tf_process_where_given(tmp_path):
    config = NodeConfig(**NODE, collective="ring", collective_timeout=20.0, collective_bytes_per_pack=1 << 20)
    env = Spawner(config, 0, [], b"").env(READY, str(tmp_path))
    assert (env[COLLECTIVE_ENV], env[COLLECTIVE_TIMEOUT_ENV], env[BYTES_PER_PACK_ENV]) == ("ring", "20", "1048576")


def test_defaults_leave_tf_its_own_choice(tmp_path):
    env = Spawner(NodeConfig(**NODE), 0, [], b"").env(READY, str(tmp_path))
    assert COLLECTIVE_TIMEOUT_ENV not in env and BYTES_PER_PACK_ENV not in env
