"""TFRecord framing, CRC-32C, the Example codec and the schema rules, without a Spark JVM."""

from __future__ import annotations

import os
import random
import struct
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import types as T

import tfonspark.data as data_pkg
from tfonspark import dfutil
from tfonspark.data import tfrecord as tr
from tfonspark.data.tfrecord import crc, infer, jobs
from tfonspark.data.tfrecord import example as codec
from tfonspark.errors import ConfigError, DataFormatError, InputError, TFoSError
from tfonspark.wire import errors as wire_errors

# --------------------------------------------------------------------------------------------
# helpers


def example(**features: tuple[str, list]) -> bytes:
    """A serialized Example: ``example(x=("int64_list", [1, 2]))``."""
    ex = codec.example_class()()
    for name, (kind, values) in features.items():
        getattr(ex.features.feature[name], kind).SetInParent()
        getattr(ex.features.feature[name], kind).value.extend(values)
    return ex.SerializeToString()


def records_file(path: Path, sizes: list[int]) -> list[int]:
    """Write records of the given sizes; return each record's byte offset."""
    tr.write_tfrecord_file(str(path), [bytes([i % 251]) * n for i, n in enumerate(sizes)])
    offsets, at = [], 0
    for n in sizes:
        offsets.append(at)
        at += 16 + n
    return offsets


