"""tfonspark.tensorfx.ModelTrainer in one process: outputs, resume, served outputs, bad input."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

pytest.importorskip("tensorflow")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfonspark import InputMode  # noqa: E402
from tfonspark.errors import ConfigError  # noqa: E402
from tfonspark.tensorfx import (  # noqa: E402
    Configuration,
    DebugOptions,
    ModelArguments,
    ModelBuilder,
    ModelTrainer,
    NumericsError,
)
from tfonspark.tensorfx.trainer import _derived_steps, _eval_steps, _Plan  # noqa: E402


class Separable(ModelBuilder):
    """Two well separated blobs; ``poison`` puts a log of a negative number in the model."""

    poison = False

    def build_input(self, source: str, batch: int, epochs: int | None, shuffle: bool) -> tf.data.Dataset:
        rows = self.rows(source).map(lambda x, y: ({"x": x}, y))
        return rows.repeat(epochs).batch(batch)

    def build_inference(self, inputs: Any, training: bool | None) -> Any:
        x = inputs["x"]
        if self.poison:
            x = keras.layers.Lambda(lambda t: tf.math.log(t - 10.0))(x)
        return keras.layers.Dense(2)(x)

    def build_training(self, global_steps: int, inputs: Any, inferences: Any) -> tuple[Any, Any]:
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True), keras.optimizers.Adam(0.05)

    def build_evaluation(self, inputs: Any, outputs: Any) -> list[Any]:
        return ["accuracy"]

    def build_output(self, inferences: Any) -> dict[str, Any]:
        return {"label": keras.ops.argmax(inferences, axis=-1)}


def blobs() -> dict[str, Any]:
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 64)
    x = (rng.normal(size=(64, 2)) * 0.3 + (labels[:, None] * 2 - 1)).astype(np.float32)
    return {"train": (x, labels), "eval": (x[:16], labels[:16])}


def test_trains_alone_writes_outputs_and_resumes(tmp_path: Path) -> None:
    trainer = ModelTrainer(Configuration.local())
    args = ModelArguments.parse(["--epochs", "3", "--batch-size", "8"])
    result = trainer.train(Separable(args, blobs()), tmp_path)
    assert result.export_dir == os.path.join(tmp_path, "model")
    assert len(result.history["accuracy"]) == 3 and result.history["val_accuracy"][-1] >= 0.9
    assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints")).endswith("ckpt-3")
    assert list((tmp_path / "summaries").glob("events.out.tfevents.*"))
    served = tf.saved_model.load(str(tmp_path / "model")).signatures["serving_default"]
    x, labels = blobs()["eval"]
    assert (served(x=tf.constant(x))["label"].numpy() == labels).mean() >= 0.9
    # a second train with more epochs goes on from the checkpoint
    again = ModelTrainer(Configuration.local()).train(
        Separable(ModelArguments.parse(["--epochs", "4", "--batch-size", "8"]), blobs()), tmp_path
    )
    assert len(again.history["accuracy"]) == 1


def test_check_numerics_names_op_role_and_index(tmp_path: Path) -> None:
    builder = Separable(ModelArguments.parse(["--batch-size", "16"]), blobs())
    builder.poison = True
    trainer = ModelTrainer(Configuration.local(), debug=DebugOptions(check_numerics=True))
    with pytest.raises(NumericsError, match=r"op .Log. produced NaN or Inf on chief:0: Detected Infinity or NaN"):
        trainer.train(builder, tmp_path)
    assert tf.constant(-1.0).numpy() < 0  # check_numerics is off again afterwards
    tf.math.log(tf.constant(-1.0))


def test_bad_trainer_input(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="needs the node's ctx"):
        ModelTrainer(input_mode=InputMode.SPARK)
    args = ModelArguments.parse(["--batch-size", "16"])
    with pytest.raises(ConfigError, match="--steps-per-epoch is required"):
        ModelTrainer(Configuration.local(), ctx=object(), input_mode=InputMode.SPARK).train(
            Separable(args, blobs()), tmp_path
        )


def test_debugger_v2_dumps_per_node_read_back(tmp_path: Path) -> None:
    from tensorflow.python.debug.lib import debug_events_reader  # what TensorBoard's Debugger V2 reads with

    debug = DebugOptions(dump_debug_info=True, log_device_placement=True)
    ModelTrainer(Configuration.local(), debug=debug).train(
        Separable(ModelArguments.parse(["--batch-size", "16"]), blobs()), tmp_path
    )
    dump = tmp_path / "debug" / "chief-0"
    with debug_events_reader.DebugDataReader(str(dump)) as reader:
        reader.update()
        assert reader.executions() and reader.graph_execution_traces()
        assert any(t.op_type == "MatMul" for t in reader.graph_execution_traces())


def _node(index: int) -> Configuration:
    """Task ``index`` of a two-worker cluster (chief:0, worker:0)."""
    task = {"type": "chief", "index": 0} if index == 0 else {"type": "worker", "index": index - 1}
    return Configuration(task, {"chief": ["a:1"], "worker": ["b:2"]})


def _plan(args: ModelArguments, index: int, data: dict[str, Any] | None = None) -> _Plan:
    strategy = SimpleNamespace(num_replicas_in_sync=2)
    return _Plan.of(Separable(args, data or blobs()), _node(index), strategy, InputMode.TENSORFLOW, None)


def test_tensorflow_mode_on_a_cluster_derives_the_steps_and_repeats_the_training_data() -> None:
    # 64 rows over 2 workers: 32 a shard; global batch 8: 4 a worker, so 8 steps an epoch on both
    args = ModelArguments.parse(["--batch-size", "8", "--epochs", "3"])
    for index in (0, 1):
        plan = _plan(args, index)
        assert (plan.steps, plan.global_steps, plan.repeat) == (8, 24, None)
        context = tf.distribute.InputContext(2, index, 2)
        train = plan._dataset_fn("train", True)(context)
        assert int(train.cardinality()) == int(tf.data.INFINITE_CARDINALITY)  # no step finds it exhausted
        assert int(plan._dataset_fn("eval", False)(context).cardinality()) == 2  # eval stays finite: 8 rows / 4
        assert plan.eval_steps == 2  # and is read to its last batch, never past it
    given = _plan(ModelArguments.parse(["--batch-size", "8", "--steps-per-epoch", "3"]), 1)
    assert (given.steps, given.repeat) == (3, None)  # the user's steps win, and the data repeats too
    alone = _Plan.of(
        Separable(args, blobs()),
        Configuration.local(),
        SimpleNamespace(num_replicas_in_sync=1),
        InputMode.TENSORFLOW,
        None,
    )
    assert (alone.steps, alone.repeat) == (None, 1)  # one process: Keras' own fit, as before


def test_eval_steps_read_the_largest_shard_to_its_last_batch() -> None:
    assert _eval_steps(tf.data.Dataset.range(17), 2, 8) == 3  # shards of 9 and 8 rows, 4 a step: 3 and 2 batches
    assert _eval_steps(tf.data.Dataset.range(16), 2, 8) == 2
    assert _eval_steps(tf.data.Dataset.range(16).filter(lambda x: x > 3), 2, 8) is None  # unknown: to the end
    assert _eval_steps(tf.data.Dataset.range(0), 2, 8) is None


def test_derived_steps_take_the_smallest_shard_and_refuse_unknown_lengths() -> None:
    assert _derived_steps(tf.data.Dataset.range(1001), 2, 64, "A") == 15  # shards of 501 and 500 rows: 500 // 32
    assert _derived_steps(tf.data.Dataset.range(65), 4, 64, "A") == 1  # fewer rows than a batch: one step
    unknown = tf.data.Dataset.range(100).filter(lambda x: x % 2 == 0)
    with pytest.raises(ConfigError, match=r"^A: the number of .train. rows is unknown .*pass --steps-per-epoch"):
        _derived_steps(unknown, 2, 8, "A")
    with pytest.raises(ConfigError, match="is infinite.*--steps-per-epoch"):
        _derived_steps(tf.data.Dataset.range(3).repeat(), 2, 8, "A")
    with pytest.raises(ConfigError, match="3 .train. rows cannot be shared by 4 workers"):
        _derived_steps(tf.data.Dataset.range(3), 4, 8, "A")
    rows = {"train": lambda: tf.data.Dataset.from_tensor_slices(blobs()["train"]).filter(lambda x, y: y >= 0)}
    with pytest.raises(ConfigError, match=r"^ModelArguments: .*--steps-per-epoch"):  # through the trainer's plan
        _plan(ModelArguments.parse(["--batch-size", "8"]), 0, rows)
