"""Keras training API of tfonspark, its one door: ``from tfonspark.keras import fit``.

``fit`` trains a compiled Keras 3 model under ``MultiWorkerMirroredStrategy`` where Keras' own
``model.fit`` cannot (TF 2.21 / Keras 3.15); tf_keras models are passed to their own
``model.fit``. With ``model_dir`` it checkpoints every ``checkpoint_every_steps`` steps (default
``DEFAULT_CHECKPOINT_EVERY_STEPS``) and at each epoch end, and resumes from the latest checkpoint
at that epoch and step. ``export_saved_model`` writes the one SavedModel (every node calls it;
the chief writes). The contract and the input, sharding and checkpoint rules are documented in
:mod:`tfonspark.distribute.keras_fit`. ``sidecar_evaluate`` is the sidecar evaluator of
parameter-server training: it evaluates each checkpoint as it appears
(:mod:`tfonspark.distribute.sidecar`).

The strategy and ``TF_CONFIG`` helpers (``strategy()``, ``task_info()``, ``is_chief()``) have
their door in :mod:`tfonspark.distribute`.
"""

from __future__ import annotations

from .distribute.checkpoint import export_saved_model
from .distribute.keras_fit import fit
from .distribute.keras_fit.epoch_input import DatasetFn
from .distribute.keras_fit.trainer import DEFAULT_CHECKPOINT_EVERY_STEPS, DistributedTrainer, Progress
from .distribute.sidecar import sidecar_evaluate

__all__ = [
    "DEFAULT_CHECKPOINT_EVERY_STEPS",
    "DatasetFn",
    "DistributedTrainer",
    "Progress",
    "export_saved_model",
    "fit",
    "sidecar_evaluate",
]
