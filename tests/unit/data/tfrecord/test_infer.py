"""data/tfrecord/infer.py: a schema inferred from the records, past the first one, and its refusals."""

from __future__ import annotations

import pytest
from pyspark.sql import types as T

from tfonspark.data import tfrecord as tr
from tfonspark.data.tfrecord import example as codec
from tfonspark.errors import ConfigError, DataFormatError


def example(**features: tuple[str, list]) -> bytes:
    """A serialized Example: ``example(x=("int64_list", [1, 2]))``."""
    ex = codec.example_class()()
    for name, (kind, values) in features.items():
        getattr(ex.features.feature[name], kind).SetInParent()
        getattr(ex.features.feature[name], kind).value.extend(values)
    return ex.SerializeToString()


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


def test_a_record_that_is_not_an_example(tmp_path):
    path = tmp_path / "junk"
    tr.write_tfrecord_file(str(path), [example(), b"\xff\xff\xff"])
    with pytest.raises(DataFormatError, match="not a serialized tf.train.Example") as info:
        tr.infer_schema(tr.read_tfrecord_file(str(path)))
    assert info.value.path == "record 1"
