"""TFoS programs run on tfonspark after changing only their import line."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np

from tests.integration.conftest import by_value

PROGRAMS = Path(__file__).parent / "tfos_programs"
TFOS_IMPORT = "from tensorflowonspark import TFCluster, TFNode"


def _load(name: str, tmp_path: Path):
    """Load a TFoS program with its import line switched to tfonspark (and nothing else)."""
    source = (PROGRAMS / f"{name}.py").read_text()
    assert source.count(TFOS_IMPORT) == 1
    ported = source.replace(TFOS_IMPORT, "from tfonspark import TFCluster, TFNode")
    assert sum(a != b for a, b in zip(source.splitlines(), ported.splitlines())) == 1
    path = tmp_path / f"{name}.py"
    path.write_text(ported)
    spec = importlib.util.spec_from_file_location(f"tfos_program_{name}", path)
    module = importlib.util.module_from_spec(spec)
    import sys

    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    by_value(spec.name)
    return module


def test_spark_mode_program_trains_and_infers(sc, tmp_path):
    program = _load("spark_feed_linear", tmp_path)
    args = {"batch_size": 50, "epochs": 20, "cluster_size": 2, "model_dir": str(tmp_path)}
    labels, predictions = program.main(sc, args)
    assert len(predictions) == len(labels) == 2000
    w0, w1 = np.load(tmp_path / "w0.npy"), np.load(tmp_path / "w1.npy")
    assert np.all(np.isfinite(w0)) and np.all(np.isfinite(w1))
    error = np.abs(np.array(predictions) - np.array(labels))
    assert error.mean() < 0.3, f"mean abs error {error.mean():.3f}"


def test_tensorflow_mode_program_with_ps_and_chief(sc, tmp_path):
    program = _load("tensorflow_mode_cluster", tmp_path)
    program.main(sc, {"cluster_size": 3, "model_dir": str(tmp_path)})
    nodes = {p.stem: json.loads(p.read_text()) for p in tmp_path.glob("*.json")}
    assert sorted(nodes) == ["chief0", "worker0"]
    assert nodes["chief0"]["jobs"] == ["chief", "ps", "worker"] and nodes["chief0"]["num_workers"] == 2
