"""``TFModel``: a Spark ML Model that serves a TensorFlow SavedModel on the executors.

``transform(df)`` keeps every column of ``df`` and appends one column per ``output_mapping``
entry. Each Spark Python worker loads the SavedModel once and keeps it for later tasks
(:mod:`tfonspark.ml.model_cache`). The mapped columns travel to Python as Arrow batches (a
scalar-iterator Arrow UDF on Spark >= 4.1, so the other columns stay on the JVM; ``mapInArrow``
on older Spark) and go through the signature ``batch_size`` rows per call. The result schema
comes from the signature, read on the driver, so ``transform`` starts no Spark job until the
result is used. The binding rules (names, casts, reshapes, output types) are in
:mod:`tfonspark.ml.binding`.

Errors: what the driver can check (columns, signature, types) raises in ``transform``. A data
error found on an executor (a null in a feature column, a row of the wrong length) fails the
Spark action that uses the result, with Spark's own exception; its text carries the typed
error, which ``tfonspark.wire.errors.reraise(exc)`` raises again as itself (e.g. an
:class:`~tfonspark.errors.InputError` with its ``column``, ``partition`` and ``row``).

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
import warnings
from typing import Any

from pyspark.ml import Model

from ..wire.errors import captured
from .binding import ServingPlan, output_fields, plan_serving
from .inference import serve_arrays, serve_batches
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


class TFModel(
    Model,
    TFParams,
    HasInputMapping,
    HasOutputMapping,
    HasBatchSize,
    HasModelDir,
    HasExportDir,
    HasSignatureDefKey,
    HasTagSet,
    TFPersistence,
):
    """Serves a SavedModel signature on a DataFrame (TFoS ``pipeline.TFModel``).

    ``transform(df)`` (Spark ML's) returns ``df`` with one column appended per
    ``output_mapping`` entry, lazily (see :mod:`tfonspark.ml.model`). The
    ``set<Param>``/``get<Param>`` methods (TFoS names: ``setExportDir``, ``setInputMapping``,
    ``setOutputMapping``, ``setSignatureDefKey``, ``setTagSet``, ``setBatchSize``) set and read
    the Params of :mod:`tfonspark.ml.params`; each setter returns the model, for chaining.

    Parameters
    ----------
    tf_args : dict, argparse.Namespace, Namespace or list of str, optional
        Kept for TFoS compatibility and persisted with the model as JSON (values JSON cannot
        hold need ``save(path, allow_pickle=True)`` and ``load(path, allow_pickle=True)``:
        :mod:`tfonspark.ml.persistence`); serving uses the Params only.

    Examples
    --------
    >>> from tfonspark.ml import TFModel
    >>> model = (TFModel()
    ...          .setExportDir("/models/linear")
    ...          .setInputMapping({"features": "dense_input"})   # column -> signature input
    ...          .setOutputMapping({"output_0": "prediction"}))  # signature output -> new column
    >>> model.getBatchSize(), model.getSignatureDefKey()
    (100, 'serving_default')
    >>> predictions = model.transform(df)  # doctest: +SKIP
    """

    def __init__(self, tf_args: Any = None) -> None:
        super().__init__()
        self.args = Namespace(tf_args)
        self._setDefault(**MODEL_DEFAULTS)

    def _transform(self, dataset: Any) -> Any:
        """``dataset`` with the mapped signature outputs appended (lazy: no job runs here)."""
        plan = self._plan(dataset)
        if _arrow_udf_available():
            return _with_arrow_udf(dataset, plan)
        from pyspark.sql.types import StructType

        schema = StructType(list(dataset.schema.fields) + output_fields(plan))
        return dataset.mapInArrow(captured(functools.partial(serve_batches, plan=plan)), schema)

    def _plan(self, dataset: Any) -> ServingPlan:
        """Bind this model's Params to ``dataset``'s schema and the SavedModel's signature."""
        return plan_serving(
            dataset.schema,
            export_dir=self.getExportDir(),
            tag_set=self.getTagSet(),
            signature_def_key=self.getSignatureDefKey(),
            input_mapping=self.getInputMapping(),
            output_mapping=self.getOutputMapping(),
            batch_size=self.getBatchSize(),
        )

    # ---- persistence ---------------------------------------------------------------------------
    def _extra_metadata(self, allow_pickle: bool = False) -> dict[str, Any]:
        return {"tf_args": encode_args(self.args, allow_pickle)}

    @classmethod
    def _from_metadata(cls, metadata: dict[str, Any], allow_pickle: bool = False) -> TFModel:
        model = cls()
        model.args = decode_args(metadata.get("tf_args"), allow_pickle)
        return model


def _arrow_udf_available() -> bool:
    """Scalar-iterator Arrow UDFs exist from Spark 4.1; older Spark serves through mapInArrow."""
    try:
        from pyspark.sql.pandas.functions import ArrowUDFType
    except ImportError:
        return False
    return hasattr(ArrowUDFType, "SCALAR_ITER")


def _quoted(name: str) -> str:
    """A column reference that takes ``name`` literally (dots, spaces, backticks)."""
    return "`" + name.replace("`", "``") + "`"


def _with_arrow_udf(dataset: Any, plan: ServingPlan) -> Any:
    """Append the outputs with one Arrow UDF call: several outputs come back as one struct."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.functions import ArrowUDFType, arrow_udf
    from pyspark.sql.types import StructType

    fields = output_fields(plan)
    return_type: Any = fields[0].dataType if len(fields) == 1 else StructType(fields)
    with warnings.catch_warnings():  # the UDF type is given explicitly, not by type hints
        warnings.filterwarnings("ignore", "It is preferred to specify type hints", UserWarning)
        udf = arrow_udf(captured(functools.partial(serve_arrays, plan=plan)), return_type, ArrowUDFType.SCALAR_ITER)
    result = udf(*[F.col(_quoted(b.column)) for b in plan.inputs])
    if len(fields) == 1:
        return dataset.withColumn(fields[0].name, result)
    struct = f"__tfonspark_{plan.model_key[:8]}"
    expanded = [F.col(_quoted(struct)).getField(f.name).alias(f.name) for f in fields]
    return dataset.withColumn(struct, result).select("*", *expanded).drop(struct)
