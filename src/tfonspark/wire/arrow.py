"""Arrow record batches <-> columnar batches (:class:`~tfonspark.wire.codec.ColumnBatch`), without Python rows.

The other half of the wire format: the feeder turns a DataFrame's Arrow batches into the
columns it sends (``mapInArrow``) and inference results back into Arrow; TFModel serving turns
the columns of an Arrow UDF into the arrays a signature takes. Data errors name the column,
partition and row (:class:`~tfonspark.errors.InputError`).
"""

from __future__ import annotations

import functools
import json
from typing import Any

import numpy as np

from ..errors import InputError
from ..wire.codec import ColumnBatch

__all__ = ["arrow_to_columns", "columns_to_arrow"]


def _first_null(arr: Any) -> int:
    return int(np.flatnonzero(np.asarray(arr.is_null()))[0])


def _dense(arr: Any, name: str, partition: int, first_row: int, per_row: int = 1) -> Any:
    """A numeric Arrow column (or nested lists of numbers) as one dense numpy array.

    ``per_row``: how many elements of ``arr`` make one row (for the flattened values of nested
    lists), so errors name the row, not the position in the flattened values.
    """
    import pyarrow as pa

    if arr.null_count:
        raise InputError(
            "null value where a tensor is expected",
            column=name,
            partition=partition,
            row=first_row + _first_null(arr) // per_row,
        )
    t = arr.type
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
        return arr.to_numpy(zero_copy_only=False)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        lengths = np.asarray(arr.value_lengths())
        if len(lengths) and (lengths != lengths[0]).any():
            bad = int(np.flatnonzero(lengths != lengths[0])[0])
            raise InputError(
                f"ragged array: {lengths[bad]} elements where the first row has {lengths[0]}",
                column=name,
                partition=partition,
                row=first_row + bad // per_row,
            )
        inner = _dense(arr.flatten(), name, partition, first_row, per_row * (int(lengths[0]) if len(lengths) else 1))
        return inner.reshape((len(arr), int(lengths[0]) if len(lengths) else 0, *inner.shape[1:]))
    if pa.types.is_struct(t) and {f.name for f in t} >= {"type", "values"}:
        raise InputError(
            "a Spark ML vector column cannot be fed directly; convert it with pyspark.ml.functions.vector_to_array",
            column=name,
            partition=partition,
        )
    raise InputError(
        f"type {t} cannot be fed as a tensor; supported: numbers, booleans, strings, "
        "binary and (nested) arrays of numbers",
        column=name,
        partition=partition,
    )


def arrow_to_columns(rb: Any, partition: int, first_row: int = 0) -> ColumnBatch:
    """One Arrow record batch as named columns (strings/binary become lists)."""
    import pyarrow as pa

    columns: list[Any] = []
    for name, arr in zip(rb.schema.names, rb.columns):
        if pa.types.is_string(arr.type) or pa.types.is_binary(arr.type) or pa.types.is_large_string(arr.type):
            columns.append(arr.to_pylist())
        else:
            columns.append(_dense(arr, name, partition, first_row))
    return ColumnBatch(columns, "tuple", list(rb.schema.names))


def _to_arrow_array(col: Any, field: Any) -> Any:
    import pyarrow as pa

    if isinstance(col, np.ndarray) and col.ndim > 1:
        flat = col.reshape(len(col), -1) if col.ndim > 2 else col
        values = _to_arrow_array(flat.reshape(-1), pa.field("item", field.type.value_type))
        offsets = np.arange(0, flat.size + 1, flat.shape[1], dtype=np.int32)
        return pa.ListArray.from_arrays(pa.array(offsets), values).cast(field.type)
    arr = pa.array(col if isinstance(col, np.ndarray) else list(col))
    return arr if arr.type == field.type else arr.cast(field.type)


@functools.lru_cache(maxsize=16)
def _arrow_schema(schema_json: str) -> Any:
    """The Arrow schema of a Spark schema (JSON), parsed once per task process, not per batch."""
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    return to_arrow_schema(StructType.fromJson(json.loads(schema_json)))


def columns_to_arrow(batch: ColumnBatch, schema_json: str) -> Any:
    """Results as an Arrow record batch of the given Spark schema (JSON)."""
    import pyarrow as pa

    schema = _arrow_schema(schema_json)
    columns = batch.columns
    if len(columns) == 1 and len(schema) > 1 and batch.layout == "scalar":
        rows = list(columns[0])
        columns = [[r[i] for r in rows] for i in range(len(schema))]
    if len(columns) != len(schema):
        raise InputError(
            f"inference results have {len(columns)} fields per row but the output "
            f"schema has {len(schema)}: {schema.names}"
        )
    arrays = [_to_arrow_array(c, f) for c, f in zip(columns, schema)]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
