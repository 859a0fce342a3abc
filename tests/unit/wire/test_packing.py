"""The optional C packer (``wire/_pack.c``) changes nothing but speed.

Every case is packed twice, with the C packer and with ``packing.native = None`` (the pure-Python
packer, as where no C compiler built it): the frames must be byte-identical, and the errors of
the same type with the same message, column, partition and row.
"""

from __future__ import annotations

import itertools
import random
import shutil
import sys
from collections import namedtuple
from typing import Any

import numpy as np
import pytest

from tfonspark.errors import InputError
from tfonspark.wire import packing
from tfonspark.wire.codec import ColumnBatch, encode_batch
from tfonspark.wire.packing import Scratch, pack_rows

needs_native = pytest.mark.skipif(packing.native is None, reason="the C packer was not built here")
Point = namedtuple("Point", "x y")


def _frames(batches: Any) -> list[bytes]:
    return [b"".join(bytes(memoryview(p).cast("B")) for p in encode_batch(batch)) for batch in batches]


def _outcome(make: Any) -> tuple[Any, ...]:
    """What ``make()`` gives: its batches as frame bytes, or its error and where it points."""
    try:
        return ("frames", _frames(make()))
    except (InputError, ValueError, TypeError, OverflowError) as exc:
        where = tuple(getattr(exc, k, None) for k in ("column", "partition", "row"))
        return ("error", type(exc), str(exc), where)


def _both(make: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, ...]:
    """``make``'s outcome with the C packer, checked equal to the pure-Python one."""
    fast = _outcome(make)
    with monkeypatch.context() as patch:
        patch.setattr(packing, "native", None)
        slow = _outcome(make)
    assert fast == slow
    return fast


def _packed(rows: list[Any], scratch: bool = True) -> Any:
    return lambda: [pack_rows(rows, 3, 100, Scratch() if scratch else None)]


def _fed(rows: list[Any]) -> Any:
    from tfonspark.executor.feedbatches import row_batches

    def copied(batch: ColumnBatch) -> ColumnBatch:  # before the next batch reuses its memory
        columns = [np.array(c) if isinstance(c, np.ndarray) else list(c) for c in batch.columns]
        return ColumnBatch(columns, batch.layout, batch.names, batch.kinds)

    return lambda: [copied(b) for b in row_batches(3, iter(rows))]


W = [i / 7 for i in range(784)]

