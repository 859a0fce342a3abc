"""The tf.train.Example codec: Arrow batches of DataFrame rows <-> serialized Examples.

The Example message is declared in :mod:`tfonspark.proto` (wire-compatible with
``tf.train.Example``), so no process imports TensorFlow. A *plan* maps a Spark schema to
features once per task: :func:`plan_write` for saving (refusing column types an Example cannot
hold), :func:`plan_read` for loading; :func:`encode_batch` and :func:`decode_batch` then move
whole Arrow batches. The type mapping is in :mod:`tfonspark.data.tfrecord`'s docstring.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as T

from ... import proto
from ...errors import ConfigError, DataFormatError, InputError
from .records import iter_file_records

__all__ = [
    "BYTES",
    "FLOAT",
    "INT64",
    "ReadColumn",
    "WriteColumn",
    "arrow_schema",
    "decode_batch",
    "encode_batch",
    "example_class",
    "parse_features",
    "plan_read",
    "plan_write",
    "read_file_batches",
]

#: The three ``Feature`` list kinds (field names of its ``kind`` oneof).
BYTES, FLOAT, INT64 = "bytes_list", "float_list", "int64_list"

_EXAMPLE = proto.Schema(
    "tfonspark.private.example",
    (
        proto.message("BytesList", proto.field("value", 1, "bytes", repeated=True)),
        proto.message("FloatList", proto.field("value", 1, "float", repeated=True)),
        proto.message("Int64List", proto.field("value", 1, "int64", repeated=True)),
        proto.message(
            "Feature",
            proto.field(BYTES, 1, "BytesList", oneof="kind"),
            proto.field(FLOAT, 2, "FloatList", oneof="kind"),
            proto.field(INT64, 3, "Int64List", oneof="kind"),
        ),
        proto.message("Features", proto.map_field("feature", 1, "string", "Feature")),
        proto.message("Example", proto.field("features", 1, "Features")),
    ),
)
_INT_TYPES = (T.BooleanType, T.ByteType, T.ShortType, T.IntegerType, T.LongType)
_FLOAT_TYPES = (T.FloatType, T.DoubleType)
_SUPPORTED = "boolean, tinyint, smallint, int, bigint, float, double, string, binary and arrays of them"
_BATCH_ROWS = 4096
_BATCH_BYTES = 32 << 20


def example_class() -> Any:
    """The protobuf class of ``tf.train.Example`` (tensorflow/core/example/{example,feature}.proto)."""
    return _EXAMPLE.message_class("Example")


def parse_features(data: bytes, path: str, offset: int | None) -> Any:
    """The ``features.feature`` map of a serialized Example, or a DataFormatError."""
    from google.protobuf.message import DecodeError

    try:
        return example_class().FromString(data).features.feature
    except DecodeError as err:
        raise DataFormatError(
            f"TFRecord record is not a serialized tf.train.Example ({err})",
            path=path,
            offset=offset,
        ) from err


# ---- DataFrame rows (Arrow batches) -> Examples ---------------------------------------------


@dataclass(frozen=True)
class WriteColumn:
    """How one DataFrame column becomes a feature: list kind, array or not, Arrow cast first."""

    name: str
    kind: str
    is_list: bool
    cast: str | None  # "int64" / "binary": normalize before to_pylist (bools, str -> bytes)


def plan_write(schema: T.StructType) -> tuple[WriteColumn, ...]:
    """Map every column of ``schema`` to a feature kind, refusing types Example cannot hold."""
    plan = []
    for fld in schema.fields:
        dtype = fld.dataType
        is_list = isinstance(dtype, T.ArrayType)
        leaf = dtype.elementType if isinstance(dtype, T.ArrayType) else dtype
        if isinstance(leaf, _INT_TYPES):
            kind, cast = INT64, "int64"
        elif isinstance(leaf, _FLOAT_TYPES):
            kind, cast = FLOAT, None
        elif isinstance(leaf, T.StringType):
            kind, cast = BYTES, "binary"
        elif isinstance(leaf, T.BinaryType):
            kind, cast = BYTES, None
        else:
            raise InputError(
                f"column type {dtype.simpleString()} cannot be stored in a tf.train.Example; "
                f"supported: {_SUPPORTED}. Cast or drop the column first",
                column=fld.name,
            )
        plan.append(WriteColumn(fld.name, kind, is_list, cast))
    return tuple(plan)


def _cast_for_write(array: pa.Array, cast: str | None) -> pa.Array:
    """Cast ints/bools to int64 and strings to binary (keeping list/large-list shape)."""
    if cast is None:
        return array
    typ = array.type
    is_list = pa.types.is_list(typ) or pa.types.is_large_list(typ)
    value_type = typ.value_type if is_list else typ
    if cast == "int64":
        leaf = pa.int64()
    else:
        leaf = pa.large_binary() if pa.types.is_large_string(value_type) else pa.binary()
    if not is_list:
        return array.cast(leaf)
    return array.cast(pa.large_list(leaf) if pa.types.is_large_list(typ) else pa.list_(leaf))


def _check_no_null_elements(array: pa.Array, column: str, partition: int | None, first_row: int) -> None:
    """Refuse arrays with null elements: Example lists cannot represent them."""
    flat = pc.list_flatten(array)
    if flat.null_count == 0:
        return
    parents = pc.filter(pc.list_parent_indices(array), pc.is_null(flat))
    raise InputError(
        "array holds a null element; tf.train.Example lists cannot hold nulls (drop or fill them first)",
        column=column,
        partition=partition,
        row=first_row + int(parents[0].as_py()),
    )


def encode_batch(
    batch: pa.RecordBatch,
    plan: Sequence[WriteColumn],
    *,
    partition: int | None = None,
    first_row: int = 0,
) -> list[bytes]:
    """Serialize each row of ``batch`` (columns in ``plan`` order) as a tf.train.Example."""
    columns = []
    for index, col in enumerate(plan):
        array = batch.column(index)
        if col.is_list:
            _check_no_null_elements(array, col.name, partition, first_row)
        values = _cast_for_write(array, col.cast).to_pylist()
        columns.append((col.name, col.kind, col.is_list, values))
    return list(_encode_rows(columns, batch.num_rows))


def _encode_rows(columns: list[tuple[str, str, bool, list[Any]]], num_rows: int) -> Iterator[bytes]:
    """The row loop of :func:`encode_batch`: nulls are skipped, empty lists keep their kind."""
    new_example = example_class()
    for row in range(num_rows):
        example = new_example()
        fmap = example.features.feature
        for name, kind, is_list, values in columns:
            value = values[row]
            if value is None:
                continue
            target = getattr(fmap[name], kind)
            if not is_list:
                target.value.append(value)
            elif value:
                target.value.extend(value)
            else:
                target.SetInParent()
        yield example.SerializeToString()


# ---- Examples -> Arrow batches of a given schema -----------------------------------------------


@dataclass(frozen=True)
class ReadColumn:
    """How one feature becomes a column: accepted kinds, array or not, Arrow types."""

    name: str
    type_name: str
    kinds: frozenset[str]
    is_list: bool
    build: pa.DataType  # type the Python values are first put into
    arrow: pa.DataType  # type Spark expects


def _leaf_read_types(leaf: T.DataType) -> tuple[frozenset[str], pa.DataType, pa.DataType] | None:
    """(accepted kinds, build type, final Arrow type) for a scalar Spark type, or None."""
    ints = {
        T.LongType: pa.int64(),
        T.IntegerType: pa.int32(),
        T.ShortType: pa.int16(),
        T.ByteType: pa.int8(),
        T.BooleanType: pa.bool_(),
    }
    for spark_type, arrow in ints.items():
        if isinstance(leaf, spark_type):
            return frozenset([INT64]), pa.int64(), arrow
    if isinstance(leaf, _FLOAT_TYPES):
        arrow = pa.float64() if isinstance(leaf, T.DoubleType) else pa.float32()
        return frozenset([FLOAT, INT64]), pa.float64(), arrow
    if isinstance(leaf, T.StringType):
        return frozenset([BYTES]), pa.binary(), pa.string()
    if isinstance(leaf, T.BinaryType):
        return frozenset([BYTES]), pa.binary(), pa.binary()
    return None


def plan_read(schema: T.StructType) -> tuple[ReadColumn, ...]:
    """Validate a load schema and say how to fill each of its columns."""
    plan = []
    for fld in schema.fields:
        dtype = fld.dataType
        is_list = isinstance(dtype, T.ArrayType)
        leaf = dtype.elementType if isinstance(dtype, T.ArrayType) else dtype
        types = _leaf_read_types(leaf)
        if types is None:
            raise ConfigError(
                f"schema column {fld.name!r} has type {dtype.simpleString()}, which TFRecords "
                f"cannot fill; supported: {_SUPPORTED}"
            )
        kinds, build, arrow = types
        if is_list:
            build, arrow = pa.list_(build), pa.list_(arrow)
        plan.append(ReadColumn(fld.name, dtype.simpleString(), kinds, is_list, build, arrow))
    return tuple(plan)


def _feature_value(fmap: Any, col: ReadColumn, path: str, offset: int) -> Any:
    """The Python value of ``col`` in one Example's feature map (None when absent)."""
    if col.name not in fmap:  # test first: indexing a missing key would insert it
        return None
    feature = fmap[col.name]
    kind = feature.WhichOneof("kind")
    if kind is None:
        values: Any = ()
    elif kind in col.kinds:
        values = getattr(feature, kind).value
        if kind == INT64 and FLOAT in col.kinds:  # int64 into a float column: may exceed 2**53
            values = [float(v) for v in values]
    else:
        raise DataFormatError(
            f"feature {col.name!r} is a {kind}, but its column type is {col.type_name}",
            path=path,
            offset=offset,
        )
    if col.is_list:
        return list(values)
    if len(values) == 1:
        return values[0]
    if not values:
        return None
    raise DataFormatError(
        f"feature {col.name!r} holds {len(values)} values, but its column type is the scalar "
        f"{col.type_name} (inferred from too few records? use an array type in schema=)",
        path=path,
        offset=offset,
    )


