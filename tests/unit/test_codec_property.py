"""Property-based differential test: the C packer and the pure-Python packer agree, and no row
is lost, for row sets of every shape users feed.

Hypothesis draws a partition (one of the row families below, of a size around the feeder's
head, chunk and frame boundaries), then spoils a few rows at positions that change how a chunk
packs (the head's end, the first rows after it, each chunk's start, 1,024 / 4,096 / 65,536, the
last row, anywhere): empty rows, rows of another length or container, odd values (None, str,
bool, numpy scalars, float and int subclasses, ints past int64), arrays of another dtype or
shape, or the whole partition made of empty rows. Every partition goes through the entry
points the feed task uses, with the C packer and with ``packing.native = None``:

- ``row_batches`` (an RDD's rows), counting the rows taken in a ``Tally``;
- ``decoded_batches`` (a stored RDD's pickled batches), for partitions of up to 3,000 rows;
- ``pack_rows`` of the first rows (the head, and every chunk the feeder packs whole).

Both packers must give byte-identical frames, or an exception of the same class, message,
column, partition and row; and where they give frames, the frames hold every row fed, and the
rows counted taken (what ``FeedEnd`` says) are the rows fed.

CI runs ``EXAMPLES`` (400) cases, derandomized (the same cases every run, no example database
written); ``TFOS_PROPERTY_EXAMPLES`` sets another number for a longer local run.
"""

from __future__ import annotations

import os
import pickle
from collections import namedtuple
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tfonspark.executor import feedbatches
from tfonspark.executor.feedbatches import decoded_batches, row_batches
from tfonspark.wire import packing
from tfonspark.wire.codec import encode_batch
from tfonspark.wire.packing import pack_rows

EXAMPLES = int(os.environ.get("TFOS_PROPERTY_EXAMPLES", "400"))
PARTITION = 5

pytestmark = pytest.mark.timeout(600)

Point = namedtuple("Point", "x y")


class OddFloat(float):
    """``float()`` is not the stored value: numpy reads ``float()``."""

    def __float__(self) -> float:
        return 99.0


class PlainFloat(float):
    pass


class OddInt(int):
    def __float__(self) -> float:
        return 99.0

    def __index__(self) -> int:
        return 98


class PlainInt(int):
    pass


class PlainTuple(tuple):  # type: ignore[type-arg]
    """A tuple subclass with tuple's own constructor and no field names."""


# ---- values ------------------------------------------------------------------------------------

_finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
_int64 = st.integers(-(2**63), 2**63 - 1)
ODD_VALUES = st.one_of(
    st.floats(width=64),  # nan, inf, -0.0, subnormals
    _int64,
    st.sampled_from([2**63, 2**64, -(2**63) - 1, 10**400, 2**63 - 1, -(2**63), -1, 0]),
    st.booleans(),
    _finite.map(np.float64),
    st.floats(width=32).map(np.float32),
    _int64.map(np.int64),
    _finite.map(OddFloat),
    _finite.map(PlainFloat),
    st.integers(-1000, 1000).map(OddInt),
    st.integers(-1000, 1000).map(PlainInt),
    st.sampled_from([None, "x", b"y", 1j, [1.0], (), [], {}]),
)


# ---- row families: row i of a partition, every row built like the first -------------------------