CASES = [
    [(list(W), i) for i in range(50)],
    [(tuple(W), i) for i in range(50)],
    [[list(W), float(i)] for i in range(50)],
    [([i] * 32, i) for i in range(50)],  # int64
    [([i, -1, 2**63 - 1, -(2**63)], i) for i in range(5)],  # int64's ends, and -1
    [([1.0] * 4, 1), ([2**63] * 4, 1)],  # beyond int64 among floats
    [([1] * 4, 1), ([2**63] * 4, 1)],  # beyond int64 among ints: numpy's uint64
    [([1.5] * 4, 1), ([2**64] * 4, 1)],  # beyond uint64: an error
    [([1.5] * 4, 1), ([10**400] * 4, 1)],  # beyond float64
    [([1.5] * 4, 0), ([2**53 + 1, 2**62 + 3, -(2**60) - 1, 7], 1)],  # ints rounded to float64
    [([1.5] * 4, 0), ([True, 2, 3.0, False], 1)],  # bools among floats
    [([True] * 4, 0)] * 3,  # bools: bool
    [([np.float32(1)] * 4, 0)] * 3,  # numpy scalars
    [([1.0] * 4, 0), ([np.float64(2)] * 4, np.int64(1))],
    [(list(np.arange(8.0) + i), i) for i in range(5)],  # numpy.float64 values (list(array))
    [(list(np.arange(8.0) + i), np.float64(i)) for i in range(5)],
    [([1, True, False, 2], i) for i in range(3)],  # bools among ints
    [([1, 2], 1), ([1, 2], True)],  # a bool label among ints
    [([1, 2], 1.5), ([1, 2], True)],
    [([1] * 4, 0), ([1, 2, 3.5, 4], 1)],  # a float after int rows
    [([1.0] * 4, 0), ([1.0, None, 2.0, 3.0], 1)],  # None among numbers
    [([1.0] * 4, 0), ([1.0, "x", 2.0, 3.0], 1)],  # a str
    [([1.0] * 4, 0), ([1.0] * 3, 1)],  # ragged
    [([1.0] * 4, 0), ([1.0] * 4, 1, 2)],  # ragged rows
    [([1.0] * 4, 0), [[1.0] * 4, 1]],  # lists and tuples mix
    [([1.0] * 4, 0), Point([1.0] * 4, 1)],
    [Point([1.0] * 4, i) for i in range(10)],
    [([float("nan"), float("inf"), -0.0, 5e-324], 0)] * 3,
    [([], 0)] * 3,  # empty features
    [([[1.0, 2.0]] * 3, 0)] * 3,  # nested lists: 2-D
    [([1.0] * 4, 0.5), ([1.0] * 4, 1)],  # float labels then an int
    [([1.0] * 4, 1), ([1.0] * 4, 0.5)],  # int labels then a float
    [([1.0] * 4, 1), ([1.0] * 4, 2**63)],  # an int label beyond int64
    [([1.0] * 4, 1), ([1.0] * 4, "x")],
    [([1.0] * 4, 1), ([1.0] * 4, None)],
    [([1.0] * 4, True), ([1.0] * 4, 1)],
    [(1.0, 2, 3.0)] * 5,  # rows of scalars
    [[1, 2], [3, 4.5]],
    [(np.zeros(4), 1)] * 3,  # array rows
    [(np.arange(32, dtype=np.float32) + i, i) for i in range(50)],  # small arrays: np.asarray's path
    [[np.ones(784, np.float32) * i, i] for i in range(20)],  # large arrays in list rows
    [(np.arange(12, dtype=np.int16).reshape(4, 3) + i, i) for i in range(5)],  # 2-D int16
    [(np.array([True, False]), 1)] * 3,
    [np.arange(5.0) + i for i in range(10)],  # rows that are arrays
    [np.ones(600, np.float32)] * 3,
    [{"x": np.ones(3, np.float32) * i, "y": i} for i in range(4)],
    [(np.zeros(4, np.float32), 1), (np.zeros(4, np.float64), 2)],  # dtypes promote
    [(np.zeros(4), 1), (np.zeros(5), 2)],  # ragged
    [(np.zeros((2, 2)), 1), (np.zeros(4), 2)],  # same size, other shape
    [(np.arange(8.0)[::2], 1)] * 3,  # strided views
    [(np.arange(4.0), 1), (np.arange(8.0)[::2], 2)],
    [(np.asfortranarray(np.arange(6.0).reshape(2, 3)), 1)] * 2,
    [(np.zeros(4, ">f4"), 1)] * 3,  # not native byte order: numpy's result is native
    [(np.array(1.5), 1)] * 3,  # 0-d arrays
    [(np.zeros(0), 1)] * 3,  # empty arrays
    [(np.array([1, "a"], dtype=object), 1)] * 2,
    [(np.zeros(4), 1), (np.zeros(4).view(type("Sub", (np.ndarray,), {})), 2)],  # a subclass
    [([1.0] * 4, 1), (np.ones(4), 2)],  # an array among lists
    [(np.ones(4), 1), ([1.0] * 4, 2)],  # a list among arrays
    [(np.ones(4, np.float32), 1), (np.ones(4, np.float32), 2.5)],  # a float label after ints
    [("a", [1.0] * 4, {"k": 1})] * 2,
    [{"x": [1.0] * 4, "y": 1}] * 3,
    [1.0, 2.0, 3],
]


@needs_native
@pytest.mark.parametrize("rows", CASES)
def test_pack_rows_gives_the_same_frames_and_errors_with_and_without_the_c_packer(rows, monkeypatch):
    _both(_packed(rows), monkeypatch)
    _both(_packed(rows, scratch=False), monkeypatch)
    _both(_fed(rows), monkeypatch)


