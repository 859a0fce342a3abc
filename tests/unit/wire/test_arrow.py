"""wire/arrow.py: Arrow record batches read as columns, and result columns written back as Arrow."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tfonspark.errors import InputError
from tfonspark.wire.arrow import arrow_to_columns, columns_to_arrow
from tfonspark.wire.codec import ColumnBatch, decode_batch, encode_batch


def round_trip(batch: ColumnBatch) -> ColumnBatch:
    """Encode to frame parts, join them as the wire would, decode the received frame."""
    parts = encode_batch(batch)
    payload = bytearray(b"".join(bytes(memoryview(p).cast("B")) if not isinstance(p, bytes) else p for p in parts))
    return decode_batch(memoryview(payload))


def test_arrow_numeric_columns():
    rb = pa.record_batch(
        {"i": pa.array([1, 2, 3], pa.int32()), "f": pa.array([0.5, 1.5, 2.5]), "b": pa.array([True, False, True])}
    )
    batch = arrow_to_columns(rb, partition=0)
    assert batch.layout == "tuple" and batch.names == ["i", "f", "b"]
    i, f, b = batch.columns
    assert i.dtype == np.int32 and i.tolist() == [1, 2, 3]
    assert f.dtype == np.float64 and b.dtype == np.bool_ and b.tolist() == [True, False, True]


@pytest.mark.parametrize("typ", [pa.list_(pa.float32()), pa.large_list(pa.float32()), pa.list_(pa.float32(), 3)])
def test_arrow_fixed_width_lists_become_2d(typ):
    values = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
    batch = arrow_to_columns(pa.record_batch({"v": pa.array(values, typ)}), partition=0)
    (col,) = batch.columns
    assert col.shape == (2, 3) and col.dtype == np.float32 and col.tolist() == values


def test_arrow_nested_lists_become_3d():
    values = [[[1, 2], [3, 4], [5, 6]], [[7, 8], [9, 10], [11, 12]]]
    (col,) = arrow_to_columns(pa.record_batch({"m": pa.array(values, pa.list_(pa.list_(pa.int64())))}), 0).columns
    assert col.shape == (2, 3, 2) and col.tolist() == values


def test_arrow_sliced_batches_keep_their_rows():
    rb = pa.record_batch(
        {"v": pa.array([[i, i + 1] for i in range(10)], pa.list_(pa.int64())), "i": pa.array(range(10))}
    ).slice(3, 4)
    v, i = arrow_to_columns(rb, 0).columns
    assert i.tolist() == [3, 4, 5, 6] and v.tolist() == [[3, 4], [4, 5], [5, 6], [6, 7]]


def test_arrow_empty_lists():
    (col,) = arrow_to_columns(pa.record_batch({"v": pa.array([[], []], pa.list_(pa.float64()))}), 0).columns
    assert col.shape == (2, 0)


@pytest.mark.parametrize(
    ("values", "row"),
    [
        ([[1.0, 2.0], [1.0, 2.0], [3.0]], 2),
        ([[1.0], [1.0, 2.0]], 1),
        ([[[1.0], [2.0]], [[3.0], [4.0, 5.0]]], 1),  # ragged one level down
    ],
)
def test_arrow_ragged_lists_name_the_row(values, row):
    rb = pa.record_batch({"v": pa.array(values)})
    with pytest.raises(InputError, match="ragged") as info:
        arrow_to_columns(rb, partition=3, first_row=100)
    assert (info.value.column, info.value.partition, info.value.row) == ("v", 3, 100 + row)


@pytest.mark.parametrize(
    ("arr", "row"),
    [
        (pa.array([1.0, None, 3.0]), 1),
        (pa.array([[1.0], None, [3.0]]), 1),
        (pa.array([[1.0, 2.0], [3.0, 4.0], [5.0, None]]), 2),  # a null inside an array
        (pa.array([[[1.0], [2.0]], [[3.0], [4.0]], [[5.0], [None]]]), 2),
        (pa.array([[[1.0], [2.0]], [[3.0], None]]), 1),
    ],
)
def test_arrow_nulls_name_the_row(arr, row):
    with pytest.raises(InputError, match="null") as info:
        arrow_to_columns(pa.record_batch({"x": pa.array([0] * len(arr)), "v": arr}), partition=1, first_row=50)
    assert (info.value.column, info.value.partition, info.value.row) == ("v", 1, 50 + row)


def test_arrow_strings_and_binary_become_lists():
    rb = pa.record_batch(
        {"s": pa.array(["a", "bé"]), "ls": pa.array(["x", "y"], pa.large_string()), "b": pa.array([b"\x00", b"\x01"])}
    )
    assert arrow_to_columns(rb, 0).columns == [["a", "bé"], ["x", "y"], [b"\x00", b"\x01"]]


def test_arrow_spark_ml_vectors_get_a_helpful_error():
    vec = pa.StructArray.from_arrays(
        [
            pa.array([1, 1], pa.int8()),
            pa.array([None, None], pa.int32()),
            pa.array([None, None], pa.list_(pa.int32())),
            pa.array([[1.0], [2.0]]),
        ],
        names=["type", "size", "indices", "values"],
    )
    with pytest.raises(InputError, match="vector_to_array"):
        arrow_to_columns(pa.record_batch({"features": vec}), 0)


def test_arrow_unsupported_types():
    with pytest.raises(InputError, match="cannot be fed") as info:
        arrow_to_columns(pa.record_batch({"m": pa.array([{"k": 1}], pa.map_(pa.string(), pa.int64()))}), 4)
    assert (info.value.column, info.value.partition) == ("m", 4)


def _schema(*fields) -> str:
    types = pytest.importorskip("pyspark.sql.types")
    return types.StructType([types.StructField(n, t) for n, t in fields]).json()


def test_columns_to_arrow_round_trip():
    types = pytest.importorskip("pyspark.sql.types")
    schema = _schema(
        ("id", types.LongType()),
        ("v", types.ArrayType(types.FloatType())),
        ("s", types.StringType()),
        ("ok", types.BooleanType()),
    )
    rb = pa.record_batch(
        {
            "id": pa.array([1, 2, 3], pa.int64()),
            "v": pa.array([[1, 2], [3, 4], [5, 6]], pa.list_(pa.float32())),
            "s": pa.array(["a", "b", "c"]),
            "ok": pa.array([True, False, True]),
        }
    )
    out = columns_to_arrow(arrow_to_columns(rb, 0), schema)
    assert out.schema.names == ["id", "v", "s", "ok"]
    assert out.to_pydict() == rb.to_pydict()
    # and through the wire codec in between
    assert columns_to_arrow(round_trip(arrow_to_columns(rb, 0)), schema).to_pydict() == rb.to_pydict()


def test_columns_to_arrow_from_scalar_results():
    types = pytest.importorskip("pyspark.sql.types")
    out = columns_to_arrow(ColumnBatch([np.array([0.5, 1.5])], "scalar"), _schema(("p", types.DoubleType())))
    assert out.to_pydict() == {"p": [0.5, 1.5]}
    # tuple results in one scalar column are split over the schema's fields
    out = columns_to_arrow(
        ColumnBatch([[(1, "a"), (2, "b")]], "scalar"), _schema(("n", types.LongType()), ("s", types.StringType()))
    )
    assert out.to_pydict() == {"n": [1, 2], "s": ["a", "b"]}


def test_columns_to_arrow_with_the_wrong_number_of_fields():
    types = pytest.importorskip("pyspark.sql.types")
    with pytest.raises(InputError, match="2 fields per row but the output schema has 1"):
        columns_to_arrow(ColumnBatch([np.arange(2), np.arange(2)]), _schema(("p", types.LongType())))
