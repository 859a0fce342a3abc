"""``TFModel``: a Spark ML Model that serves a TensorFlow SavedModel on the executors.

``transform(df)`` keeps every column of ``df`` and appends one column per ``output_mapping``
entry. Each Spark Python worker loads the SavedModel once and keeps it for later tasks
(:mod:`tfonspark.ml.model_cache`); rows travel as Arrow record batches (``mapInArrow``) and go
through the signature ``batch_size`` rows per call. The result schema comes from the signature,
read on the driver, so ``transform`` starts no Spark job until the result is used. The binding
rules (names, casts, reshapes, output types) are in :mod:`tfonspark.ml.inference`.

Example (a model trained by :class:`~tfonspark.ml.TFEstimator`, or any SavedModel)::

    model = (TFModel({})
             .setExportDir("/models/linear")
             .setInputMapping({"features": "dense_input"})   # column -> signature input
             .setOutputMapping({"output_0": "prediction"}))  # signature output -> new column
    model.transform(df)   # df's columns + prediction: array<float>

Differences from TFoS: all input columns are kept (TFoS returned only the outputs); Keras 3
exports name their outputs ``output_0`` and so on (not after the last layer), as
``saved_model_cli show --dir DIR --all`` or :func:`tfonspark.ml.savedmodel.read_saved_model`
shows; ``model_dir`` (TF1 checkpoints) is not served.
"""

from __future__ import annotations

import functools
from typing import Any

from pyspark.ml import Model

from .inference import output_fields, plan_serving, serve_batches
from .params import (
    HasBatchSize,
    HasExportDir,
    HasInputMapping,
    HasModelDir,
    HasOutputMapping,
    HasSignatureDefKey,
    HasTagSet,
    Namespace,
    TFParams,
)
from .persistence import TFPersistence, decode_args, encode_args

__all__ = ["TFModel"]

#: TFoS defaults, except ``signature_def_key``: TF 2 SavedModels serve ``serving_default``.
MODEL_DEFAULTS: dict[str, Any] = {
    "input_mapping": {},
    "output_mapping": {},
    "batch_size": 100,
    "model_dir": None,
    "export_dir": None,
    "signature_def_key": "serving_default",
    "tag_set": None,
}


class TFModel(Model, TFParams, HasInputMapping, HasOutputMapping, HasBatchSize, HasModelDir,
              HasExportDir, HasSignatureDefKey, HasTagSet, TFPersistence):
    """Serves a SavedModel signature on a DataFrame (TFoS ``pipeline.TFModel``).

    ``tf_args`` (dict, argparse.Namespace, argv list or None) is kept for TFoS compatibility and
    persisted with the model; serving uses the Params only.
    """

    def __init__(self, tf_args: Any = None) -> None:
        super().__init__()
        self.args = Namespace(tf_args)
        self._setDefault(**MODEL_DEFAULTS)

    def _transform(self, dataset: Any) -> Any:
        """``dataset`` with the mapped signature outputs appended (lazy: no job runs here)."""
        from pyspark.sql.types import StructType

        plan = plan_serving(
            dataset.schema,
            export_dir=self.getExportDir(),
            tag_set=self.getTagSet(),
            signature_def_key=self.getSignatureDefKey(),
            input_mapping=self.getInputMapping(),
            output_mapping=self.getOutputMapping(),
            batch_size=self.getBatchSize(),
        )
        schema = StructType(list(dataset.schema.fields) + output_fields(plan))
        return dataset.mapInArrow(functools.partial(serve_batches, plan=plan), schema)

    # ---- persistence ---------------------------------------------------------------------------
    def _extra_metadata(self) -> dict[str, Any]:
        return {"tf_args": encode_args(self.args)}

    @classmethod
    def _from_metadata(cls, metadata: dict[str, Any]) -> TFModel:
        model = cls()
        model.args = decode_args(metadata.get("tf_args"))
        return model