@needs_native
def test_row_subclasses_pack_like_tuples(monkeypatch):
    from pyspark.sql import Row

    class Mine(list):
        def __len__(self) -> int:
            return 2

    class Backwards(tuple):
        def __iter__(self):
            return iter(reversed(tuple.__iter__(self)))

    _both(_packed([Row(features=[float(i)] * 8, label=i) for i in range(20)]), monkeypatch)
    _both(_packed([Mine([[1.0] * 4, 1, 3])] * 3), monkeypatch)
    _both(_packed([Backwards(([1.0] * 4, 1))] * 3), monkeypatch)


@needs_native
@pytest.mark.parametrize("seed", range(40))
def test_randomly_spoilt_chunks_give_the_same_frames_and_errors(seed, monkeypatch):
    """Rows long enough for several chunks, a few values replaced by odd ones at random."""
    rng = random.Random(seed)
    width = rng.choice([3, 32, 784])
    rows: list[Any] = [([rng.random() for _ in range(width)], i) for i in range(rng.choice([20, 2000]))]
    odd = [
        None,
        "1",
        True,
        np.float32(1),
        np.float64(2.5),
        np.int64(3),
        2**63,
        2**70,
        7,
        -1,
        [1.0],
        (),
        1j,
        float("nan"),
    ]
    for _ in range(rng.choice([0, 1, 3])):
        r = rng.randrange(len(rows))
        features, label = rows[r]
        if rng.random() < 0.7:
            features = list(features)
            features[rng.randrange(width)] = rng.choice(odd)
        else:
            label = rng.choice(odd)
        rows[r] = (tuple(features) if rng.random() < 0.3 else features, label)
    outcome = _both(_fed(rows), monkeypatch)
    assert outcome[0] == "error" or sum(len(f) for f in outcome[1]) > 0


def _family(rng: random.Random, n: int) -> list[Any]:
    """``n`` rows of one of the shapes users feed, every row built like the first."""
    from pyspark.sql import Row

    width = rng.choice([1, 3, 40])
    kind = rng.choice(["list", "tuple", "row", "scalar", "array", "scalar-array", "int-features"])
    if kind == "row":
        return [Row(features=[rng.random() for _ in range(width)], label=i) for i in range(n)]
    if kind == "scalar":
        return [rng.random() if rng.random() < 0.9 else i for i in range(n)]
    if kind == "array":
        return [(np.full(width, i, np.float32), i) for i in range(n)]
    if kind == "scalar-array":
        return [np.full((2, width), i, np.int16) for i in range(n)]
    if kind == "int-features":
        return [([rng.randrange(100) for _ in range(width)], i) for i in range(n)]
    container = list if kind == "list" else tuple
    return [(container(rng.random() for _ in range(width)), i) for i in range(n)]


def _spoilt(rng: random.Random, row: Any) -> Any:
    """``row`` made unlike its neighbours in one of the ways that change how a chunk packs."""
    from pyspark.sql import Row

    odd = [None, "1", True, np.float32(1), np.float64(2.5), np.int64(3), 2**63, 7, 2.5, 1j, float("nan")]
    if isinstance(row, Row):
        features, label = row  # a Row spoilt before may have other field names
        choices = [Row(features=features, target=label), Row(features=tuple(features), label=label)]
        return rng.choice([*choices, Row(features=features, label=rng.choice(odd)), tuple(row)])
    if isinstance(row, np.ndarray):
        return rng.choice([row.astype(np.int32), row[:, :1], row.T.copy(), row.tolist(), rng.choice(odd)])
    if not isinstance(row, tuple):
        return rng.choice(odd)
    features, label = row
    if isinstance(features, np.ndarray):
        return rng.choice([(features.astype(np.float64), label), (features[::2], label), (features, rng.choice(odd))])
    changed = list(features)
    changed[rng.randrange(len(changed))] = rng.choice(odd)
    other = tuple if type(features) is list else list
    return rng.choice([(changed, label), (other(features), label), (features, rng.choice(odd)), [features, label]])


