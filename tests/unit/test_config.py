"""config.py: NodeConfig's checks of what it carries to a node."""

from __future__ import annotations

import pytest

from tfonspark.config import NodeConfig
from tfonspark.errors import ConfigError


def _config(**fields):
    return NodeConfig(cluster_id="c" * 32, driver_host="127.0.0.1", driver_port=1, secret_hex="ab" * 16, **fields)


def test_node_config_rejects_an_unknown_keras_mode():
    with pytest.raises(ConfigError, match="legacy_keras must be"):
        _config(legacy_keras="yes")
