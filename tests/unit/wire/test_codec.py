"""Columnar batches: pack_rows, the batch frame codec, and Arrow <-> columns."""

from __future__ import annotations

import itertools
import json
import os
import pickle
import shlex
import struct
from collections import namedtuple
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from tfonspark.errors import InputError, ProtocolError
from tfonspark.executor.feedbatches import row_batches
from tfonspark.wire import packing
from tfonspark.wire.arrow import arrow_to_columns, columns_to_arrow
from tfonspark.wire.codec import ColumnBatch, decode_batch, encode_batch
from tfonspark.wire.packing import Scratch, pack_rows


def round_trip(batch: ColumnBatch) -> ColumnBatch:
    """Encode to frame parts, join them as the wire would, decode the received frame."""
    parts = encode_batch(batch)
    payload = bytearray(b"".join(bytes(memoryview(p).cast("B")) if not isinstance(p, bytes) else p for p in parts))
    return decode_batch(memoryview(payload))


def frame(header: dict, *buffers: bytes) -> memoryview:
    h = json.dumps(header).encode()
    return memoryview(b"B" + struct.pack(">I", len(h)) + h + b"".join(buffers))


# ---- pack_rows ------------------------------------------------------------------------------------


def test_scalar_rows():
    batch = pack_rows([1, 2, 3])
    assert batch.layout == "scalar" and batch.count == 3 and batch.names is None
    (col,) = batch.columns
    assert isinstance(col, np.ndarray) and col.dtype == np.int64 and col.tolist() == [1, 2, 3]
    assert batch.rows() == [1, 2, 3]
    assert pack_rows([1.5, 2.5]).columns[0].dtype == np.float64
    assert pack_rows([True, False]).columns[0].dtype == np.bool_
    assert pack_rows([np.float32(1), np.float32(2)]).columns[0].dtype == np.float32


def test_string_and_bytes_rows_stay_python_values():
    assert pack_rows(["a", "bb", ""]).columns == [["a", "bb", ""]]
    assert pack_rows([b"\x00", b"\xff"]).columns == [[b"\x00", b"\xff"]]
    assert pack_rows(["a", "b"]).rows() == ["a", "b"]


def test_numpy_rows_stack_into_one_array():
    rows = [np.full((2, 3), i, dtype=np.float32) for i in range(4)]
    batch = pack_rows(rows)
    (col,) = batch.columns
    assert batch.layout == "scalar" and col.shape == (4, 2, 3) and col.dtype == np.float32
    assert all(np.array_equal(a, b) for a, b in zip(batch.rows(), rows, strict=True))


def test_tuple_rows_become_columns():
    rows = [(i, float(i) / 2, np.arange(3, dtype=np.int16) + i, f"s{i}") for i in range(5)]
    batch = pack_rows(rows)
    assert batch.layout == "tuple" and batch.names is None and batch.count == 5
    ids, halves, vecs, strs = batch.columns
    assert ids.dtype == np.int64 and halves.dtype == np.float64
    assert vecs.shape == (5, 3) and vecs.dtype == np.int16
    assert strs == [f"s{i}" for i in range(5)]
    back = batch.rows()
    assert [r[0] for r in back] == list(range(5)) and [r[3] for r in back] == strs
    assert np.array_equal(back[2][2], rows[2][2])


def test_list_rows_are_like_tuples():
    batch = pack_rows([[1, 2.0], [3, 4.0]])
    assert batch.layout == "tuple" and [c.tolist() for c in batch.columns] == [[1, 3], [2.0, 4.0]]
    assert batch.rows() == [(1, 2.0), (3, 4.0)]


def test_nested_list_fields_become_2d_columns():
    batch = pack_rows([(0, [1.0, 2.0]), (1, [3.0, 4.0])])
    assert batch.columns[1].shape == (2, 2)


def test_dict_rows_keep_names():
    rows = [{"x": [1.0, 2.0], "y": i, "name": f"n{i}"} for i in range(3)]
    batch = pack_rows(rows)
    assert batch.layout == "dict" and batch.names == ["x", "y", "name"]
    assert batch.columns[0].shape == (3, 2) and batch.columns[1].tolist() == [0, 1, 2]
    back = batch.rows()
    assert back[1]["y"] == 1 and back[1]["name"] == "n1" and np.array_equal(back[1]["x"], [1.0, 2.0])