@needs_native
@pytest.mark.parametrize("seed", range(400))
def test_rows_packed_as_they_come_give_the_frames_and_errors_of_chunks(seed, monkeypatch):
    """Partitions of every row shape the feed task packs row by row, a few rows spoilt at random
    (at a chunk's first row too), against the pure-Python packer's chunk-by-chunk frames."""
    rng = random.Random(seed)
    rows = _family(rng, rng.choice([100, 3000]))
    for _ in range(rng.choice([0, 1, 2, 4])):
        r = rng.choice([rng.randrange(16, len(rows)), 16 + 41 * rng.randrange(2), len(rows) - 1])
        rows[r] = _spoilt(rng, rows[r])
    outcome = _both(_fed(rows), monkeypatch)
    assert outcome[0] == "error" or sum(len(f) for f in outcome[1]) > 0


@needs_native
def test_an_error_in_the_users_map_reaches_the_feed_task_from_any_row():
    from tfonspark.executor.feedbatches import row_batches

    def rows() -> Any:
        for i in range(500):
            if i == 300:
                raise ZeroDivisionError("the user's map failed at row 300")
            yield ([1.0] * 8, i)

    source = rows()
    with pytest.raises(ZeroDivisionError, match="row 300"):
        list(row_batches(0, source))


@needs_native
def test_fill_frame_drops_each_row_it_packs_and_checks_its_arguments():
    rows = [([0.5, 2.0], i) for i in range(10)]
    values = [sys.getrefcount(r) for r in rows]
    plan = packing.row_plan(pack_rows(rows[:2]), rows[0])
    assert plan is not None
    columns = [np.zeros((8, 2)), np.zeros(8, np.int64)]
    marker = float("0.5")  # one object in every row made below: its count says which rows live

    def fresh() -> Any:
        for i in range(10):
            yield ("odd", 3) if i == 3 else ([marker, 2.0], i)

    alone = sys.getrefcount(marker)
    source = fresh()
    end, leftover = packing.fill_frame(source, plan, columns, (0, 4), 2)
    assert (end, leftover) == (3, (("odd", 3),))
    assert sys.getrefcount(marker) == alone  # rows 0-2 were packed and dropped
    assert columns[1][:3].tolist() == [0, 1, 2] and columns[0][:3].tolist() == [[0.5, 2.0]] * 3
    assert packing.rebuilt_rows(plan, columns, 2, 3) == [([0.5, 2.0], 2)]  # the chunk's rows before "odd"
    assert packing.fill_frame(source, plan, columns, (4, 8), 2) == (8, None)  # rows 4-7
    assert packing.fill_frame(source, plan, columns, (0, 4), 2) == (2, None)  # rows 8-9: the end
    assert sys.getrefcount(marker) == alone
    assert [sys.getrefcount(r) for r in rows] == values
    with pytest.raises(ValueError, match="too small"):
        packing.fill_frame(iter(rows), plan, columns, (0, 9), 2)
    with pytest.raises(ValueError, match="bad"):
        packing.native.fill_frame(rows, tuple, 2, None, plan.specs, 0, 4, 2)  # a list, not an iterator
    with pytest.raises(ValueError, match="bad"):
        packing.fill_frame(iter(rows), plan, columns, (1, 4), 2)  # not at a chunk's start


def test_rebuilt_rows_pack_as_the_rows_did():
    from pyspark.sql import Row

    named = Row(features=[1.0, 2], label=3)
    for first in (([1.0, 2], 3), [(1.5, -2.0), 3], named, Point(1.0, 2), 2.5, 7, (np.arange(4.0), 1), np.ones((2, 3))):
        rows = [first] * 5
        batch = pack_rows(rows)
        plan = packing.row_plan(batch, first)
        if packing.native is None:
            assert plan is None
            continue
        assert plan is not None, first
        rebuilt = packing.rebuilt_rows(plan, batch.columns, 1, 4)
        assert len(rebuilt) == 3 and type(rebuilt[0]) is type(first)
        assert _frames([pack_rows(rebuilt)]) == _frames([pack_rows(rows[1:4])])
        assert getattr(rebuilt[0], "__fields__", None) == getattr(first, "__fields__", None)


