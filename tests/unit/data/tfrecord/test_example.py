"""data/tfrecord/example.py: the Example codec, Arrow rows to Examples and back, and the schema rules."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql import types as T

from tfonspark.data import tfrecord as tr
from tfonspark.data.tfrecord import example as codec
from tfonspark.errors import ConfigError, DataFormatError, InputError


def example(**features: tuple[str, list]) -> bytes:
    """A serialized Example: ``example(x=("int64_list", [1, 2]))``."""
    ex = codec.example_class()()
    for name, (kind, values) in features.items():
        getattr(ex.features.feature[name], kind).SetInParent()
        getattr(ex.features.feature[name], kind).value.extend(values)
    return ex.SerializeToString()


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


def test_load_schema_refuses_unsupported_types():
    with pytest.raises(ConfigError, match="'when'"):
        codec.plan_read(T.StructType([T.StructField("when", T.TimestampType())]))


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