def test_dict_rows_with_keys_in_another_order_are_fine():
    batch = pack_rows([{"a": 1, "b": 2}, {"b": 4, "a": 3}])
    assert batch.names == ["a", "b"] and [c.tolist() for c in batch.columns] == [[1, 3], [2, 4]]


def test_pyspark_rows_keep_their_field_names():
    Row = pytest.importorskip("pyspark.sql").Row
    rows = [Row(label=i, features=[float(i)] * 3) for i in range(4)]
    batch = pack_rows(rows)
    assert batch.layout == "tuple" and batch.names == ["label", "features"]
    assert batch.columns[0].tolist() == [0, 1, 2, 3] and batch.columns[1].shape == (4, 3)


def test_rows_of_tuple_subclasses_and_lists_mix():
    Point = namedtuple("Point", "x y")
    batch = pack_rows([Point(1, 2), (3, 4), [5, 6]])
    assert batch.layout == "tuple" and [c.tolist() for c in batch.columns] == [[1, 3, 5], [2, 4, 6]]


def test_array_rows_of_different_float_widths_promote_like_numpy():
    batch = pack_rows([np.ones(2, np.float32), np.ones(2, np.float64)])
    assert batch.columns[0].dtype == np.float64 and batch.columns[0].shape == (2, 2)


# ---- Scratch: large array columns packed into reused memory -----------------------------------------


def big_rows(n: int, shape=(784,), dtype=np.float32, start: int = 0) -> list:
    return [(np.full(shape, start + i, dtype), start + i) for i in range(n)]


@pytest.mark.parametrize("shape", [(784,), (28, 28), (4, 8, 8)])
def test_scratch_packs_the_same_values_as_without(shape):
    rows = big_rows(50, shape)
    plain, reused = pack_rows(rows), pack_rows(rows, scratch=Scratch())
    assert reused.columns[0].shape == (50, *shape) and reused.columns[0].dtype == np.float32
    np.testing.assert_array_equal(reused.columns[0], plain.columns[0])
    np.testing.assert_array_equal(reused.columns[1], plain.columns[1])
    assert round_trip(reused).columns[0].tolist() == plain.columns[0].tolist()


def test_scratch_reuses_its_memory_from_batch_to_batch():
    scratch = Scratch()
    first = pack_rows(big_rows(40), scratch=scratch).columns[0]
    second = pack_rows(big_rows(30, start=100), scratch=scratch).columns[0]
    assert np.shares_memory(first, second)  # no fresh multi-MB allocation per batch
    assert second[:, 0].tolist() == list(range(100, 130))
    third = pack_rows(big_rows(80, start=500), scratch=scratch).columns[0]  # grows when needed
    assert third.shape == (80, 784) and third[:, 0].tolist() == list(range(500, 580))


@pytest.mark.parametrize(
    "rows",
    [
        [np.zeros(784, np.float32), np.zeros(784, np.float64)],  # dtypes promote, as without
        [np.zeros(784, np.float32), np.zeros(784, np.float32).view(type("Sub", (np.ndarray,), {}))],
        [np.zeros(784, np.float32), [0.0] * 784],  # a list among arrays
        [np.zeros(8, np.float32), np.zeros(8, np.float32)],  # small values: np.asarray
    ],
)
def test_scratch_falls_back_to_numpy_rules(rows):
    assert pack_rows(rows, scratch=Scratch()).columns[0].tolist() == pack_rows(rows).columns[0].tolist()


@pytest.mark.parametrize(
    ("rows", "row"),
    [
        ([np.zeros(784), np.zeros(784), np.zeros(783)], 2),
        ([np.zeros((28, 28)), np.zeros((28, 27))], 1),
    ],
)
def test_scratch_still_names_the_ragged_row(rows, row):
    with pytest.raises(InputError, match="ragged") as info:
        pack_rows(rows, partition=3, first_row=10, scratch=Scratch())
    assert (info.value.partition, info.value.row) == (3, 10 + row)


# ---- columns of list/tuple features (TFoS rows: ``(vec[1:], vec[0])``, ``x.tolist()``) ------------