@needs_native
def test_the_c_packer_checks_its_buffer_and_keeps_reference_counts():
    rows = [([0.5, 2], 1)] * 4
    value = rows[0][0][0]
    before = (sys.getrefcount(rows), sys.getrefcount(rows[0]), sys.getrefcount(value))
    out = np.zeros(4 * 2 * 8, np.uint8)
    assert packing.native.pack_column(out, rows, tuple, 2, 0, 2, "d") is True
    assert out.view(np.float64).tolist() == [0.5, 2.0] * 4
    assert packing.native.pack_column(out, rows, tuple, 2, 1, 0, "q") is True
    assert packing.native.pack_column(out, rows, tuple, 2, 0, 2, "q") is False  # 0.5 is no int64
    assert packing.native.pack_column(out, rows, list, 2, 0, 2, "d") is False  # tuples, not lists
    assert packing.native.pack_column(out, [0.5, 1, 2**64], None, 0, -1, 0, "d") is False
    assert packing.native.pack_column(out, [(np.float64(0.5), True)] * 4, None, 0, -1, 2, "d") is True
    assert out.view(np.float64).tolist() == [0.5, 1.0] * 4
    assert packing.native.pack_column(out, [(np.float32(0.5), True)] * 4, None, 0, -1, 2, "d") is False
    assert (sys.getrefcount(rows), sys.getrefcount(rows[0]), sys.getrefcount(value)) == before
    with pytest.raises(ValueError, match="too small"):
        packing.native.pack_column(out[:-1], rows, tuple, 2, 0, 2, "d")
    with pytest.raises((TypeError, ValueError, BufferError)):
        packing.native.pack_column(bytes(64), rows, tuple, 2, 0, 2, "d")  # read-only
    with pytest.raises(ValueError):
        packing.native.pack_column(out, rows, tuple, 2, 0, 2, "f")
    with pytest.raises(ValueError):
        packing.native.pack_column(out, rows, tuple, 2, 2, 2, "d")  # no field 2
    with pytest.raises(ValueError):
        packing.native.pack_column(out, rows, tuple, 2, 0, 2**61, "d")  # width * 8 would overflow


@needs_native
def test_the_c_array_packer_copies_equal_arrays_and_falls_back_on_anything_else():
    arrays = [np.arange(6, dtype=np.float32).reshape(2, 3) + i for i in range(4)]
    rows = [(a, i) for i, a in enumerate(arrays)]
    before = (sys.getrefcount(rows), sys.getrefcount(rows[0]), sys.getrefcount(arrays[0]))
    out = np.zeros(4 * 24, np.uint8)
    pack = packing.native.pack_arrays
    assert pack(out, rows, tuple, 2, 0, np.ndarray, "f", (2, 3)) is True
    assert np.array_equal(out.view(np.float32).reshape(4, 2, 3), np.stack(arrays))
    assert pack(out, arrays, None, 0, -1, np.ndarray, "f", (2, 3)) is True
    assert pack(out, rows, tuple, 2, 0, np.ndarray, "d", (2, 3)) is False  # another format
    assert pack(out, rows, tuple, 2, 0, np.ndarray, "f", (3, 2)) is False  # another shape
    assert pack(out, rows, list, 2, 0, np.ndarray, "f", (2, 3)) is False  # tuples, not lists
    assert pack(out, rows, tuple, 2, 1, np.ndarray, "f", (2, 3)) is False  # ints, not arrays
    strided = [(np.arange(12, dtype=np.float32).reshape(2, 6)[:, ::2], 0)]
    assert pack(out, strided, tuple, 2, 0, np.ndarray, "f", (2, 3)) is False
    assert (sys.getrefcount(rows), sys.getrefcount(rows[0]), sys.getrefcount(arrays[0])) == before
    with pytest.raises(ValueError, match="too small"):
        pack(out[:-1], rows, tuple, 2, 0, np.ndarray, "f", (2, 3))
    with pytest.raises((TypeError, ValueError, BufferError)):
        pack(bytes(96), rows, tuple, 2, 0, np.ndarray, "f", (2, 3))  # read-only
    with pytest.raises(ValueError):
        pack(out, rows, tuple, 2, 0, np.ndarray, "f", [2, 3])  # shape not a tuple
    with pytest.raises(ValueError):
        pack(out, rows, tuple, 2, 2, np.ndarray, "f", (2, 3))  # no field 2
    with pytest.raises(ValueError):
        pack(out, rows, tuple, 2, 0, np.ndarray, "f", (2**40, 2**40))  # would overflow


