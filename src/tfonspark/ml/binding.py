"""TFModel's binding, on the driver: DataFrame columns to a SavedModel signature, as a :class:`ServingPlan`.

:func:`plan_serving` reads the SavedModel's signature (no TensorFlow, no Spark job), checks
``input_mapping``/``output_mapping`` against it and the DataFrame, and returns a small picklable
:class:`ServingPlan`; :func:`output_fields` gives the appended columns' types. The executors
serve the plan (:mod:`tfonspark.ml.inference`).

Rules:

* Every signature input needs a column: ``input_mapping`` entries ``{column: input_name}``
  (``'name:0'`` is accepted for ``'name'``). Entries naming tensors that the signature does not
  take, e.g. the label tensor used in training, are ignored, so an estimator's training mapping
  can serve as is in a Pipeline.
* A column is cast to the input's dtype when numpy calls that cast ``same_kind`` (double ->
  float, int -> float, bigint -> int), and flat arrays are reshaped to the input's shape when
  the element counts agree (Spark has only flat arrays: 784 values -> ``[28, 28, 1]``).
* ``output_mapping`` is ``{output_name: new_column}``; output ``[None]`` becomes a scalar
  column, ``[None, k]`` an array, ``[None, k, m]`` an array of arrays. float16/bfloat16 become
  float, unsigned ints the next wider signed type, strings UTF-8 text.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, InputError
from .savedmodel import (
    Signature,
    TensorSpec,
    model_key,
    read_saved_model,
    resolve_export_dir,
    select_signature,
    strip_port,
)

__all__ = [
    "INPUT_NUMPY",
    "InputBinding",
    "OUTPUT_TYPES",
    "OutputBinding",
    "ServingPlan",
    "bind_inputs",
    "bind_outputs",
    "output_fields",
    "plan_serving",
    "spark_type",
]

log = logging.getLogger(__name__)

#: Output dtype -> (numpy dtype the values are cast to, Spark SQL type name).
OUTPUT_TYPES: dict[str, tuple[str, str]] = {
    "float32": ("float32", "float"),
    "float64": ("float64", "double"),
    "float16": ("float32", "float"),
    "bfloat16": ("float32", "float"),
    "int8": ("int8", "byte"),
    "int16": ("int16", "short"),
    "int32": ("int32", "integer"),
    "int64": ("int64", "long"),
    "uint8": ("int16", "short"),
    "uint16": ("int32", "integer"),
    "uint32": ("int64", "long"),
    "bool": ("bool", "boolean"),
    "string": ("object", "string"),
}
#: Input dtype -> numpy dtype a column is cast to before it becomes a tensor.
INPUT_NUMPY = {
    "float16": "float16",
    "bfloat16": "float32",
    "float32": "float32",
    "float64": "float64",
    "int8": "int8",
    "int16": "int16",
    "int32": "int32",
    "int64": "int64",
    "uint8": "uint8",
    "uint16": "uint16",
    "uint32": "uint32",
    "uint64": "uint64",
    "bool": "bool",
}


@dataclass(frozen=True)
class InputBinding:
    """DataFrame column -> signature input."""

    column: str
    tensor: str
    dtype: str
    shape: tuple[int | None, ...] | None


@dataclass(frozen=True)
class OutputBinding:
    """Signature output -> new DataFrame column."""

    tensor: str
    column: str
    dtype: str
    shape: tuple[int | None, ...]


@dataclass(frozen=True)
class ServingPlan:
    """Everything an executor needs to serve one signature (picklable, made on the driver)."""

    model_key: str
    export_dir: str
    tags: tuple[str, ...] | None
    signature_def_key: str
    inputs: tuple[InputBinding, ...]
    outputs: tuple[OutputBinding, ...]
    batch_size: int


def _names(specs: tuple[TensorSpec, ...]) -> list[str]:
    return [s.describe() for s in specs]


def bind_inputs(signature: Signature, mapping: Mapping[str, str], columns: list[str]) -> tuple[InputBinding, ...]:
    """Match ``{column: input}`` entries to the signature's inputs; every input needs one."""
    bound: dict[str, InputBinding] = {}
    for column, tensor in sorted(mapping.items()):
        spec = signature.input(strip_port(tensor))
        if spec is None:
            log.info(
                "input_mapping entry %r -> %r ignored: not an input of signature %r", column, tensor, signature.key
            )
            continue
        if spec.dtype != "string" and spec.dtype not in INPUT_NUMPY:
            raise ConfigError(
                f"signature input {spec.describe()} has a dtype no DataFrame column can "
                f"feed; supported: {sorted(INPUT_NUMPY) + ['string']}"
            )
        if spec.name in bound:
            raise ConfigError(
                f"input_mapping maps two columns to signature input {spec.name!r}: "
                f"{bound[spec.name].column!r} and {column!r}"
            )
        if column not in columns:
            raise InputError(
                f"input_mapping names column {column!r} (for signature input "
                f"{spec.name!r}) but the DataFrame has columns {columns}",
                column=column,
            )
        bound[spec.name] = InputBinding(column, spec.name, spec.dtype, spec.shape)
    if not signature.inputs:
        raise ConfigError(
            f"signature {signature.key!r} takes no inputs, so it cannot be served row "
            "by row; choose another signature_def_key"
        )
    missing = [s for s in signature.inputs if s.name not in bound]
    if missing:
        raise ConfigError(
            f"signature {signature.key!r} input(s) {[s.name for s in missing]} have no "
            f"column; add {{column: input_name}} entries to input_mapping. Received: "
            f"input_mapping={dict(mapping)!r}; signature inputs: {_names(signature.inputs)}"
        )
    return tuple(bound[s.name] for s in signature.inputs)


