"""tfonspark.tensorfx.ModelBuilder: required methods, the three graph interfaces, named outputs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("tensorflow")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfonspark.errors import ConfigError, InputError  # noqa: E402
from tfonspark.tensorfx import Configuration, ModelArguments, ModelBuilder  # noqa: E402


class TwoFeatures(ModelBuilder):
    """A dict-input classifier with named serving outputs."""

    def build_input(self, source: str, batch: int, epochs: int | None, shuffle: bool) -> tf.data.Dataset:
        rows = self.rows(source).map(lambda x, y: ({"a": x, "b": x * 2}, y))
        return rows.repeat(epochs).batch(batch)

    def build_inference(self, inputs: Any, training: bool | None) -> Any:
        joined = keras.layers.Concatenate()([inputs["a"], inputs["b"]])
        return keras.layers.Dense(3)(joined)

    def build_training(self, global_steps: int, inputs: Any, inferences: Any) -> tuple[Any, Any]:
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True), keras.optimizers.Adam(0.01)

    def build_evaluation(self, inputs: Any, outputs: Any) -> list[Any]:
        return ["accuracy"]

    def build_output(self, inferences: Any) -> dict[str, Any]:
        return {"label": keras.ops.argmax(inferences, axis=-1), "scores": keras.ops.softmax(inferences)}


def data() -> dict[str, Any]:
    rng = np.random.default_rng(0)
    return {"train": (rng.random((32, 4), dtype=np.float32), rng.integers(0, 3, 32))}


def test_missing_required_method_names_class_and_method() -> None:
    class NoInference(ModelBuilder):
        def build_input(self, source: str, batch: int, epochs: int | None, shuffle: bool) -> tf.data.Dataset:
            raise AssertionError

    with pytest.raises(ConfigError, match=r"NoInference does not define build_inference\(inputs, training\)"):
        NoInference(ModelArguments.default(), {})
    with pytest.raises(ConfigError, match=r"ModelBuilder does not define build_input.*build_training"):
        ModelBuilder(ModelArguments.default(), {})


def test_graph_interfaces_train_evaluate_and_serve_named_outputs() -> None:
    builder = TwoFeatures(ModelArguments.default(), data())
    training, evaluation, prediction = builder.build_graph_interfaces(Configuration.local())
    assert training.model is evaluation.model
    batch = next(iter(builder.build_input("train", 8, 1, False)))
    assert set(training.step(batch)) == {"loss", "accuracy"}
    assert set(evaluation.step(batch)) == {"loss", "accuracy"}
    assert set(prediction.input_signature) == {"a", "b"}
    outputs = prediction.signature(batch[0])
    assert outputs["label"].shape == (8,) and outputs["scores"].shape == (8, 3)
    # the serving model shares the trained layers
    assert {id(v) for v in prediction.model.weights} <= {id(v) for v in training.model.weights}


def test_sources_and_bad_input() -> None:
    builder = TwoFeatures(ModelArguments.default(), data())
    assert builder.with_dataset({"eval": lambda: tf.data.Dataset.range(3)}).rows("eval").cardinality() == 3
    assert "eval" not in builder.dataset and builder.args.batch_size == 64
    with pytest.raises(InputError, match=r"no data source 'test'.*\['train'\]"):
        builder.rows("test")
    with pytest.raises(InputError, match="not a tf.data.Dataset"):
        builder.with_dataset({"train": lambda: [1, 2]}).rows("train")

    class Unlabelled(TwoFeatures):
        def build_input(self, source: str, batch: int, epochs: int | None, shuffle: bool) -> tf.data.Dataset:
            return tf.data.Dataset.range(4).batch(batch)

    with pytest.raises(InputError, match=r"Unlabelled.build_input must return .*\(inputs, labels\)"):
        Unlabelled(ModelArguments.default(), {}).build_training_graph()


def test_docstring_examples_run() -> None:
    import doctest

    import tfonspark.tensorfx.builder

    result = doctest.testmod(tfonspark.tensorfx.builder, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