@needs_native
def test_array_rows_are_packed_in_c(monkeypatch):
    """The array cases above pass by falling back too: this one must take the C path."""
    real, used = packing.native, []

    class Spy:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def pack_arrays(self, *args: Any) -> bool:
            used.append(real.pack_arrays(*args))
            return used[-1]

    monkeypatch.setattr(packing, "native", Spy())
    batch = pack_rows([(np.ones(32, np.float32) * i, i) for i in range(10)], scratch=Scratch())
    assert used == [True] and batch.columns[0].dtype == np.float32 and batch.columns[0][3].tolist() == [3.0] * 32
    pack_rows([np.ones((2, 2)) * i for i in range(3)])
    assert used == [True, True]


def test_the_c_packer_is_built_where_a_c_compiler_is():
    """``pip install`` builds it where it can (its absence would cost the speed silently)."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler here: the pure-Python packer is used")
    assert packing.native is not None, "wire/_pack.c was not built: reinstall with `pip install -e .`"


def test_without_the_c_packer_rows_pack_as_before(monkeypatch):
    monkeypatch.setattr(packing, "native", None)
    batch = pack_rows([([1.0, 2.0], 1), ([3.0, 4.0], 2)])
    assert [c.tolist() for c in batch.columns] == [[[1.0, 2.0], [3.0, 4.0]], [1, 2]]
    assert list(itertools.chain(*(c.dtype.str for c in batch.columns))) == list("<f8<i8")


@needs_native
@pytest.mark.parametrize(
    "value",
    [[1.5, 2], [1, 2], (1, 2.0), [2**63 - 1, -(2**63)], [0.5, 2**63 - 1], [np.float64(1), 2], [1, 2**63], [True, 1]]
    + [[1.0, None], [1.0, "x"], [np.float32(1)], [[1.0]], [], "ab", 1.0, [np.int64(1)], [1.0, 1j], [10**400]],
)
def test_number_code_is_numpys_dtype_or_none(value):
    code = packing.native.number_code(value)
    if code is not None:
        assert code == {"float64": "d", "int64": "q"}[str(np.asarray(value).dtype)]
    else:
        assert (
            type(value) not in (list, tuple)
            or not value
            or not all(type(v) in (float, int) for v in value)
            or (any(type(v) is int and not -(2**63) <= v < 2**63 for v in value))
        )


# ---- empty rows, field names that raise, float subclasses (issue 43, rows 1, 10 and 11) -----------


def _empty_row_partition(kind: str, at: int, n: int) -> list[Any]:
    """``n`` rows of two numbers of ``kind`` (tuple, list or pyspark ``Row``), row ``at`` empty."""
    from pyspark.sql import Row

    make: Any = {
        "tuple": lambda i: (float(i), i),
        "list": lambda i: [float(i), i],
        "row": lambda i: Row(x=float(i), y=i),
    }
    empty: Any = {"tuple": (), "list": [], "row": Row()}[kind]
    rows = [make[kind](i) for i in range(n)]
    rows[at] = empty
    return rows


@pytest.mark.parametrize("kind", ["tuple", "list", "row"])
@pytest.mark.parametrize("at", [0, 15, 16, 17, 1024, 4096, 65536])
def test_an_empty_row_anywhere_in_a_partition_is_an_input_error_naming_it(kind, at, monkeypatch):
    """Row 16 (the first after the 16-row head) empty used to drop its whole chunk with the C
    packer: 100,017 rows fed, 89,095 delivered, and no error. Both packers now name the empty row."""
    rows = _empty_row_partition(kind, at, at + 1000)
    outcome = _both(_fed(rows), monkeypatch) if packing.native is not None else _outcome(_fed(rows))
    assert outcome[0] == "error", f"{sum(len(f) for f in outcome[1])} frames, no error"
    _, cls, message, (column, partition, row) = outcome
    assert cls is InputError and (partition, row) == (3, at), message
    assert "received 0" in message or "empty" in message, message


def test_rows_after_an_empty_row_at_row_16_are_not_lost(monkeypatch):
    """The issue's case: 100,017 rows, row 16 empty: an error, never a feed of fewer rows."""
    rows = _empty_row_partition("tuple", 16, 100_017)
    for native in [packing.native, None] if packing.native is not None else [None]:
        monkeypatch.setattr(packing, "native", native)
        with pytest.raises(InputError) as info:
            list(_fed(rows)())
        assert (info.value.partition, info.value.row) == (3, 16)