def bind_outputs(signature: Signature, mapping: Mapping[str, str], columns: list[str]) -> tuple[OutputBinding, ...]:
    """Match ``{output: new_column}`` entries to the signature's outputs."""
    if not mapping:
        raise ConfigError(
            f"output_mapping is empty; set {{output_name: column}} for the outputs to "
            f"append. Signature {signature.key!r} outputs: {_names(signature.outputs)}"
        )
    taken = set(columns)
    bound = []
    for tensor, column in sorted(mapping.items()):
        spec = signature.output(strip_port(tensor))
        if spec is None:
            raise ConfigError(
                f"output_mapping names {tensor!r}, which is not an output of signature "
                f"{signature.key!r}. Available outputs: {_names(signature.outputs)}"
            )
        if column in taken:
            raise ConfigError(
                f"output column {column!r} (for output {spec.name!r}) already exists; "
                f"choose a new name. Existing columns: {sorted(taken)}"
            )
        taken.add(column)
        spark_type(spec)  # fail now, on the driver, for outputs a column cannot hold
        assert spec.shape is not None
        bound.append(OutputBinding(spec.name, column, spec.dtype, spec.shape))
    return tuple(bound)


def spark_type(spec: TensorSpec) -> Any:
    """The Spark SQL type of an output column: nested arrays for each non-batch dimension."""
    from pyspark.sql import types as T

    if spec.dtype not in OUTPUT_TYPES:
        raise ConfigError(
            f"signature output {spec.describe()} has a dtype no DataFrame column can "
            f"hold; supported: {sorted(OUTPUT_TYPES)}"
        )
    if spec.shape is None or len(spec.shape) == 0:
        raise ConfigError(
            f"signature output {spec.describe()} has no batch dimension (unknown or "
            "zero rank); export the model with a [None, ...] output shape"
        )
    simple = {
        "float": T.FloatType,
        "double": T.DoubleType,
        "byte": T.ByteType,
        "short": T.ShortType,
        "integer": T.IntegerType,
        "long": T.LongType,
        "boolean": T.BooleanType,
        "string": T.StringType,
    }
    result: Any = simple[OUTPUT_TYPES[spec.dtype][1]]()
    for _ in spec.shape[1:]:
        result = T.ArrayType(result, containsNull=False)
    return result


def output_fields(plan: ServingPlan) -> list[Any]:
    """The StructFields TFModel appends, in ``output_mapping`` key order."""
    from pyspark.sql import types as T

    return [T.StructField(o.column, spark_type(TensorSpec(o.tensor, o.dtype, o.shape)), False) for o in plan.outputs]


def _check_feedable(schema: Any, bindings: tuple[InputBinding, ...]) -> None:
    """Spark ML vectors cannot be fed; say how to convert them before any job runs."""
    for b in bindings:
        if type(schema[b.column].dataType).__name__ == "VectorUDT":
            raise InputError(
                "a Spark ML vector column cannot be fed to a signature input; convert "
                "it with pyspark.ml.functions.vector_to_array",
                column=b.column,
            )


def plan_serving(
    schema: Any,
    *,
    export_dir: str | None,
    tag_set: str | None,
    signature_def_key: str | None,
    input_mapping: Mapping[str, str],
    output_mapping: Mapping[str, str],
    batch_size: int,
) -> ServingPlan:
    """Read the signature, bind columns, and make the id executors cache the model under."""
    if not export_dir:
        raise ConfigError(
            "TFModel serves a SavedModel and needs export_dir. Received: export_dir=None; "
            "set it with setExportDir(path)"
        )
    key = signature_def_key or "serving_default"
    location = resolve_export_dir(export_dir)
    graphs, digest = read_saved_model(location)
    signature = select_signature(graphs, tag_set, key, location)
    columns = list(schema.names)
    inputs = bind_inputs(signature, input_mapping, columns)
    _check_feedable(schema, inputs)
    outputs = bind_outputs(signature, output_mapping, columns)
    tags = tuple(t.strip() for t in tag_set.split(",") if t.strip()) if tag_set else None
    return ServingPlan(model_key(location, tag_set, key, digest), location, tags, key, inputs, outputs, batch_size)