def like_numpy(rows: list, scratch: Scratch | None = None) -> None:
    """pack_rows gives each field the dtype, shape and values that np.asarray gives it."""
    batch = pack_rows(rows, scratch=scratch)
    for j, column in enumerate(batch.columns):
        expected = np.asarray([row[j] for row in rows])
        assert column.dtype == expected.dtype and column.shape == expected.shape, (j, column.dtype, expected.dtype)
        np.testing.assert_array_equal(column, expected)


W784 = [i / 7 for i in range(784)]


@pytest.mark.parametrize(
    "rows",
    [
        [(list(W784), i) for i in range(40)],  # (x.tolist(), label)
        [(tuple(W784), i) for i in range(40)],
        [[list(W784), float(i)] for i in range(40)],  # list rows, float label: (vec[1:], vec[0])
        [([i] * 784, i) for i in range(40)],  # ints stay int64
        [([1, 2.5] * 16, 0), ([3, 4] * 16, 1)],  # ints among floats: float64, as numpy
        [([1] * 32, 0), ([1.5] * 32, 1)],  # a float after int rows: float64, as numpy
        [([1.0] * 32, 0), ([True, 2] * 16, 1)],  # bools and ints among floats
        [([True, False] * 16, 0)] * 3,  # bools stay bool
        [([np.float32(1)] * 32, 0)] * 3,  # numpy float32 values stay float32
        [([1.0] * 32, 0), ([np.float32(2)] * 32, 1)],
        [([[float(i)] * 28 for _ in range(28)], i) for i in range(20)],  # 28x28 as lists of lists
        [(tuple(tuple([1.0] * 28) for _ in range(28)), 1)] * 3,
        [([[[1.0, 2.0]] * 3] * 4, 1)] * 5,  # 3-D
        [([float(i), 2.0], i) for i in range(2500)],  # narrow rows, more than one block
        [([i, -i], i) for i in range(1100)],
        [([1.0], 0)] * 5,
        [([2**63] * 32, 1)] * 2,  # beyond int64: uint64, as numpy
        [([float("inf"), float("nan")] * 16, 1)] * 3,
        [([1.0] * 32, 1), (tuple([2.0] * 32), 1)],  # lists and tuples mix
        [([1.0] * 32, 1), ([1.0] * 31 + [1j], 1)],  # a complex: complex128, as numpy
    ],
)
def test_list_features_pack_like_numpy(rows):
    like_numpy(rows)
    like_numpy(rows, Scratch())


def test_list_features_reuse_scratch_memory():
    scratch = Scratch()
    first = pack_rows([(list(W784), i) for i in range(40)], scratch=scratch).columns[0]
    second = pack_rows([([float(i)] * 784, i) for i in range(30)], scratch=scratch).columns[0]
    assert np.shares_memory(first, second) and second[:, 0].tolist() == [float(i) for i in range(30)]
    assert round_trip(pack_rows([([1.5] * 784, 1)] * 3, scratch=Scratch())).columns[0].tolist() == [[1.5] * 784] * 3


@pytest.mark.parametrize(
    ("rows", "row", "words"),
    [
        ([(list(W784), 1)] * 40 + [(W784[:-1], 1)], 40, "shape=(783,)"),
        ([([[1.0] * 28] * 28, 1), ([[1.0] * 28] * 27, 1)], 1, "shape=(27, 28)"),
        ([([[1.0] * 28] * 28, 1), ([[1.0] * 27, [1.0] * 29] + [[1.0] * 28] * 26, 1)], 1, "different lengths"),
        ([([[1.0], [1.0, 2.0]], 1)] * 2, 0, "different lengths"),
        ([([1.0, 2.0], 1)] * 10 + [([1.0], 1)], 10, "shape=(1,)"),
        ([([1.0] * 32, 1), ([1.0] * 31 + [[1.0]], 1)], 1, "different lengths"),
        ([([1.0] * 32, 1), ([1.0] * 31 + ["x"], 1)], 1, "dtype=<U32"),
        ([([1.0] * 32, 1), ([1.0] * 31 + [None], 1)], 1, "dtype=object"),
        ([([1.0, 2.0], 1)] * 10 + [([1.0, "a"], 1)], 10, "dtype=<U32"),
    ],
)
def test_list_features_that_differ_give_the_errors_numpy_rules_give(rows, row, words):
    for scratch in (None, Scratch()):
        with pytest.raises(InputError) as info:
            pack_rows(rows, partition=4, first_row=100, scratch=scratch)
        assert (info.value.column, info.value.partition, info.value.row) == (0, 4, 100 + row)
        assert words in str(info.value)