@pytest.mark.parametrize(
    "rows, row",
    [
        ([(), (1, 2), (3,)], 0),
        ([[], [1.0], [2.0]], 0),
        ([(), ()], 0),
        ([{}, {}], 0),
        ([(1.0, 2), ()], 1),
        ([[1.0], [1.0], []], 2),
    ],
)
def test_pack_rows_never_gives_a_batch_that_drops_its_rows(rows, row, monkeypatch):
    """``pack_rows([(), (1, 2), (3,)])`` was a 0-column batch of count 0 with the C packer: an
    empty row cannot be fed (its batch could not count it), on either packer."""
    outcome = _both(_packed(rows), monkeypatch) if packing.native is not None else _outcome(_packed(rows))
    assert outcome[0] == "error" and outcome[1] is InputError and outcome[3][1:] == (3, 100 + row), outcome


@pytest.mark.parametrize("empty", [(), [], {}])
def test_a_partition_of_only_empty_rows_is_an_input_error_naming_it(empty, monkeypatch):
    """It was a ZeroDivisionError in ``feedbatches.row_batches`` on both packers."""
    rows = [empty] * 40
    outcome = _both(_fed(rows), monkeypatch) if packing.native is not None else _outcome(_fed(rows))
    assert outcome[0] == "error" and outcome[1] is InputError and outcome[3][1:] == (3, 0), outcome
    assert "partition 3" in outcome[2] or "partition=3" in outcome[2]


class _Named(tuple):  # type: ignore[type-arg]
    """A tuple row (its names an instance attribute, as pyspark's ``Row``) whose field names
    cannot be read for a row with a negative x: ``fill_frame``'s ``same_names`` gives -1."""

    def __getattribute__(self, name: str) -> Any:
        if name == "__fields__" and tuple.__getitem__(self, 0) < 0:
            raise ValueError(f"no field names for x={tuple.__getitem__(self, 0)}")
        return tuple.__getattribute__(self, name)


def _named(x: float, y: int) -> _Named:
    row = _Named((x, y))
    row.__fields__ = ["x", "y"]
    return row


@needs_native
@pytest.mark.parametrize("at", [16, 16 + 10922, 16 + 2 * 10922, 100])
def test_field_names_that_raise_give_that_error_on_both_packers(at, monkeypatch):
    """``fill_frame`` read ``same_names``' -1 (an exception) as "same names" and packed on with the
    exception set: a SystemError. Now the row's own error, as the pure-Python packer gives it."""
    rows = [_named(float(i), i) for i in range(at + 5000)]
    rows[at] = _named(-1.0, at)
    outcome = _both(_fed(rows), monkeypatch)
    if (at - 16) % 10922 == 0:  # a chunk's first row (chunks of 32,768 values): its names are read
        assert outcome[:3] == ("error", ValueError, "no field names for x=-1.0")
    else:
        assert outcome[0] == "frames"


