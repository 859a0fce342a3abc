"""tfonspark.tensorfx on real Spark: both examples' builders, tiny, in both input modes, one cluster.

One ``InputMode.SPARK`` cluster on ``local-cluster[2,1,1024]``: every node trains a small MNIST
CNN (``--filters 4 --dense 16``) on its Spark feed for two steps, without evaluation (the
trainer in ``InputMode.SPARK``), then the tabular model on its shard of the table (``InputMode.TENSORFLOW``)
for a few epochs. Checked: the path (feed or shard, MWMS, checkpoints, summaries, SavedModels
with the named inputs and outputs TFModel maps, read by TFModel's own reader) and the tabular
model's accuracy on the whole test set (>= 90%). TFModel serving a SavedModel on executors is
test_ml_pipeline.py's (30+ s here under load); the MNIST CNN's accuracy is the example's
(docs/tensorfx.md): two steps prove the feed path, not the model.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("sklearn")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tensorfx"


def example(name: str) -> ModuleType:
    """Import ``examples/tensorfx/<name>.py``; nodes get it by value (it is not importable there)."""
    from pyspark import cloudpickle

    module_name = f"tensorfx_example_{name}"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, EXAMPLES / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
        cloudpickle.register_pickle_by_value(module)
    return sys.modules[module_name]


def both_models(args: dict[str, Any], ctx: Any) -> None:
    """A node: the MNIST CNN on the feed, then the tabular model on its shard (and its eval shard)."""
    from tfonspark import InputMode
    from tfonspark.tensorfx import ModelTrainer

    mnist, tabular = args["mnist"], args["tabular"]
    builder = mnist.MnistBuilder(args["mnist_args"], {})  # no eval source: the tabular model has one
    ModelTrainer(ctx=ctx, input_mode=InputMode.SPARK).train(builder, os.path.join(args["out"], "mnist"))
    targs = args["tabular_args"]
    train, test = tabular.load_table(targs.test_fraction, targs.seed)
    table = {"train": tabular.columns(train, targs.features), "eval": tabular.columns(test, targs.features)}
    tabular_builder = tabular.TabularBuilder(targs, table)
    result = ModelTrainer(ctx=ctx, input_mode=InputMode.TENSORFLOW).train(
        tabular_builder, os.path.join(args["out"], "tabular")
    )
    if result.export_dir is not None:  # the chief: the history's val_* are the whole test set's
        with open(os.path.join(args["out"], "tabular_history.json"), "w") as f:
            json.dump({**result.history, "steps": int(result.model.optimizer.iterations.numpy())}, f)


def assert_outputs(job_dir: Path) -> None:
    assert (job_dir / "checkpoints" / "checkpoint").exists()
    assert list((job_dir / "summaries").glob("events.out.tfevents.*"))
    assert (job_dir / "model" / "saved_model.pb").exists()


def test_mnist_on_a_feed_and_tabular_on_shards(sc, mnist_dir: Path, tmp_path: Path, no_leftovers) -> None:
    from pyspark import cloudpickle

    import tfonspark
    from tfonspark.ml.savedmodel import read_saved_model

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # both_models: tests is not importable there

    mnist, tabular = example("mnist"), example("tabular")
    mnist_args = mnist.MnistArgs.parse(
        ["--data", str(mnist_dir), "--mode", "spark", "--epochs", "1", "--batch-size", "64"]
        + ["--max-train-rows", "128", "--filters", "4", "--dense", "16"]
    )
    assert mnist_args.steps_per_epoch == 2
    tabular_args = tabular.TabularArgs.parse(
        ["--mode", "tensorflow", "--epochs", "3", "--batch-size", "32", "--learning-rate", "0.01"]
    )
    node_args = {"mnist": mnist, "tabular": tabular, "out": str(tmp_path)}
    node_args |= {"mnist_args": mnist_args, "tabular_args": tabular_args}
    cluster = tfonspark.run(sc, both_models, node_args, 2, input_mode=tfonspark.InputMode.SPARK)
    cluster.train(mnist.training_dataframe(mnist_args), num_epochs=1)
    cluster.shutdown(timeout=300)

    for model, inputs, outputs in [
        ("mnist", ["image"], ["label", "probabilities"]),
        ("tabular", sorted(tabular_args.features), ["prediction", "probability"]),
    ]:
        assert_outputs(tmp_path / model)
        graphs, _ = read_saved_model(str(tmp_path / model / "model"))
        served = next(g for g in graphs if "serve" in g.tags).signatures["serving_default"]
        assert sorted(i.name for i in served.inputs) == inputs
        assert sorted(o.name for o in served.outputs) == outputs
    history = json.loads((tmp_path / "tabular_history.json").read_text())
    # no --steps-per-epoch: the smallest shard's rows // the per-worker batch, each epoch (data repeated)
    assert history["steps"] == tabular_args.epochs * ((tabular_args.train_rows // 2) // (32 // 2))
    accuracy = history["val_accuracy"][-1]
    print(f"[measured] tabular test accuracy after {tabular_args.epochs} epochs: {accuracy:.3f}")
    assert accuracy >= 0.9
