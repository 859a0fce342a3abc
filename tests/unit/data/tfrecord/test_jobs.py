"""data/tfrecord/jobs.py: the executor tasks that read, write and infer, outside Spark, and their typed errors."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import types as T

from tfonspark.data import tfrecord as tr
from tfonspark.data.tfrecord import example as codec
from tfonspark.data.tfrecord import infer, jobs
from tfonspark.errors import ConfigError, DataFormatError, InputError, TFoSError
from tfonspark.wire import errors as wire_errors


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
