"""What a TF process's environment adds for TFoS programs: Keras 2 and TFoS's estimator import.

``NodeConfig.legacy_keras`` (decided on the driver from the ``legacy_keras`` setting):
``"on"`` sets ``TF_USE_LEGACY_KERAS=1`` and needs ``tf_keras`` here; ``"auto"`` sets it where
``tf_keras`` is installed; ``""`` leaves the variable as the user set it. For the TFoS face
(``NodeConfig.tfos_face``) :mod:`tfonspark._tfos_shims` goes on ``PYTHONPATH`` where no real
``tensorflow_estimator`` is installed.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..config import NodeConfig
from ..errors import ConfigError

__all__ = ["LEGACY_KERAS_ENV", "SHIMS_DIR", "env_changes"]

LEGACY_KERAS_ENV = "TF_USE_LEGACY_KERAS"
SHIMS_DIR = str(Path(__file__).resolve().parent.parent / "_tfos_shims")


def _installed(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def env_changes(
    config: NodeConfig, environ: Mapping[str, str], installed: Callable[[str], Any] = _installed
) -> dict[str, str]:
    """The variables to add to ``environ`` (the TF process's environment): the Keras 2 switch and the
    TFoS import shims, where asked for (as :func:`tfonspark.executor.gpus.cuda_env` gives the GPUs).

    Raises ConfigError when ``legacy_keras`` is ``"on"`` and ``tf_keras`` is not installed here.
    """
    changes = {}
    if config.legacy_keras:
        if installed("tf_keras"):
            changes[LEGACY_KERAS_ENV] = "1"
        elif config.legacy_keras == "on":
            raise ConfigError(
                f"legacy_keras=on needs tf_keras in the executors' Python ({sys.executable}), and it is not "
                "installed there: pip install 'tfonspark[tfos]' (or tf_keras matching TensorFlow), "
                "or set spark.tfonspark.legacyKeras=off to use Keras 3"
            )
    if config.tfos_face and not installed("tensorflow_estimator"):
        path = environ.get("PYTHONPATH", "")
        changes["PYTHONPATH"] = os.pathsep.join(p for p in (path, SHIMS_DIR) if p)  # last: real packages win
    return changes