def _recorded_chunks(monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], Any]:
    """The sizes of the chunks the feed task hands ``pack_rows``, and a function giving the
    batch sizes it feeds for some rows."""
    from tfonspark.executor import feedbatches

    chunks: list[int] = []

    def recording(rows, *args, **kwargs):
        chunks.append(len(rows))
        return pack_rows(rows, *args, **kwargs)

    monkeypatch.setattr(feedbatches, "pack_rows", recording)

    def counts(rows: list) -> list[int]:
        chunks.clear()
        return [b.count for b in row_batches(0, iter(rows))]

    return chunks, counts


@pytest.mark.skipif(packing.native is None, reason="the C packer was not built")
def test_feed_task_packs_rows_like_the_first_one_at_a_time_into_4_mb_frames(monkeypatch):
    chunks, counts = _recorded_chunks(monkeypatch)
    rows = [(list(W784), i) for i in range(1000)]
    assert counts(rows) == [16, 697, 287]  # whole chunks of 41 rows up to 4 MB // 6,280 bytes a row
    assert chunks == [16]  # only the first chunk went to pack_rows; the rest were packed as they came
    got = list(itertools.chain.from_iterable(b.rows() for b in row_batches(0, iter(rows))))
    assert [r[1] for r in got] == list(range(1000)) and all(list(r[0]) == W784 for r in got)
    assert counts([(np.zeros(784, np.float32), i) for i in range(3000)]) == [16, 1334, 1334, 316]  # 4 MB
    assert counts(list(range(70_000))) == [16, 65536, 4448]
    assert chunks == [16]


def test_without_the_c_packer_the_feed_task_packs_chunks_of_at_most_32768_values(monkeypatch):
    chunks, counts = _recorded_chunks(monkeypatch)
    monkeypatch.setattr(packing, "native", None)
    assert counts([(list(W784), i) for i in range(1000)]) == [16, 697, 287]  # the same frames
    assert chunks == [16] + [41] * 24  # 32,768 // 786 values
    monkeypatch.undo()
    chunks, counts = _recorded_chunks(monkeypatch)  # with the C packer: dict rows still go by chunks
    assert counts([{"x": float(i)} for i in range(70_000)]) == [16, 65536, 4448]
    assert chunks == [16] + [16384] * 4 + [4448]  # 32,768 // 2 values (the dict and its value)


def _fed(rows: list) -> list:
    return list(itertools.chain.from_iterable(b.rows() for b in row_batches(3, iter(rows))))


@pytest.mark.parametrize("until", [58, 200])  # one ragged row, or every row from there on
def test_a_ragged_row_at_the_start_of_a_chunk_is_named_against_its_frame(until):
    rows = [(list(W784), i) for i in range(200)]
    rows[57:until] = [(W784[:-1], i) for i in range(57, until)]  # 57 = 16 + 41: a chunk's first row
    with pytest.raises(InputError) as info:
        _fed(rows)
    assert (info.value.partition, info.value.row) == (3, 57)
    assert "expected shape=(784,) like the first row, received shape=(783,)" in str(info.value)


def test_chunks_of_another_dtype_or_python_values_start_new_frames():
    rows = [([1.0, 2.0], i) for i in range(40_000)] + [([1.0, 2.0], i + 0.5) for i in range(40_000)]
    got = _fed(rows)
    assert [r[1] for r in got] == [r[1] for r in rows] and all(list(r[0]) == [1.0, 2.0] for r in got)
    words = [(f"w{i}", i) for i in range(30_000)]
    assert _fed(words) == words


def test_namedtuple_rows_are_tuples():
    Point = namedtuple("Point", "x y")
    batch = pack_rows([Point(1, 2), Point(3, 4)])
    assert batch.layout == "tuple" and [c.tolist() for c in batch.columns] == [[1, 3], [2, 4]]


