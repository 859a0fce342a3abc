"""executor/feedbatches.py: how a feed task cuts a partition's rows into packed frames."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from tfonspark.errors import InputError
from tfonspark.executor.feedbatches import row_batches
from tfonspark.wire import packing
from tfonspark.wire.packing import pack_rows

W784 = [i / 7 for i in range(784)]


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
