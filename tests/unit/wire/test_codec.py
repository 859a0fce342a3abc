"""wire/codec.py: the batch frame codec, ``ColumnBatch`` to frame parts and back, and its refusals."""

from __future__ import annotations

import json
import os
import pickle
import shlex
import struct

import numpy as np
import pytest

from tfonspark.errors import ProtocolError
from tfonspark.wire.codec import ColumnBatch, decode_batch, encode_batch
from tfonspark.wire.packing import pack_rows


def round_trip(batch: ColumnBatch) -> ColumnBatch:
    """Encode to frame parts, join them as the wire would, decode the received frame."""
    parts = encode_batch(batch)
    payload = bytearray(b"".join(bytes(memoryview(p).cast("B")) if not isinstance(p, bytes) else p for p in parts))
    return decode_batch(memoryview(payload))


def frame(header: dict, *buffers: bytes) -> memoryview:
    h = json.dumps(header).encode()
    return memoryview(b"B" + struct.pack(">I", len(h)) + h + b"".join(buffers))


# ---- pack_rows ------------------------------------------------------------------------------------


# ---- Scratch: large array columns packed into reused memory -----------------------------------------


# ---- columns of list/tuple features (TFoS rows: ``(vec[1:], vec[0])``, ``x.tolist()``) ------------


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
