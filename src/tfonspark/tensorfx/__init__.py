"""The model-building layer, TensorFX's ``tensorfx.training`` API in TF 2 terms (docs/tensorfx.md).

A model is a :class:`ModelBuilder` subclass; its hyper-parameters are a :class:`ModelArguments`
parsed from the command line; its place in the cluster is a :class:`Configuration` read from
``TF_CONFIG``; a :class:`ModelTrainer` trains it on one process or on every node of a
tfonspark cluster (both input modes) and writes checkpoints, TensorBoard summaries and a
SavedModel that :class:`tfonspark.ml.TFModel` serves::

    def main_fun(args, ctx):
        builder = MyBuilder(MyArgs.parse(args["argv"]), {"train": ..., "eval": ...})
        ModelTrainer(ctx=ctx).train(builder, args["output"])
"""

from __future__ import annotations

from .args import ModelArguments
from .builder import EvaluationGraph, ModelBuilder, PredictionGraph, TrainingGraph
from .config import Configuration, Task
from .trainer import DebugOptions, ModelTrainer, NumericsError, Summaries, TrainedModel

__all__ = [
    "Configuration",
    "DebugOptions",
    "EvaluationGraph",
    "ModelArguments",
    "ModelBuilder",
    "ModelTrainer",
    "NumericsError",
    "PredictionGraph",
    "Summaries",
    "Task",
    "TrainedModel",
    "TrainingGraph",
]