def _family(name: str, width: int, n: int) -> list[Any]:
    from pyspark.sql import Row

    w = range(width)
    if name == "floats":
        return [i / 3 for i in range(n)]
    if name == "ints":
        return [i - 7 for i in range(n)]
    if name == "tuple of scalars":
        return [(i / 3, i, *(float(j) for j in w)) for i in range(n)]
    if name == "list of scalars":
        return [[i / 3, *(float(j) for j in w)] for i in range(n)]
    if name == "list features, int label":
        return [([i + j / 7 for j in w], i % 10) for i in range(n)]
    if name == "tuple features, float label":
        return [(tuple(i + j / 7 for j in w), i / 2) for i in range(n)]
    if name == "int features":
        return [([i + j for j in w], i) for i in range(n)]
    if name == "list rows of features":
        return [[[float(i + j) for j in w], i] for i in range(n)]
    if name == "Row":
        return [Row(features=[i + j / 7 for j in w], label=i) for i in range(n)]
    if name == "Row of scalars":
        return [Row(x=i / 3, y=i) for i in range(n)]
    if name == "namedtuple":
        return [Point(i / 3, i) for i in range(n)]
    if name == "tuple subclass":
        return [PlainTuple((i / 3, i)) for i in range(n)]
    if name == "dict":
        return [{"x": [i + j / 7 for j in w], "y": i} for i in range(n)]
    if name == "nested 28x28":
        row = [[j / 28 for j in range(28)] for _ in range(28)]
        return [(row, i) for i in range(n)]
    if name == "nested 2x3":
        return [([[i, 1.0, 2.0], [3.0, 4.0, 5.0]], i) for i in range(n)]
    if name == "array rows":
        return [np.full(width + 1, i, np.float32) for i in range(n)]
    if name == "2-d int16 array rows":
        return [np.full((2, width + 1), i % 30000, np.int16) for i in range(n)]
    if name == "array features":
        return [(np.full(width + 1, i, np.float64), i) for i in range(n)]
    if name == "numpy scalars":
        return [(np.float64(i), np.int64(i)) for i in range(n)]
    if name == "strings":
        return [(f"s{i}", i) for i in range(n)]
    if name == "empty tuples":
        return [()] * n
    if name == "empty lists":
        return [[]] * n
    if name == "empty Rows":
        return [Row()] * n
    if name == "empty dicts":
        return [{}] * n
    raise AssertionError(name)


FAMILIES = [
    "floats",
    "ints",
    "tuple of scalars",
    "list of scalars",
    "list features, int label",
    "tuple features, float label",
    "int features",
    "list rows of features",
    "Row",
    "Row of scalars",
    "namedtuple",
    "tuple subclass",
    "dict",
    "nested 28x28",
    "nested 2x3",
    "array rows",
    "2-d int16 array rows",
    "array features",
    "numpy scalars",
    "strings",
    "empty tuples",
    "empty lists",
    "empty Rows",
    "empty dicts",
]
#: partition sizes around the head (16 rows), chunks (32,768 values), 1,024 / 4,096 / 65,536
SIZES = [1, 2, 15, 16, 17, 18, 40, 100, 300, 1025, 1100, 3000, 4097, 5000, 11000, 12000, 22000, 66000]
#: at most this many Python values in a partition, so that a case costs milliseconds
MAX_VALUES = 250_000


