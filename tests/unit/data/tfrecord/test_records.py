"""data/tfrecord/records.py: TFRecord framing written and read back, and the offsets its errors name,
without a Spark JVM."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from tfonspark.data import tfrecord as tr
from tfonspark.errors import DataFormatError
from tfonspark.wire import errors as wire_errors

# --------------------------------------------------------------------------------------------
# helpers


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


# --------------------------------------------------------------------------------------------
# CRC-32C


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


# --------------------------------------------------------------------------------------------
# schema inference


# --------------------------------------------------------------------------------------------
# input listing


# --------------------------------------------------------------------------------------------
# public surface


# --------------------------------------------------------------------------------------------
# interoperability with TensorFlow itself
