"""data/tfrecord/crc.py: CRC-32C against published vectors, and its fallbacks equal to the primary."""

from __future__ import annotations

import random

import pytest

from tfonspark.data import tfrecord as tr
from tfonspark.data.tfrecord import crc


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