@pytest.mark.parametrize(
    ("rows", "column", "row", "words"),
    [
        ([(1, 2), (3, 4), (5, 6, 7)], None, 2, "expected 2 fields"),
        ([(1, 2), [3, 4], 5], None, 2, "received int"),
        ([np.zeros(3), np.zeros(3), np.zeros(4)], 0, 2, "shape=(4,)"),
        ([np.zeros((2, 2)), np.zeros((2, 3))], 0, 1, "expected shape=(2, 2)"),
        ([(1, [1.0, 2.0]), (2, [1.0])], 1, 1, "ragged"),
        ([(1.0,), (None,)], 0, 1, "None"),
        ([1, 2, "three"], 0, 2, "type=str"),  # numbers, then a string
        ([(1, 2.0), (2, "x")], 1, 1, "type=str"),
        ([[1, 2], [3, "x"]], 1, 1, "mixed"),
        ([np.zeros(3), 5.0], 0, 1, "shape=()"),  # an array column, then a scalar
        ([(np.zeros(3), 1), (np.zeros(3), 2), (np.zeros(2), 3)], 0, 2, "shape=(2,)"),
        ([(1, 2)] * 40 + [(1, 2, 3)], None, 40, "expected 2 fields"),  # found past the fast check
    ],
)
def test_ragged_or_mixed_rows_name_column_partition_and_row(rows, column, row, words):
    with pytest.raises(InputError) as info:
        pack_rows(rows, partition=7, first_row=1000)
    err = info.value
    assert (err.column, err.partition, err.row) == (column, 7, 1000 + row)
    assert words in str(err) and "partition=7" in str(err) and f"row={1000 + row}" in str(err)


@pytest.mark.parametrize(
    ("rows", "row"),
    [
        ([{"a": 1, "b": 2}, {"a": 3}], 1),  # missing key
        ([{"a": 1}, {"a": 2}, {"a": 3, "b": 4}], 2),  # an extra key is not silently dropped
        ([{"a": 1}, {"b": 2}], 1),
        ([{"a": 1}, (1,)], 1),  # not a dict at all
    ],
)
def test_dict_rows_with_other_keys(rows, row):
    with pytest.raises(InputError, match="keys") as info:
        pack_rows(rows, partition=2, first_row=10)
    assert (info.value.partition, info.value.row) == (2, 10 + row)


def test_a_row_among_dict_rows_is_named_however_indexing_it_fails():
    """A pyspark ``Row`` indexed by a key raised its own AttributeError out of ``pack_rows``
    (found by test_codec_property.py); a dict whose ``__getitem__`` raises KeyError, StopIteration."""
    from pyspark.sql import Row

    with pytest.raises(InputError, match="received a Row, not a dict") as info:
        pack_rows([{"x": 1.0}, {"x": 2.0}, Row()], partition=2, first_row=10)
    assert (info.value.partition, info.value.row) == (2, 12)

    class Locked(dict):  # type: ignore[type-arg]
        def __getitem__(self, key: Any) -> Any:
            raise KeyError(f"{key} is locked")

    with pytest.raises(KeyError, match="x is locked"):
        pack_rows([Locked(x=1.0), Locked(x=2.0)])


# ---- encode / decode ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype", ["int8", "uint16", "int32", "int64", "float16", "float32", "float64", "bool", "complex64"]
)
@pytest.mark.parametrize("shape", [(5,), (4, 3), (2, 3, 4), (0,), (0, 7)])
def test_numeric_round_trip_keeps_dtype_shape_and_values(dtype, shape):
    rng = np.random.default_rng(0)
    col = (rng.random(shape) * 100).astype(dtype)
    out = round_trip(ColumnBatch([col], "scalar"))
    (got,) = out.columns
    assert got.dtype == np.dtype(dtype) and got.shape == shape
    assert np.array_equal(got, col)
    assert out.layout == "scalar" and out.names is None


def test_round_trip_of_mixed_columns_layout_and_names():
    batch = ColumnBatch(
        [
            np.arange(3),
            ["α", "β", "γ"],
            [b"\x00", b"\x01", b"\x02"],
            np.ones((3, 2), np.float32),
            [{"k": 1}, None, 2.5],
        ],
        "dict",
        ["i", "s", "b", "v", "o"],
    )
    out = round_trip(batch)
    assert out.layout == "dict" and out.names == ["i", "s", "b", "v", "o"]
    assert out.columns[0].tolist() == [0, 1, 2]
    assert out.columns[1] == ["α", "β", "γ"] and out.columns[2] == [b"\x00", b"\x01", b"\x02"]
    assert np.array_equal(out.columns[3], np.ones((3, 2), np.float32))
    assert out.columns[4] == [{"k": 1}, None, 2.5]