def _spoilt(row: Any, how: int, value: Any) -> Any:
    """``row`` made unlike its family in one of the ways that change how a chunk packs."""
    from pyspark.sql import Row

    if how == 0:
        return [(), [], Row(), {}][int(abs(hash(repr(value)))) % 4]  # an empty row
    if how == 1:
        return value  # the row replaced by a value
    if isinstance(row, np.ndarray):
        return [row.astype(np.int32), row[..., :1], row.tolist(), row[::-1].T][how % 4]
    if isinstance(row, dict):
        return {**row, "y": value} if how % 2 else dict(list(row.items())[:-1])  # a key less
    if isinstance(row, (tuple, list)) and row:
        fields = list(row)
        if how == 2:
            fields.append(value)  # another length
        elif how == 3:
            fields[-1] = value  # the label (or last scalar)
        elif how == 4 and isinstance(fields[0], (list, tuple)) and fields[0]:
            inner = list(fields[0])
            inner[len(inner) // 2] = value  # a feature
            fields[0] = tuple(inner) if isinstance(fields[0], tuple) else inner
        elif how == 5 and isinstance(fields[0], (list, tuple)):
            fields[0] = tuple(fields[0]) if isinstance(fields[0], list) else list(fields[0])  # container
        elif how == 5 and isinstance(fields[0], np.ndarray):
            fields[0] = fields[0].astype(np.float32)
        else:
            fields[0] = value
        if isinstance(row, Row) and hasattr(row, "__fields__"):
            names = list(row.__fields__)
            if len(fields) == len(names):
                return Row(**dict(zip(names, fields)))
            return tuple(fields)
        if isinstance(row, Point) and len(fields) == 2:
            return Point(*fields)
        return type(row)(fields) if type(row) in (list, tuple, PlainTuple) else tuple(fields)
    return value


@st.composite
def partitions(draw: Any) -> list[Any]:
    name = draw(st.sampled_from(FAMILIES))
    width = draw(st.sampled_from([1, 2, 3, 8, 32, 100, 784]))
    probe = _family(name, width, 1)[0]
    values = max(feedbatches._python_values(probe), 1)
    n = min(draw(st.sampled_from(SIZES)), max(MAX_VALUES // values, 1))
    rows = _family(name, width, n)
    event(f"family: {name}")
    size = max(1, 32768 // values)  # the feeder's chunk, for rows this small (4 MB frames are bigger)
    at = [0, 1, 15, 16, 17, n - 1, 1023, 1024, 1025, 4095, 4096, 4097, 65535, 65536, 65537]
    at += [16 + k * size + d for k in range(1, 4) for d in (-1, 0, 1)]
    spots = [p for p in at if 0 <= p < n]
    for _ in range(draw(st.sampled_from([0, 1, 1, 2, 3]))):
        p = draw(st.one_of(st.sampled_from(spots), st.integers(0, n - 1)))
        rows[p] = _spoilt(rows[p], draw(st.integers(0, 6)), draw(ODD_VALUES))
    return rows


# ---- outcomes ----------------------------------------------------------------------------------


def _frame_bytes(batch: Any) -> bytes:
    return b"".join(bytes(memoryview(p).cast("B")) for p in encode_batch(batch))


def _outcome(make: Any) -> tuple[Any, ...]:
    """("frames", frame bytes, rows in them, rows counted taken) or ("error", class, message, where)."""
    tally = feedbatches.Tally()
    try:
        frames, count = [], 0
        for batch in make(tally):
            frames.append(_frame_bytes(batch))  # a copy, before the next batch reuses its memory
            count += batch.count
        return ("frames", frames, count, tally.rows)
    except Exception as exc:  # any exception: both packers must raise the same one
        where = tuple(getattr(exc, k, None) for k in ("column", "partition", "row"))
        return ("error", type(exc), str(exc), where)


def _fast_and_slow(make: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    real = packing.native
    fast = _outcome(make) if real is not None else None
    packing.native = None
    try:
        slow = _outcome(make)
    finally:
        packing.native = real
    return (fast if fast is not None else slow), slow


def _summary(outcome: tuple[Any, ...]) -> tuple[Any, ...]:
    return outcome if outcome[0] == "error" else ("frames", len(outcome[1]), *outcome[2:])


def _check(make: Any, n: int, tallied: bool = True) -> None:
    """Both packers agree; frames hold every row fed and (``tallied``) count them all taken."""
    fast, slow = _fast_and_slow(make)
    assert fast == slow, (_summary(fast), _summary(slow))
    event(f"outcome: {'frames' if fast[0] == 'frames' else fast[1].__name__}")
    if fast[0] == "frames":
        _, _, count, taken = fast
        assert count == n, f"{n} rows fed, {count} in the frames"
        assert taken == n or not tallied, f"{n} rows fed, {taken} counted taken"


@settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
@given(partitions())
def test_both_packers_give_the_same_frames_or_error_and_lose_no_row(rows):
    n = len(rows)
    _check(lambda tally: row_batches(PARTITION, iter(rows), 0, tally), n)
    head = rows[:300]
    _check(lambda tally: [pack_rows(head, PARTITION, 100)], len(head), tallied=False)
    if n <= 3000:
        try:
            blobs = [pickle.dumps(rows[i : i + 100], 5) for i in range(0, n, 100)]
        except (pickle.PicklingError, TypeError, AttributeError):
            return
        _check(lambda tally: decoded_batches(PARTITION, iter(blobs), tally), n)