def _to_arrow(values: list[Any], col: ReadColumn, path: str, offsets: list[int]) -> pa.Array:
    """One column of a batch as Arrow; a value that does not fit names its record's offset."""
    try:
        array = pa.array(values, type=col.build)
        return array if array.type == col.arrow else array.cast(col.arrow)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as err:
        bad = _first_unconvertible(values, col)
        hint = " (list it in binary_features)" if "UTF8" in str(err) else ""
        raise DataFormatError(
            f"feature {col.name!r} does not fit column type {col.type_name}: {err}{hint}",
            path=path,
            offset=offsets[bad],
        ) from err


def _first_unconvertible(values: list[Any], col: ReadColumn) -> int:
    """Index of the first value Arrow cannot convert to the column's type (error path only)."""
    for index, value in enumerate(values):
        try:
            pa.array([value], type=col.build).cast(col.arrow)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            return index
    return 0


def decode_batch(records: Sequence[tuple[int, bytes]], plan: Sequence[ReadColumn], path: str) -> pa.RecordBatch:
    """Parse ``(offset, data)`` records into one Arrow batch with the columns of ``plan``."""
    columns: list[list[Any]] = [[] for _ in plan]
    for offset, data in records:
        fmap = parse_features(data, path, offset)
        for col, out in zip(plan, columns, strict=True):
            out.append(_feature_value(fmap, col, path, offset))
    offsets = [offset for offset, _ in records]
    arrays = [_to_arrow(values, col, path, offsets) for values, col in zip(columns, plan, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema(plan))


def arrow_schema(plan: Sequence[ReadColumn]) -> pa.Schema:
    """The Arrow schema of batches decoded with ``plan``."""
    return pa.schema([pa.field(col.name, col.arrow, nullable=True) for col in plan])


def read_file_batches(
    uri: str,
    plan: Sequence[ReadColumn],
    *,
    max_rows: int = _BATCH_ROWS,
    max_bytes: int = _BATCH_BYTES,
) -> Iterator[pa.RecordBatch]:
    """Arrow batches of at most ``max_rows`` rows (or about ``max_bytes``) from one file."""
    pending: list[tuple[int, bytes]] = []
    size = 0
    for offset, data in iter_file_records(uri):
        pending.append((offset, data))
        size += len(data)
        if len(pending) >= max_rows or size >= max_bytes:
            yield decode_batch(pending, plan, uri)
            pending, size = [], 0
    if pending:
        yield decode_batch(pending, plan, uri)