def test_big_endian_input_arrives_with_the_same_values():
    col = np.arange(6, dtype=">f8").reshape(3, 2) * 1.25
    ints = np.array([1, -2, 70000], dtype=">i4")
    out = round_trip(ColumnBatch([col, ints]))
    assert np.array_equal(out.columns[0], col) and out.columns[0].dtype == np.float64
    assert out.columns[1].tolist() == [1, -2, 70000] and out.columns[1].dtype == np.int32


def test_non_contiguous_input_round_trips():
    base = np.arange(40, dtype=np.float32).reshape(8, 5)
    for col in (base[::2], base[:, 1:4], np.asfortranarray(base), base.T):
        out = round_trip(ColumnBatch([col]))
        assert np.array_equal(out.columns[0], col)


def test_numeric_columns_are_views_of_the_received_frame():
    parts = encode_batch(ColumnBatch([np.arange(4, dtype=np.int64)]))
    payload = bytearray(b"".join(bytes(p) for p in parts))
    out = decode_batch(memoryview(payload))
    payload[-8:] = (99).to_bytes(8, "little")  # change the frame: the column sees it (no copy)
    assert out.columns[0].tolist() == [0, 1, 2, 99]


def test_encode_does_not_copy_numeric_buffers():
    col = np.arange(1000, dtype=np.float64)
    parts = encode_batch(ColumnBatch([col]))
    assert isinstance(parts[1], memoryview) and np.shares_memory(np.asarray(parts[1]), col)


def test_slices_and_counts():
    batch = pack_rows([(i, f"s{i}") for i in range(10)])
    part = batch.slice(2, 5)
    assert part.count == 3 and part.columns[0].tolist() == [2, 3, 4] and part.columns[1] == ["s2", "s3", "s4"]
    assert ColumnBatch([]).count == 0
    assert batch.nbytes >= 10 * 8


def _evil(target) -> bytes:
    class Evil:
        def __reduce__(self):
            return os.system, (f"touch {shlex.quote(str(target))}",)

    return pickle.dumps(Evil())


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"J{}",
        b"B",
        b"B\x00\x00",
        b"B\x00\x00\x00\x05abc",
        b"B\x00\x00\x00\x04nope",
        b"B\xff\xff\xff\xff{}",
        bytes(frame({"layout": "tuple", "names": None})),  # no cols
        bytes(frame({"cols": [{"dtype": "<f8", "shape": [4]}], "layout": "tuple", "names": None}, b"\0" * 8)),
        bytes(frame({"cols": [{"dtype": "no-such-type", "shape": [1]}], "layout": "t", "names": None}, b"\0" * 8)),
        bytes(frame({"cols": [{"dtype": "<f8", "shape": ["x"]}], "layout": "t", "names": None}, b"\0" * 8)),
        bytes(frame({"cols": [{"dtype": "<f8", "shape": [-1]}], "layout": "t", "names": None}, b"\0" * 8)),
        bytes(frame({"cols": [{"dtype": "|O", "shape": [1]}], "layout": "t", "names": None}, b"\0" * 8)),
        bytes(frame({"cols": [{"pickle": 10}], "layout": "t", "names": None}, b"not pickle")),
        bytes(frame({"cols": [{"pickle": 10}], "layout": "t", "names": None}, pickle.dumps([1, 2, 3])[:5])),
        bytes(frame({"cols": ["x"], "layout": "t", "names": None})),
        bytes(frame([1, 2])),  # type: ignore[arg-type]
    ],
    ids=repr,
)
def test_decode_of_garbage_is_a_protocol_error(payload):
    with pytest.raises(ProtocolError):
        decode_batch(memoryview(payload))


def test_object_dtype_header_is_refused_not_unpickled(tmp_path):
    """A numeric column declared with dtype object would read raw pointers; it must be refused."""
    evil = _evil(tmp_path / "pwned")
    with pytest.raises(ProtocolError):
        decode_batch(frame({"cols": [{"dtype": "|O", "shape": [1]}], "layout": "t", "names": None}, evil))
    assert not (tmp_path / "pwned").exists()


# ---- arrow -----------------------------------------------------------------------------------------


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
