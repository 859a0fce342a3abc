"""Pickled row batches read as columns (wire/pickled.py) equal the unpickled rows packed by
``pack_rows``, or are refused (None) so that the row path decides; the feeder's use of them."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest

from tfonspark.errors import InputError
from tfonspark.executor.feedbatches import decoded_batches, row_batches
from tfonspark.wire.packing import pack_rows
from tfonspark.wire.pickled import PickledRows

rng = np.random.default_rng(7)


def floats(n: int) -> list[float]:
    return rng.random(n).tolist()


RECOGNISED = {
    "mnist (list, label)": lambda n: [(floats(784), i % 10) for i in range(n)],
    "(tuple, label)": lambda n: [(tuple(floats(32)), i % 10) for i in range(n)],
    "[list, float]": lambda n: [[floats(5), float(i)] for i in range(n)],
    "bare floats": lambda n: [float(i) for i in range(n)],
    "bare small ints": lambda n: [i % 200 for i in range(n)],
    "3 scalars": lambda n: [(1.5, i % 7, float(i)) for i in range(n)],
    "5 fields, MARK tuple": lambda n: [(1.5, i % 7, 2.5, 3, floats(3)) for i in range(n)],
    "lists over 1000 values": lambda n: [(floats(2500), 1) for _ in range(n)],
    "exactly 1000 values": lambda n: [(floats(1000),) for _ in range(n)],
    "ints 0-255": lambda n: [(list(range(i % 50, i % 50 + 200)), 1) for i in range(n)],
    "ints 256-65535": lambda n: [(list(range(300, 900)), i % 9) for i in range(n)],
    "negative ints": lambda n: [(list(range(-15, -5)), 1) for _ in range(n)],
    "bare list rows": lambda n: [floats(5) for _ in range(n)],
    "nested tuples": lambda n: [((float(i), 2.0), (i % 3 + 1, 4)) for i in range(n)],
    "nan and inf": lambda n: [(float("nan"), float("inf"), -0.0) for _ in range(n)],
}

REFUSED = {
    "floats and ints in one list": [([1.0, 2], 1) for _ in range(3)],
    "ints of two widths in one list": [(list(range(250, 260)), 1) for _ in range(3)],
    "labels of two widths": [([1.0], i) for i in range(250, 260)],
    "None": [([1.0, None], 1) for _ in range(3)],
    "bool": [([1.0, 2.0], True) for _ in range(3)],
    "str": [([1.0, 2.0], "a") for _ in range(3)],
    "ragged": [([1.0, 2.0], 1), ([1.0, 2.0, 3.0], 1)],
    "dicts": [{"a": 1.0} for _ in range(3)],
    "numpy scalars": [np.float64(1.0) for _ in range(3)],
    "numpy rows": [np.arange(3.0) for _ in range(3)],
    "more than 64 columns": [floats(100) for _ in range(3)],
    "nested lists": [([[1.0]], 1) for _ in range(3)],
    "empty lists": [([], 1) for _ in range(3)],
    "ints beyond 32 bits": [(2**40, 1.0) for _ in range(3)],
}


def assert_same(got: Any, rows: list[Any]) -> None:
    want = pack_rows(rows)
    assert got.layout == want.layout
    assert len(got.columns) == len(want.columns)
    for a, b in zip(got.columns, want.columns):
        assert (a.dtype, a.shape) == (b.dtype, b.shape)
        assert np.array_equal(a, b, equal_nan=True)
    assert got.kinds == want.kinds  # next_batch gives lists and tuples back as fed
    if not any(isinstance(v, float) and v != v for r in rows for v in (r if isinstance(r, (list, tuple)) else [r])):
        assert got.rows(as_fed=True) == rows


@pytest.mark.parametrize("n", [1, 1000, 2001])  # the pickler groups a list's items by 1,000
@pytest.mark.parametrize("case", sorted(RECOGNISED))
def test_a_recognised_batch_decodes_to_what_pack_rows_makes(case, n):
    if max(map(len, map(pickle.dumps, RECOGNISED[case](1)))) > 1000 and n > 1:
        n = 30  # large rows: a few suffice
    rows = RECOGNISED[case](n)
    got = PickledRows().decode(pickle.dumps(rows, 5))
    assert got is not None, case
    assert_same(got, rows)


def test_protocol_4_is_read_and_older_protocols_are_refused():
    rows = RECOGNISED["mnist (list, label)"](3)
    assert_same(PickledRows().decode(pickle.dumps(rows, 4)), rows)
    assert PickledRows().decode(pickle.dumps(rows, 3)) is None
    assert PickledRows().decode(pickle.dumps(rows, 2)) is None


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_what_is_not_recognised_is_refused(case):
    assert PickledRows().decode(pickle.dumps(REFUSED[case], 5)) is None


def test_a_shared_object_is_a_memo_reference_and_refused():
    shared = [1.0, 2.0]
    assert PickledRows().decode(pickle.dumps([(shared, 1), (shared, 2)], 5)) is None


def test_the_layout_is_kept_between_batches_and_relearned_when_it_changes():
    decoder = PickledRows()
    for rows in (
        RECOGNISED["mnist (list, label)"](16),
        RECOGNISED["mnist (list, label)"](3),
        RECOGNISED["(tuple, label)"](50),  # another layout: learned anew
        RECOGNISED["mnist (list, label)"](1),
    ):
        assert_same(decoder.decode(pickle.dumps(rows, 5)), rows)


# ---- the feeder over pickled batches --------------------------------------------------------------


def blobs_of(rows: list[Any], per_batch: int) -> list[bytes]:
    return [pickle.dumps(rows[i : i + per_batch], 5) for i in range(0, len(rows), per_batch)]


def joined(batches: Any) -> list[list[np.ndarray]]:
    """Each batch's columns, copied (scratch memory is reused by the next batch)."""
    return [[np.array(c) for c in b.columns] for b in batches]


