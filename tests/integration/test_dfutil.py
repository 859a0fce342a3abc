"""DataFrame -> TFRecords -> DataFrame on a real ``local-cluster[2,1,1024]`` (two executor JVMs)."""

from __future__ import annotations

import os

import pytest
from pyspark.sql import types as T

from tfonspark import dfutil
from tfonspark.data import tfrecord as tr
from tfonspark.data.tfrecord.example import example_class
from tfonspark.errors import ConfigError, DataFormatError, InputError

SCHEMA = T.StructType(
    [
        T.StructField("id", T.LongType()),
        T.StructField("label", T.IntegerType()),
        T.StructField("flag", T.BooleanType()),
        T.StructField("score", T.DoubleType()),
        T.StructField("weight", T.FloatType()),
        T.StructField("name", T.StringType()),
        T.StructField("blob", T.BinaryType()),
        T.StructField("ids", T.ArrayType(T.LongType())),
        T.StructField("vec", T.ArrayType(T.FloatType())),
        T.StructField("tags", T.ArrayType(T.StringType())),
    ]
)
# Doubles are stored as float32 in an Example, so scores are exactly representable ones.
# Row 0 has one-element arrays: inference must look at later rows to see they are arrays.
ROWS = [
    (0, 1, True, 0.5, 1.25, "zero", bytearray(b"\x00\xff"), [7], [0.5], ["a"]),
    (1, None, None, None, None, None, None, None, None, None),
    (2, -3, False, -2.75, -0.5, "dös", bytearray(b""), [1, 2, 3], [], ["b", "", "ç"]),
    (3, 2**31 - 1, True, 1e10, 3.0, "", bytearray(b"\x80"), [], [1.0, 2.0], []),
    (4, 0, False, 0.0, 0.0, "four", bytearray(b"4"), [-(2**63), 2**63 - 1], None, None),
]


@pytest.fixture
def df(spark, sc):
    return spark.createDataFrame(sc.parallelize(ROWS, 2), SCHEMA)


def by_id(frame) -> list:
    return sorted(frame.collect(), key=lambda row: row["id"])


def as_inferred(row: tuple) -> dict:
    """A source row as the inferred schema returns it: booleans become 0/1 bigints."""
    values = dict(zip(SCHEMA.names, row, strict=True))
    if values["flag"] is not None:
        values["flag"] = int(values["flag"])
    return values


def test_round_trip_with_inferred_schema(sc, df, tmp_path):
    out = str(tmp_path / "tfr")
    files = dfutil.saveAsTFRecords(df, out)
    assert files == [f"{out}/part-r-00000", f"{out}/part-r-00001"]
    assert sorted(os.listdir(out)) == ["_SUCCESS", "part-r-00000", "part-r-00001"]

    loaded = dfutil.loadTFRecords(sc, out, binary_features=["blob"])
    assert loaded.schema.simpleString() == (
        "struct<blob:binary,flag:bigint,id:bigint,ids:array<bigint>,label:bigint,name:string,"
        "score:double,tags:array<string>,vec:array<double>,weight:double>"
    )
    assert [row.asDict() for row in by_id(loaded)] == [as_inferred(row) for row in ROWS]
    assert loaded.rdd.getNumPartitions() == 2  # one task per file

    assert dfutil.isLoadedDF(loaded) and dfutil.loadedDF[loaded] == out
    assert not dfutil.isLoadedDF(df) and not dfutil.isLoadedDF(loaded.select("id"))


def test_round_trip_with_explicit_schema_and_file_uri(spark, df, tmp_path):
    out = (tmp_path / "by uri").as_uri()
    tr.save_tfrecords(df.repartition(3), out)
    loaded = tr.load_tfrecords(spark, out, schema=SCHEMA)
    assert loaded.schema == SCHEMA
    assert by_id(loaded) == by_id(df)  # identical, nulls and arrays included

    with pytest.raises(ConfigError, match="not empty"):
        tr.save_tfrecords(df, out)
    files = tr.save_tfrecords(df.limit(1).coalesce(1), out, overwrite=True)
    assert files == [f"{out}/part-r-00000"]
    assert tr.load_tfrecords(spark, out, schema=SCHEMA).count() == 1


def test_bad_input_fails_on_the_driver_with_our_errors(sc, spark, tmp_path):
    records = []
    for k in range(3):
        example = example_class()()
        example.features.feature["k"].int64_list.value.append(k)
        records.append(example.SerializeToString())
    good = str(tmp_path / "good")
    tr.write_tfrecord_file(good + "/part-r-00000", records)
    bad = tmp_path / "good" / "part-r-00001"
    tr.write_tfrecord_file(str(bad), records)
    raw = bytearray(bad.read_bytes())
    raw[16 + len(records[0]) + 12 + 1] ^= 1  # a data byte of the second record
    bad.write_bytes(bytes(raw))
    with pytest.raises(DataFormatError, match="CRC mismatch") as info:
        dfutil.loadTFRecords(sc, good)
    assert info.value.path == str(bad)
    assert info.value.offset == 16 + len(records[0])

    nulls = spark.createDataFrame([(1, [1, None])], "id long, v array<long>").coalesce(1)
    with pytest.raises(InputError, match="null element") as err:
        dfutil.saveAsTFRecords(nulls, str(tmp_path / "nulls"))
    assert (err.value.column, err.value.row) == ("v", 0)
    assert os.listdir(tmp_path / "nulls") == []  # nothing half-written is left behind