def flip(path: Path, position: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[position] ^= 0x40
    path.write_bytes(bytes(raw))


SCHEMA = T.StructType(
    [
        T.StructField("i", T.LongType()),
        T.StructField("small", T.IntegerType()),
        T.StructField("flag", T.BooleanType()),
        T.StructField("d", T.DoubleType()),
        T.StructField("f", T.FloatType()),
        T.StructField("s", T.StringType()),
        T.StructField("b", T.BinaryType()),
        T.StructField("ai", T.ArrayType(T.LongType())),
        T.StructField("af", T.ArrayType(T.FloatType())),
        T.StructField("as_", T.ArrayType(T.StringType())),
        T.StructField("ab", T.ArrayType(T.BinaryType())),
    ]
)
ARROW = pa.schema(
    [
        ("i", pa.int64()),
        ("small", pa.int32()),
        ("flag", pa.bool_()),
        ("d", pa.float64()),
        ("f", pa.float32()),
        ("s", pa.string()),
        ("b", pa.binary()),
        ("ai", pa.list_(pa.int64())),
        ("af", pa.list_(pa.float32())),
        ("as_", pa.list_(pa.string())),
        ("ab", pa.list_(pa.binary())),
    ]
)
ROWS = [
    dict(
        i=1, small=7, flag=True, d=1.5, f=0.25, s="héllo", b=b"\xff\x00", ai=[5], af=[0.5], as_=["a"], ab=[b"\x80"]
    ),  # not UTF-8: inferred binary
    {name: None for name in ARROW.names},
    dict(
        i=-(2**63),
        small=-1,
        flag=False,
        d=-2.25,
        f=3.0,
        s="",
        b=b"",
        ai=[1, -2, 2**62],
        af=[],
        as_=["x", "ÿ", ""],
        ab=[],
    ),
]


# --------------------------------------------------------------------------------------------
# CRC-32C


def test_crc32c_matches_published_vectors():
    assert tr.crc32c(b"") == 0
    assert tr.crc32c(b"123456789") == 0xE3069283
    assert tr.crc32c(bytes(32)) == 0x8A9136AA  # RFC 3720 B.4
    assert tr.crc32c(b"\xff" * 32) == 0x62A8AB43
    assert tr.masked_crc32c(b"") == 0xA282EAD8
    crc = 0xE3069283
    assert tr.masked_crc32c(b"123456789") == (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


@pytest.mark.parametrize("size", [0, 1, 3, 4, 5, 1000, 70_001])
def test_fallback_crc32c_equals_primary(size):
    data = random.Random(size).randbytes(size)
    expected = tr.crc32c(data)
    assert crc._crc32c_table(data) == expected
    assert crc._crc32c_numpy(data, lane=64) == expected  # many lanes: exercises every fold level


def test_fallback_switches_to_numpy_for_big_buffers(monkeypatch):
    data = random.Random(1).randbytes(crc._NUMPY_MIN_BYTES + 3)
    monkeypatch.setattr(crc, "_crc32c_table", lambda _: pytest.fail("table used for a big buffer"))
    assert crc._crc32c_fallback(data) == tr.crc32c(data)


# --------------------------------------------------------------------------------------------
# framing


def test_framing_layout_and_round_trip(tmp_path):
    path = tmp_path / "f.tfrecord"
    payloads = [b"", b"x", os.urandom(70_000), b"last"]
    assert tr.write_tfrecord_file(str(path), payloads) == 4
    raw = path.read_bytes()
    assert len(raw) == sum(16 + len(p) for p in payloads)
    # second record starts after the empty first one: length, masked crc of length, data, crc
    second = raw[16:]
    assert struct.unpack("<Q", second[:8])[0] == 1
    assert struct.unpack("<I", second[8:12])[0] == tr.masked_crc32c(second[:8])
    assert second[12:13] == b"x"
    assert struct.unpack("<I", second[13:17])[0] == tr.masked_crc32c(b"x")
    assert list(tr.read_tfrecord_file(str(path))) == payloads
    assert list(tr.read_tfrecord_file(path.as_uri())) == payloads  # file:// URI


@pytest.mark.parametrize(
    ("where", "message"),
    [
        (lambda o: o[2] + 12 + 3, "corrupt TFRecord data"),  # a data byte of record 2
        (lambda o: o[2] + 1, "corrupt TFRecord length"),  # its length field
        (lambda o: o[2] + 13 + 10, "corrupt TFRecord data"),  # its data CRC
    ],
)
def test_flipped_byte_names_file_and_record_offset(tmp_path, where, message):
    path = tmp_path / "bad"
    offsets = records_file(path, [10, 20, 10, 5])
    flip(path, where(offsets))
    reader = tr.read_tfrecord_file(str(path))
    assert len(next(reader)) == 10 and len(next(reader)) == 20  # good records still come first
    with pytest.raises(DataFormatError, match=message) as info:
        next(reader)
    assert info.value.path == str(path)
    assert info.value.offset == offsets[2] == 62
    assert f"{path} at byte 62" in str(info.value)
    clone = wire_errors.decode(wire_errors.encode(info.value))  # how it travels from executors
    assert isinstance(clone, DataFormatError)
    assert (clone.path, clone.offset, str(clone)) == (str(path), 62, str(info.value))


@pytest.mark.parametrize(
    ("cut", "message"),
    [(7, "truncated TFRecord header"), (12 + 4, "truncated TFRecord"), (12 + 10 + 2, "truncated TFRecord")],
)
def test_truncated_record_names_its_offset(tmp_path, cut, message):
    path = tmp_path / "short"
    offsets = records_file(path, [10, 10, 10])
    path.write_bytes(path.read_bytes()[: offsets[2] + cut])
    with pytest.raises(DataFormatError, match=message) as info:
        list(tr.read_tfrecord_file(str(path)))
    assert info.value.offset == offsets[2]


def test_a_text_file_is_not_a_tfrecord_file(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("hello, this is not a TFRecord file\n")
    with pytest.raises(DataFormatError, match="not a TFRecord file") as info:
        list(tr.read_tfrecord_file(str(path)))
    assert info.value.offset == 0


# --------------------------------------------------------------------------------------------
# Example codec


def test_arrow_rows_round_trip_through_examples(tmp_path):
    batch = pa.RecordBatch.from_pylist(ROWS, schema=ARROW)
    path = tmp_path / "rows"
    tr.write_tfrecord_file(str(path), codec.encode_batch(batch, codec.plan_write(SCHEMA)))
    # explicit schema: identical values and Arrow types
    back = list(codec.read_file_batches(str(path), codec.plan_read(SCHEMA)))
    assert len(back) == 1
    assert back[0].schema.types == ARROW.types
    assert back[0].to_pylist() == ROWS
    # inferred schema: ints widen to bigint, floats to double, one-value arrays become scalars
    inferred = tr.infer_schema(tr.read_tfrecord_file(str(path)))
    assert inferred.simpleString() == (
        "struct<ab:array<binary>,af:array<double>,ai:array<bigint>,as_:array<string>,b:binary,"
        "d:double,f:double,flag:bigint,i:bigint,s:string,small:bigint>"
    )
    rows = next(codec.read_file_batches(str(path), codec.plan_read(inferred))).to_pylist()
    assert [r["ai"] for r in rows] == [[5], None, [1, -2, 2**62]]
    assert [r["flag"] for r in rows] == [1, None, 0]
    assert [r["b"] for r in rows] == [b"\xff\x00", None, b""]


def test_small_batches_split_by_rows(tmp_path):
    path = tmp_path / "many"
    tr.write_tfrecord_file(str(path), [example(n=("int64_list", [k])) for k in range(10)])
    plan = codec.plan_read(T.StructType([T.StructField("n", T.LongType())]))
    batches = list(codec.read_file_batches(str(path), plan, max_rows=4))
    assert [b.num_rows for b in batches] == [4, 4, 2]
    assert sum((b.column(0).to_pylist() for b in batches), []) == list(range(10))


def test_write_refuses_types_an_example_cannot_hold():
    for dtype in (
        T.DateType(),
        T.DecimalType(10, 2),
        T.ArrayType(T.ArrayType(T.LongType())),
        T.MapType(T.StringType(), T.LongType()),
    ):
        with pytest.raises(InputError, match="cannot be stored") as info:
            codec.plan_write(T.StructType([T.StructField("ok", T.LongType()), T.StructField("bad", dtype)]))
        assert info.value.column == "bad"


def test_write_refuses_null_elements_and_names_the_row():
    schema = T.StructType([T.StructField("v", T.ArrayType(T.LongType()))])
    batch = pa.RecordBatch.from_pylist(
        [{"v": [1]}, {"v": None}, {"v": [2, None]}], schema=pa.schema([("v", pa.list_(pa.int64()))])
    )
    with pytest.raises(InputError, match="null element") as info:
        codec.encode_batch(batch, codec.plan_write(schema), partition=3, first_row=100)
    assert (info.value.column, info.value.partition, info.value.row) == ("v", 3, 102)


# --------------------------------------------------------------------------------------------
# schema inference


def test_inference_looks_past_the_first_record():
    records = [
        example(
            x=("int64_list", [1]),
            y=("float_list", [0.5]),
            z=("int64_list", [1]),
            s=("bytes_list", [b"a"]),
            u=("bytes_list", [b"ok"]),
        ),
        example(
            x=("int64_list", [1, 2, 3]),
            z=("float_list", [2.5]),
            s=("bytes_list", [b"b"]),
            u=("bytes_list", [b"\xff\xfe"]),
            e=("int64_list", []),
        ),
        example(),
    ]
    schema = tr.infer_schema(records)
    assert schema.simpleString() == ("struct<e:array<bigint>,s:string,u:binary,x:array<bigint>,y:double,z:double>")
    assert all(f.nullable for f in schema.fields)
    assert tr.infer_schema(records, binary_features=["s"])["s"].dataType == T.BinaryType()
    assert tr.infer_schema(records, binary_features="s")["s"].dataType == T.BinaryType()


def test_int64_and_float_mix_into_double_even_beyond_2_to_53(tmp_path):
    path = tmp_path / "mix"
    tr.write_tfrecord_file(str(path), [example(m=("float_list", [0.5])), example(m=("int64_list", [2**53 + 1]))])
    schema = tr.infer_schema(tr.read_tfrecord_file(str(path)))
    assert schema.simpleString() == "struct<m:double>"
    rows = next(codec.read_file_batches(str(path), codec.plan_read(schema))).to_pylist()
    assert rows == [{"m": 0.5}, {"m": float(2**53)}]


def test_inference_refuses_bytes_mixed_with_numbers():
    records = [example(m=("bytes_list", [b"a"])), example(m=("int64_list", [1]))]
    with pytest.raises(DataFormatError, match="bytes_list in some records"):
        tr.infer_schema(records)
    with pytest.raises(ConfigError, match="binary_features names 'n'"):
        tr.infer_schema([example(n=("int64_list", [1]))], binary_features=["n"])


def test_inference_of_kindless_empty_features():
    ex = codec.example_class()()
    ex.features.feature["blank"].SetInParent()  # a Feature with no list set at all
    schema = tr.infer_schema([ex.SerializeToString()])
    assert schema["blank"].dataType == T.ArrayType(T.StringType())


def test_reading_data_that_does_not_fit_the_schema_names_the_record(tmp_path):
    path = tmp_path / "mixed"
    good = example(v=("int64_list", [1]), t=("bytes_list", [b"fine"]))
    records = [
        good,
        good,
        example(v=("int64_list", [1, 2, 3])),
        example(t=("bytes_list", [b"\xc3\x28"])),
        example(v=("float_list", [1.5])),
    ]
    tr.write_tfrecord_file(str(path), records)
    offsets = [sum(16 + len(r) for r in records[:k]) for k in range(len(records))]

    def fails(field: T.StructField, message: str) -> int | None:
        plan = codec.plan_read(T.StructType([field]))
        with pytest.raises(DataFormatError, match=message) as info:
            list(codec.read_file_batches(str(path), plan))
        assert info.value.path == str(path)
        return info.value.offset

    assert fails(T.StructField("v", T.LongType()), "holds 3 values") == offsets[2]
    assert fails(T.StructField("t", T.StringType()), "binary_features") == offsets[3]
    assert fails(T.StructField("v", T.ArrayType(T.LongType())), "is a float_list") == offsets[4]

    records = [example(v=("int64_list", [1])), example(v=("int64_list", [300]))]
    tr.write_tfrecord_file(str(path), records)  # 300 does not fit a tinyint
    assert fails(T.StructField("v", T.ByteType()), "does not fit") == 16 + len(records[0])


def test_executor_inference_reads_only_infer_records_and_returns_errors(tmp_path):
    path = tmp_path / "two"
    tr.write_tfrecord_file(str(path), [example(x=("int64_list", [1])), example(x=("int64_list", [1, 2, 3]))])

    def schema(limit):
        [stats] = jobs._infer_task([str(path)], binary=frozenset(), limit=limit)
        return infer.schema_from_stats(stats, frozenset()).simpleString()

    assert schema(1) == "struct<x:bigint>"
    assert schema(None) == "struct<x:array<bigint>>"
    flip(path, 5)
    [text] = jobs._infer_task([str(path)], binary=frozenset(), limit=None)  # returned, not raised
    with pytest.raises(DataFormatError) as info:
        wire_errors.reraise(text)
    assert (info.value.path, info.value.offset) == (str(path), 0)


def test_executor_write_task_outside_spark(tmp_path):
    schema = T.StructType([T.StructField("v", T.ArrayType(T.LongType()))])
    arrow = pa.schema([("v", pa.list_(pa.int64()))])
    plan = codec.plan_write(schema)
    batches = [pa.RecordBatch.from_pylist([{"v": [1, 2]}, {"v": []}], schema=arrow)] * 2
    [result] = jobs._write_task(iter(batches), uri=str(tmp_path), job="j1", plan=plan)
    assert result.to_pylist() == [{"partition": 0, "records": 4, "name": "part-r-00000", "error": None}]
    assert os.listdir(tmp_path / "_temporary" / "j1") == ["part-r-00000"]  # no attempt files
    back = list(tr.read_tfrecord_file(str(tmp_path / "_temporary" / "j1" / "part-r-00000")))
    assert back == codec.encode_batch(batches[0], plan) * 2

    bad = [pa.RecordBatch.from_pylist([{"v": [1]}, {"v": [None]}], schema=arrow)]
    [result] = jobs._write_task(iter(bad), uri=str(tmp_path), job="j2", plan=plan)
    error = wire_errors.decode(result.column("error")[0].as_py())
    assert isinstance(error, InputError) and (error.column, error.row) == ("v", 1)
    assert os.listdir(tmp_path / "_temporary" / "j2") == []


def test_executor_read_task_errors_reach_the_driver_typed(tmp_path):
    path = tmp_path / "bad"
    records_file(path, [10, 10])
    flip(path, 16 + 10 + 12 + 1)  # a data byte of the second record
    schema = T.StructType([T.StructField("x", T.LongType())])
    indexes = pa.RecordBatch.from_pydict({"id": [0]})
    with pytest.raises(wire_errors.CapturedError) as info:
        list(jobs._read_task(iter([indexes]), files=(str(path),), schema=schema))
    with pytest.raises(DataFormatError, match="CRC mismatch") as typed:
        wire_errors.reraise(RuntimeError(f"Traceback (most recent call last): ...\n{info.value}"))
    assert typed.value.offset == 26


def test_failed_spark_actions_raise_the_typed_error_or_a_summary():
    marker = wire_errors.encode(InputError("null element", column="v", row=1))

    def fail(text: str) -> None:
        raise RuntimeError(text)

    with pytest.raises(InputError) as info:
        jobs._run("saving", lambda: fail(f"Traceback ...\nCapturedError: InputError: null element {marker}"))
    assert (info.value.column, info.value.row) == ("v", 1)
    with pytest.raises(TFoSError, match="saving TFRecords to 'd' failed on an executor: OSError: disk full"):
        jobs._run("saving TFRecords to 'd'", lambda: fail("Traceback ...\n  File x\nOSError: disk full\n\tat java"))
    with pytest.raises(InputError):
        jobs._raise_returned(marker)
    with pytest.raises(TFoSError, match="could not be decoded"):
        jobs._raise_returned("garbage")


def test_no_pickle_in_the_data_package():
    root = Path(data_pkg.__file__).parent
    for source in root.rglob("*.py"):
        assert "pickle" not in source.read_text(), source


def test_load_schema_refuses_unsupported_types():
    with pytest.raises(ConfigError, match="'when'"):
        codec.plan_read(T.StructType([T.StructField("when", T.TimestampType())]))


def test_a_record_that_is_not_an_example(tmp_path):
    path = tmp_path / "junk"
    tr.write_tfrecord_file(str(path), [example(), b"\xff\xff\xff"])
    with pytest.raises(DataFormatError, match="not a serialized tf.train.Example") as info:
        tr.infer_schema(tr.read_tfrecord_file(str(path)))
    assert info.value.path == "record 1"


# --------------------------------------------------------------------------------------------
# input listing


def test_listing_skips_markers_hidden_files_and_directories(tmp_path):
    for name in ("part-r-00001", "part-r-00000", "_SUCCESS", ".part-r-00002.crc", "other"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "sub").mkdir()
    root = str(tmp_path)
    assert jobs.list_record_files(root) == [f"{root}/other", f"{root}/part-r-00000", f"{root}/part-r-00001"]
    assert jobs.list_record_files(f"{root}/part-*") == [f"{root}/part-r-00000", f"{root}/part-r-00001"]
    assert jobs.list_record_files(f"{root}/other") == [f"{root}/other"]
    with pytest.raises(ConfigError, match="does not exist"):
        jobs.list_record_files(f"{root}/missing")
    with pytest.raises(ConfigError, match="no TFRecord files"):
        jobs.list_record_files(str(tmp_path / "sub"))


# --------------------------------------------------------------------------------------------
# public surface


def test_exported_members():
    for module in (tr, data_pkg, dfutil):
        assert module.__all__ == sorted(module.__all__)
        for name in module.__all__:
            assert hasattr(module, name), f"{module.__name__}.{name}"
    assert set(dfutil.__all__) == {"isLoadedDF", "loadTFRecords", "loadedDF", "saveAsTFRecords"}
    assert dfutil.loadedDF is tr.loaded_dfs
    assert not dfutil.isLoadedDF(object()) and not dfutil.isLoadedDF([])


# --------------------------------------------------------------------------------------------
# interoperability with TensorFlow itself


@pytest.fixture(scope="module")
def tf():
    return pytest.importorskip("tensorflow")


def test_tensorflow_reads_our_files(tf, tmp_path):
    path = tmp_path / "ours"
    batch = pa.RecordBatch.from_pylist(ROWS, schema=ARROW)
    tr.write_tfrecord_file(str(path), codec.encode_batch(batch, codec.plan_write(SCHEMA)))
    spec = {
        "i": tf.io.FixedLenFeature([], tf.int64, default_value=0),
        "d": tf.io.FixedLenFeature([], tf.float32, default_value=0.0),
        "s": tf.io.FixedLenFeature([], tf.string, default_value=""),
        "ai": tf.io.VarLenFeature(tf.int64),
        "as_": tf.io.VarLenFeature(tf.string),
    }
    parsed = [tf.io.parse_single_example(r, spec) for r in tf.data.TFRecordDataset(str(path))]
    assert [int(p["i"]) for p in parsed] == [1, 0, -(2**63)]
    assert [float(p["d"]) for p in parsed] == [1.5, 0.0, -2.25]
    assert [p["s"].numpy().decode() for p in parsed] == ["héllo", "", ""]
    assert [p["ai"].values.numpy().tolist() for p in parsed] == [[5], [], [1, -2, 2**62]]
    assert [v.decode() for v in parsed[2]["as_"].values.numpy()] == ["x", "ÿ", ""]


def test_we_read_tensorflow_files(tf, tmp_path):
    path = tmp_path / "theirs"
    feature = tf.train.Feature
    with tf.io.TFRecordWriter(str(path)) as writer:
        for k in range(3):
            feats = {
                "label": feature(int64_list=tf.train.Int64List(value=[k])),
                "vec": feature(float_list=tf.train.FloatList(value=[0.5] * (1 if k == 0 else 3))),
                "name": feature(bytes_list=tf.train.BytesList(value=[f"n{k}".encode()])),
            }
            if k != 1:
                feats["img"] = feature(bytes_list=tf.train.BytesList(value=[bytes([k, 255])]))
            writer.write(tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString())
    schema = tr.infer_schema(tr.read_tfrecord_file(str(path)))
    assert schema.simpleString() == "struct<img:binary,label:bigint,name:string,vec:array<double>>"
    rows = next(codec.read_file_batches(str(path), codec.plan_read(schema))).to_pylist()
    assert rows == [
        {"img": b"\x00\xff", "label": 0, "name": "n0", "vec": [0.5]},
        {"img": None, "label": 1, "name": "n1", "vec": [0.5, 0.5, 0.5]},
        {"img": b"\x02\xff", "label": 2, "name": "n2", "vec": [0.5, 0.5, 0.5]},
    ]