@needs_native
def test_fill_frame_stops_at_field_names_that_raise():
    """It packed on past the row with the exception set, and returned a result with it set (a
    SystemError where the call is checked, else the error surfaces later, anywhere); now the
    row's ValueError, at once."""
    rows = [_named(0.5, i) for i in range(8)]
    rows[4] = _named(-0.5, 4)
    plan = packing.row_plan(pack_rows(rows[:2]), rows[0])
    assert plan is not None and plan.rowtype is _Named
    columns = [np.zeros(8), np.zeros(8, np.int64)]
    specs = tuple((*spec, column) for spec, column in zip(plan.specs, columns))
    source = iter(rows)
    with pytest.raises(ValueError, match="no field names for x=-0.5"):
        packing.native.fill_frame(source, _Named, 2, ["x", "y"], specs, 0, 8, 2)
    assert next(source) is rows[5]  # it stopped at the row that raised


class _Plain(tuple):  # type: ignore[type-arg]
    """A tuple subclass with tuple's own constructor (``_Plain(1.0, 2)`` is a TypeError)."""


@needs_native
def test_rows_of_a_plain_tuple_subclass_pack_as_without_the_c_packer(monkeypatch):
    """Rebuilt as ``rowtype(*values)``: a TypeError with the C packer, the row's InputError without."""
    rows = [_Plain((float(i), i)) for i in range(200)]
    rows[100] = _Plain((1.0, None))
    outcome = _both(_fed(rows), monkeypatch)
    assert outcome[:2] == ("error", InputError) and outcome[3][2] == 100


class _Described(tuple):  # type: ignore[type-arg]
    """A tuple row whose field names are a property of its class (no setter)."""

    @property
    def __fields__(self) -> list[str]:
        return ["x", "y"]


@needs_native
def test_rows_whose_field_names_are_a_class_property_pack_as_without_the_c_packer(monkeypatch):
    """Rebuilding such rows (``rebuilt_rows``, after a row ``fill_frame`` leaves over) cannot
    set their names: an AttributeError with the C packer, frames without it."""
    rows = [_Described((float(i), i)) for i in range(200)]
    rows[100] = _Described((1.0, None))
    outcome = _both(_fed(rows), monkeypatch)
    assert outcome[:2] == ("error", InputError) and outcome[3][2] == 100


class _Odd(float):
    """A float whose ``float()`` is not its stored value (numpy reads ``float()``)."""

    def __float__(self) -> float:
        return 99.0


@needs_native
@pytest.mark.parametrize(
    "rows",
    [
        [([1.0], 1.0), ([1.0], _Odd(1.5))],  # a float label among floats
        [(1.0, 2.0), (_Odd(1.5), 2.0)],
        [([1.0, 2.0], 1.0)] * 40 + [([1.0, _Odd(1.5)], _Odd(2.5))] * 30,  # past the head: fill_frame
        [([1.0, 2.0], 1.0)] * 5000 + [([1.0, 2.0], _Odd(2.5))],
        [([1.0, 2.0], 1.0), ([1.0, _Odd(2.0)], 1.0)],
        [1.0, _Odd(1.5)],
    ],
)
def test_a_float_subclass_packs_the_same_with_and_without_the_c_packer(rows, monkeypatch):
    """The C packer wrote a float subclass's stored value where the pure-Python packer asks
    numpy, which calls ``__float__``: other frames (12 of 6,497 differential cases)."""
    _both(_packed(rows), monkeypatch)
    _both(_fed(rows), monkeypatch)


@needs_native
def test_numpy_float64_values_stay_on_the_c_path(monkeypatch):
    """numpy.float64 (a float subclass whose ``float()`` is its value) is still packed in C."""
    real, used = packing.native, []

    class Spy:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def pack_column(self, *args: Any) -> bool:
            used.append(real.pack_column(*args))
            return used[-1]

    monkeypatch.setattr(packing, "native", Spy())
    batch = pack_rows([(list(np.arange(8.0) + i), np.float64(i)) for i in range(10)])
    assert used == [True, True] and batch.columns[1].tolist() == list(range(10))
