"""Models, data and partitioners under ``tfonspark.ps_cluster`` on real Spark (issue 23, item 4).

One driver subprocess (``ps_models_driver.py``, one cluster start: 2 workers + 2 ps on
``local[4]``) does every step; this test checks what it recorded:

* ``MinSizePartitioner``, ``MaxSizePartitioner`` and ``FixedShardsPartitioner`` shard an
  ``Embedding(1000, 16)`` into 3, 5 and 2 shards that alternate between the two ps tasks;
* a Keras 3 custom loop learns y = 3*x1 + 2*x2 + 1 from TFRecords written by
  ``save_tfrecords`` and read through ``coordinator.create_per_worker_dataset``;
* ``tf_keras``'s ``model.fit`` with a ``DatasetCreator`` trains the sharded embedding (same files);
* its checkpoint and SavedModel hold ONE ``[1000, 16]`` variable: the checkpoint restores into
  the model built outside the strategy, and ``TFModel`` serves the SavedModel on a DataFrame;
* Keras 3's ``model.fit`` fails under the strategy on TF 2.21, and the error leaving the block
  carries ``ps_cluster``'s ``Hint:`` naming the routes that work.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

from tfonspark.probes import servers_accepting

from .conftest import run_driver

pytestmark = pytest.mark.spark

DRIVER = Path(__file__).with_name("ps_models_driver.py")
PS_DEVICE = re.compile(r"^/job:ps/replica:0/task:([01])/device:CPU:0$")


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict:
    pytest.importorskip("tf_keras")
    workdir = tmp_path_factory.mktemp("ps_models")
    out = workdir / "out.json"
    found = run_driver(DRIVER, "local[4]", str(out), str(workdir), out=out, timeout=300)
    print(
        f"ps_models on local[4]: TFRecords {found['records']['seconds']:.1f}s, start-up {found['startup_s']:.1f}s, "
        f"custom loop {found['loop']['seconds']:.1f}s, fit {found['fit']['seconds']:.1f}s, "
        f"shutdown {found['shutdown_s']:.2f}s, TFModel {found['serve_s']:.1f}s, total {found['total_s']:.1f}s"
    )
    return found


@pytest.mark.parametrize(
    ("name", "rows"),
    [
        ("MinSizePartitioner", [334, 333, 333]),  # min_shard_bytes=24 KiB of 62.5 KiB, max_shards=4
        ("MaxSizePartitioner", [200] * 5),  # max_shard_bytes=8 KiB, capped at max_shards=5
        ("FixedShardsPartitioner", [500, 500]),
    ],
)
def test_a_partitioner_shards_the_embedding_over_both_ps_tasks(result, name, rows):
    sharded = result["partitioners"][name]
    assert sharded["type"] == "ShardedVariable"
    assert sharded["shapes"] == [[r, 16] for r in rows]
    tasks = [PS_DEVICE.match(d).group(1) if PS_DEVICE.match(d) else d for d in sharded["devices"]]
    assert set(tasks) == {"0", "1"}, sharded["devices"]
    assert all(a != b for a, b in zip(tasks, tasks[1:])), f"shards should alternate ps tasks: {tasks}"


def test_a_custom_loop_learns_from_tfrecords_read_per_worker(result):
    assert len(result["records"]["files"]) == 2  # save_tfrecords: one part file per partition
    losses = result["loop"]["losses"]
    assert len(losses) == 40 and np.mean(losses[-10:]) < 0.05 * np.mean(losses[:10]), losses
    np.testing.assert_allclose(result["loop"]["weights"], [3.0, 2.0, 1.0], atol=0.3)


def test_tf_keras_fit_with_a_dataset_creator_trains_the_sharded_embedding(result):
    history = result["fit"]["history"]
    assert history["loss"][-1] < 0.1 * history["loss"][0], history
    assert history["accuracy"][-1] >= 0.99, history


def test_a_checkpoint_and_a_saved_model_hold_one_unsharded_variable(result):
    name = "model/layer_with_weights-0/embeddings/.ATTRIBUTES/VARIABLE_VALUE"
    assert result["checkpoint"]["variables"] == [[name, [1000, 16]]]
    assert [s for n, s in result["saved_model"]["variables"] if "embeddings" in n] == [[1000, 16]]
    restored = result["checkpoint"]["restored"]
    assert restored["type"] != "ShardedVariable" and restored["shapes"] == [[1000, 16]], restored
    assert result["checkpoint"]["restored_equal"]


def test_tfmodel_serves_the_saved_model_of_the_sharded_embedding(result):
    served = sorted(result["served"], key=lambda row: row["id"])
    ids = np.array([row["id"] for row in served])
    probs = np.array([row["prob"] for row in served])
    embedding = np.array(result["checkpoint"]["embedding_rows"])  # the un-sharded rows 0..49
    dense = np.array(result["checkpoint"]["dense"])
    expected = 1 / (1 + np.exp(-(embedding[ids] @ dense[:-1] + dense[-1])))
    np.testing.assert_allclose(probs, expected, rtol=1e-4, atol=1e-6)
    assert np.mean((probs > 0.5) == (ids % 2 == 1)) == 1.0


def test_keras3_fit_fails_with_a_hint_and_the_servers_stop(result):
    error = result["error"]
    assert error["stage"] == "keras 3 fit", error["traceback"]
    assert error["type"] == "ValueError" and "create_per_worker_dataset" in error["message"]
    if sys.version_info >= (3, 11):
        assert len(error["notes"]) == 1 and error["notes"][0].startswith("Hint: "), error["notes"]
        assert "custom loop" in error["notes"][0] and "DatasetCreator" in error["notes"][0]
    assert not any(servers_accepting(result["spec"]).values())