def test_pickled_batches_deliver_every_row_in_order_in_large_frames():
    rows = RECOGNISED["mnist (list, label)"](1000)
    batches = joined(decoded_batches(3, iter(blobs_of(rows, 16))))
    features = np.concatenate([b[0] for b in batches])
    labels = np.concatenate([b[1] for b in batches])
    assert np.array_equal(features, np.array([r[0] for r in rows]))
    assert labels.tolist() == [r[1] for r in rows]
    assert len(batches) == 2  # ~4 MB frames, not one per 16-row pickle


def test_from_the_first_unrecognised_batch_rows_are_unpickled_and_packed():
    rows = [(floats(4), i % 10) for i in range(256)] + [(floats(4), "x") for _ in range(64)]
    from_pickles = joined(decoded_batches(0, iter(blobs_of(rows, 64))))
    labels = [v for b in from_pickles for v in (b[1].tolist() if isinstance(b[1], np.ndarray) else b[1])]
    assert labels == [r[1] for r in rows]


def test_a_ragged_row_is_named_as_the_row_path_names_it():
    rows = [(floats(4), 1) for _ in range(300)]
    rows[257] = (floats(3), 1)
    with pytest.raises(InputError) as by_rows:
        list(row_batches(5, iter(rows)))
    with pytest.raises(InputError) as by_pickles:
        list(decoded_batches(5, iter(blobs_of(rows, 64))))
    assert "partition=5, row=257" in str(by_pickles.value)
    assert str(by_pickles.value) == str(by_rows.value)


def test_unrecognised_partitions_feed_what_the_row_path_feeds():
    rows = [{"x": i, "y": [i, i]} for i in range(500)]
    want = joined(row_batches(0, iter(rows)))
    got = joined(decoded_batches(0, iter(blobs_of(rows, 100))))
    for a, b in zip(zip(*got), zip(*want), strict=True):
        assert np.array_equal(np.concatenate(a), np.concatenate(b))
