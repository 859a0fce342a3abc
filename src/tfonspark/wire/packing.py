"""Python rows packed into a :class:`~.codec.ColumnBatch`: numpy columns, checked as they are packed.

:func:`pack_rows` takes a chunk of rows (scalars, arrays, tuples/lists, dicts, ``Row``s) and
gives its columns, or an ``InputError`` naming the column, partition and row. The optional C
packer (``_pack.c``, :data:`native`) packs rows of floats, ints, flat lists of them and numpy
arrays straight from the rows; wherever it meets anything else the pure-Python packer here
decides, so dtypes, frames and errors are the same with or without it. :func:`row_plan`,
:func:`fill_frame` and :func:`rebuilt_rows` pack rows one at a time into a frame as the feed
task pulls them from Spark (``executor/feedbatches.py``). :class:`Scratch` is the reused
memory columns are packed into.
"""

from __future__ import annotations

import functools
import itertools
import operator
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InputError
from .codec import LIST, OTHER, TUPLE, ColumnBatch

__all__ = ["RowPlan", "Scratch", "fill_frame", "pack_rows", "rebuilt_rows", "row_plan"]


def _kind(value: Any) -> str:
    """The ``kinds`` letter of one fed value or row."""
    cls = type(value)
    return LIST if cls is list else TUPLE if cls is tuple else OTHER


class Scratch:
    """Reused memory for packing columns of large array values (one buffer per column).

    A fresh multi-MB array per batch page-faults its way in: ~1 us per 3 KB row, as much as the
    copy itself. A batch packed with a Scratch is valid only until the next ``pack_rows`` with
    the same Scratch (the feeder sends each batch before packing the next).
    """

    #: smaller values are cheaper to pack with ``np.asarray`` (no per-value checks)
    MIN_VALUE_BYTES = 512

    def __init__(self) -> None:
        self._buffers: dict[str | int, np.ndarray] = {}

    def stack(self, key: str | int, values: Sequence[Any]) -> np.ndarray | None:
        """``values`` stacked into reused memory; None unless all are ndarrays like the first."""
        first = values[0]
        if first.ndim == 0 or first.nbytes < self.MIN_VALUE_BYTES:
            return None
        if (
            set(map(type, values)) != {np.ndarray}
            or set(map(_dtype, values)) != {first.dtype}
            or not _same_shapes(values, first.shape)
        ):
            return None  # np.asarray promotes mixed dtypes or names the ragged row
        need = len(values) * first.nbytes
        out = self.buffer(key, need).view(first.dtype).reshape((len(values) * first.shape[0], *first.shape[1:]))
        np.concatenate(values, out=out)
        shaped: np.ndarray = out.reshape((len(values), *first.shape))
        return shaped

    def buffer(self, key: str | int, nbytes: int) -> np.ndarray:
        """``nbytes`` of this column's reused memory (uint8), grown when too small."""
        buf = self._buffers.get(key)
        if buf is None or buf.nbytes < nbytes:
            buf = self._buffers[key] = np.empty(nbytes, np.uint8)
        return buf[:nbytes]


_shape = operator.attrgetter("shape")
_dtype = operator.attrgetter("dtype")
_ndim = operator.attrgetter("ndim")


def _same_shapes(values: Sequence[np.ndarray], shape: tuple[int, ...]) -> bool:
    """Every array has ``shape`` (for 1-D arrays, ``len`` and ``ndim`` are cheaper than ``shape``)."""
    if len(shape) == 1:
        return set(map(len, values)) == {shape[0]} and set(map(_ndim, values)) == {1}
    return set(map(_shape, values)) == {shape}


def _column(
    values: Sequence[Any], name: str | int, partition: int | None, first_row: int, scratch: Scratch | None = None
) -> Any:
    """One column as a numpy array when its values form a regular numeric array, else a list."""
    first = values[0]
    if isinstance(first, (str, bytes, dict)) or first is None:
        return list(values)
    if type(first) is np.ndarray and type(values) in _SEQUENCES:
        packed_arrays = _native_arrays(values, 0, -1, None, name, scratch)
        if packed_arrays is not None:
            return packed_arrays
    if scratch is not None and type(first) is np.ndarray:
        stacked = scratch.stack(name, values)
        if stacked is not None:
            return stacked
    if type(first) in _SEQUENCES:
        packed = _pack_sequences(values, name, scratch)
        if packed is not None:
            return packed
    try:  # C-speed for equal-shape arrays (np.stack costs ~4x more per row); ragged -> ValueError
        arr = np.asarray(values)
    except ValueError:
        raise _ragged(values, name, partition, first_row) from None
    if arr.dtype == object:
        raise _ragged(values, name, partition, first_row)
    if arr.dtype.kind in "US":
        if np.asarray(first).dtype.kind not in "US":  # numbers then strings: mixed, not text
            raise _ragged(values, name, partition, first_row)
        return list(values)
    return arr


def _load_native() -> Any:
    """The optional C packer (``_pack.c``), or None where it was not built (no C compiler)."""
    try:
        from . import _pack
    except ImportError:
        return None
    return _pack


#: the C packer of rows of floats/ints (``_pack.c``: ~1.5 ns a value, struct ~11), or None: then,
#: and wherever it meets anything unusual (it says so and writes nothing that counts), the
#: pure-Python packer below decides, so results and errors are the same with or without it.
#: Tests set it to None to run the pure-Python packer.
native: Any = _load_native()

_SEQUENCES = frozenset({list, tuple})
#: numpy's dtype for lists of Python floats / ints -> the struct code that packs them strictly
#: ("d" takes floats, ints, bools and numpy numbers, never str or None; "q" takes no floats)
_F8, _I8 = np.dtype(np.float64), np.dtype(np.int64)
_STRUCT_CODES = {_F8: "d", _I8: "q"}
#: rows at least this wide are packed one struct call per row, narrower ones in blocks
_MIN_ROW_WIDTH = 16
_BLOCK = 1024


def _pack_sequences(values: Sequence[Any], name: str | int, scratch: Scratch | None) -> np.ndarray | None:
    """A column of equal-shape (nested) lists/tuples of Python numbers, packed at C speed.

    TFoS rows carry features as lists (``(vec[1:], vec[0])``, ``x.tolist()``): ``np.asarray``
    spends ~30 ns per number on them, ``struct`` about half that, checking every value's type
    as it packs. The first value fixes dtype and shape (float64 for floats or floats and ints,
    int64 for ints, as numpy); None (the caller falls back to ``np.asarray``, which gives numpy's
    dtype or the error naming the row) when it is not such a list, or when a row differs:
    another length or nesting, a str/None/complex, a float among int64s, an int beyond int64.
    """
    try:
        probe = np.asarray(values[0])
    except ValueError:  # a ragged first value: np.asarray names it
        return None
    code = _STRUCT_CODES.get(probe.dtype)
    if code is None or probe.size == 0:
        return None
    need = len(values) * probe.size * probe.itemsize
    out = _out(scratch, name, need)
    if native is None or probe.ndim != 1 or not native.pack_column(out, values, None, 0, -1, probe.size, code):
        rows = _innermost_rows(values, probe.shape)  # the pure-Python packer decides
        if rows is None:
            return None
        try:
            _pack_into(out, rows, probe.shape[-1], code)
        except (struct.error, TypeError, OverflowError):
            return None
    packed: np.ndarray = out.view(probe.dtype).reshape((len(values), *probe.shape))
    return packed


def _innermost_rows(values: Sequence[Any], shape: tuple[int, ...]) -> Sequence[Any] | None:
    """The lists of numbers at the deepest level, if every level is lists/tuples of ``shape``."""
    level = values
    for depth, size in enumerate(shape):
        if not set(map(type, level)) <= _SEQUENCES or set(map(len, level)) != {size}:
            return None
        if depth < len(shape) - 1:
            level = list(itertools.chain.from_iterable(level))
    return level


def _pack_into(out: np.ndarray, rows: Sequence[Any], width: int, code: str) -> None:
    """Pack ``rows`` (each ``width`` numbers) into ``out``: a call per wide row, else per block."""
    if width >= _MIN_ROW_WIDTH:
        pack = _packer(width, code)
        step = struct.calcsize(f"{width}{code}")
        for offset, row in zip(range(0, step * len(rows), step), rows):
            pack(out, offset, *row)
        return
    flat = itertools.chain.from_iterable(rows)
    total, done, itemsize = len(rows) * width, 0, struct.calcsize(f"{code}")
    block = _packer(_BLOCK, code)
    while total - done >= _BLOCK:
        block(out, done * itemsize, *itertools.islice(flat, _BLOCK))
        done += _BLOCK
    if done < total:
        _packer(total - done, code)(out, done * itemsize, *flat)


@functools.lru_cache(maxsize=64)
def _packer(count: int, code: str) -> Callable[..., None]:
    """``pack_into`` of ``count`` numbers of struct ``code`` (compiled once), in native size and
    order: as numpy's float64/int64, and ~10% cheaper than the standard sizes of ``=``."""
    return struct.Struct(f"{count}{code}").pack_into


def _ragged(values: Sequence[Any], name: str | int, partition: int | None, first_row: int) -> InputError:
    """Locate the first value whose shape or type differs from the first row's, or that holds
    non-numbers (None, str) among numbers."""
    expected = _shape_of(values[0])
    for i, value in enumerate(values):
        got = _shape_of(value)
        if value is None or got != expected or got in ("str", _RAGGED):
            what = "None" if value is None else f"{_shape_text(got)}, type={type(value).__name__}"
            like = f"expected {_shape_text(expected)} like the first row, " if i else ""
            return InputError(
                f"ragged or mixed values: {like}received {what}",
                column=name,
                partition=partition,
                row=first_row + i,
            )
    for i, value in enumerate(values):
        dtype = np.asarray(value).dtype
        if dtype.kind not in "biufc":
            return InputError(
                f"values cannot form a numeric array: received a {type(value).__name__} that numpy reads as "
                f"dtype={dtype} (a None, a str or an int beyond 64 bits among its numbers?)",
                column=name,
                partition=partition,
                row=first_row + i,
            )
    return InputError("values cannot form a numeric array", column=name, partition=partition, row=first_row)


_RAGGED = "nested sequences of different lengths"


def _shape_text(shape: tuple[int, ...] | str) -> str:
    return shape if shape == _RAGGED else f"shape={shape}"


def _shape_of(value: Any) -> tuple[int, ...] | str:
    """numpy's shape of ``value``; "str" for text, ``_RAGGED`` for unequal nested sequences."""
    if isinstance(value, (str, bytes)):
        return "str"
    try:
        return tuple(np.shape(value))
    except ValueError:
        return _RAGGED


def _native_columns(rows: Sequence[Any], names: list[str] | None, scratch: Scratch | None) -> list[Any] | None:
    """The columns of tuple/list rows of numbers, flat lists/tuples of numbers and numpy arrays,
    packed in C in one pass over the rows per column, without transposing them; None (the caller
    packs the rows in Python) without the C packer, or where any row or value is not like the first."""
    first = rows[0]
    rowtype = type(first)
    if native is None or type(rows) not in _SEQUENCES or not _plain_row_type(rowtype) or not len(first):
        return None  # an empty first row: no column would count the rows (pack_rows refuses it)
    columns = []
    for j in range(len(first)):
        key = names[j] if names else j
        column = _native_arrays(rows, len(first), j, rowtype, key, scratch)
        if column is None:
            column = _native_numbers(rows, len(first), j, rowtype, key, scratch)
        if column is None:
            return None
        columns.append(column)
    return columns


def _native_numbers(
    rows: Sequence[Any], fields: int, j: int, rowtype: type, key: str | int, scratch: Scratch | None
) -> np.ndarray | None:
    """Field ``j`` of every row, numbers or flat lists/tuples of numbers, packed by ``_pack.c``."""
    spec = _number_spec(rows[0][j])
    if spec is None:
        return None
    dtype, width = spec
    out = _out(scratch, key, len(rows) * max(width, 1) * dtype.itemsize)
    if not native.pack_column(out, rows, rowtype, fields, j, width, _STRUCT_CODES[dtype]):
        return None
    return out.view(dtype).reshape((len(rows), width) if width else (len(rows),))


def _native_arrays(
    rows: Sequence[Any], fields: int, j: int, rowtype: type | None, key: str | int, scratch: Scratch | None
) -> np.ndarray | None:
    """Field ``j`` of every row (``j`` -1: the rows themselves), numpy arrays of the first's
    native numeric dtype and shape, copied by ``_pack.c`` (~40 ns a row; ``np.asarray`` of a
    list of small arrays ~0.5 us); None where numpy must decide: other dtypes, shapes or types
    (it promotes, or names the ragged row), strided views, non-native byte order (numpy's result
    is native)."""
    value = rows[0] if j < 0 else rows[0][j]
    if (
        native is None
        or type(value) is not np.ndarray
        or value.ndim == 0
        or value.size == 0
        or value.dtype.kind not in "biuf"
        or not value.dtype.isnative
    ):
        return None
    out = _out(scratch, key, len(rows) * value.nbytes)
    fmt = value.data.format if value.flags.c_contiguous else ""
    if not fmt or not native.pack_arrays(out, rows, rowtype, fields, j, np.ndarray, fmt, value.shape):
        return None
    return out.view(value.dtype).reshape((len(rows), *value.shape))


def _out(scratch: Scratch | None, key: str | int, nbytes: int) -> np.ndarray:
    """``nbytes`` to pack a column into: the scratch's reused memory, else fresh."""
    return scratch.buffer(key, nbytes) if scratch is not None else np.empty(nbytes, np.uint8)


def _plain_row_type(cls: type) -> bool:
    """A list, tuple or tuple subclass (``Row``, a namedtuple) that ``zip`` and ``len`` see as a tuple."""
    return cls in _SEQUENCES or (
        issubclass(cls, tuple) and cls.__iter__ is tuple.__iter__ and cls.__len__ is tuple.__len__
    )


def _number_spec(value: Any) -> tuple[np.dtype, int] | None:
    """(dtype, width) of a value that ``_pack.c`` packs as the pure-Python path would: a float or an
    int (width 0; numpy's float64/int64 for a column of them), or a non-empty flat list/tuple of
    numbers (numpy's dtype for it, as :func:`_pack_sequences` probes); None for anything else."""
    cls = type(value)
    if cls is float or cls is int:
        return _F8 if cls is float else _I8, 0
    code = native.number_code(value)  # np.asarray's dtype, ~10x faster; None for anything unusual
    return None if code is None else (_F8 if code == "d" else _I8, len(value))


def _uniform_sequences(rows: Sequence[Any], width: int) -> bool:
    """All rows are tuples/lists (or subclasses, like ``Row``) of ``width`` fields (C-speed checks)."""
    return all(issubclass(t, (tuple, list)) for t in set(map(type, rows))) and set(map(len, rows)) == {width}


def _ragged_rows(rows: Sequence[Any], width: int, partition: int | None, first_row: int) -> InputError:
    """Name the first row that is not a tuple/list of ``width`` fields."""
    for i, row in enumerate(rows):
        if not isinstance(row, (tuple, list)) or len(row) != width:
            got = len(row) if isinstance(row, (tuple, list)) else type(row).__name__
            return InputError(
                f"ragged rows: expected {width} fields like the first row, received {got}",
                partition=partition,
                row=first_row + i,
            )
    return InputError("rows are not all tuples/lists", partition=partition, row=first_row)


def _empty_row(row: Any, partition: int | None, first_row: int) -> InputError:
    """An empty row cannot be fed: columns count rows, and a row of no fields gives no column."""
    return InputError(
        f"empty row: received an empty {type(row).__name__} (0 fields); a row is a value, or a "
        "tuple, list, Row or dict of at least one value",
        partition=partition,
        row=first_row,
    )


@dataclass(frozen=True)
class RowPlan:
    """How ``_pack.c``'s ``fill_frame`` packs rows like a batch's first row, one at a time, into
    frames like that batch (:func:`row_plan`)."""

    rowtype: type | None  # None: each row is the column's value (a "scalar" batch)
    fields: int
    specs: tuple[tuple[Any, ...], ...]  # one per column, less its buffer
    like: ColumnBatch  # layout, names, kinds, dtypes and per-row shapes of the frames


def row_plan(batch: ColumnBatch, first: Any) -> RowPlan | None:
    """A plan to pack rows like ``first`` (``batch``'s first row) into ``batch``'s dtypes and
    shapes, one row at a time: only for rows of numbers, flat lists/tuples of numbers (of the
    first's container type) and numpy arrays, in columns of float64/int64 (numbers) or the
    arrays' own dtype. None without the C packer or for any other batch (dicts, strings, ...)."""
    if native is None or batch.layout not in ("tuple", "scalar"):
        return None
    if batch.layout == "scalar":
        rowtype, fields, values = None, 0, [first]
    elif _plain_row_type(type(first)) and _rebuildable(type(first)):
        rowtype, fields, values = type(first), len(first), list(first)
    else:
        return None
    specs = []
    for j, (column, value) in enumerate(zip(batch.columns, values, strict=True)):
        spec = _value_spec(column, value)
        if spec is None:
            return None
        specs.append((j if rowtype is not None else -1, *spec))
    return RowPlan(rowtype, fields, tuple(specs), batch)


def _rebuildable(rowtype: type) -> bool:
    """:func:`rebuilt_rows` can make rows of ``rowtype`` that pack as the originals: a list, a
    tuple, or a tuple subclass whose field names (if any) are an instance attribute, as pyspark's
    ``Row`` keeps them (not a property or class attribute that a rebuilt row could not set)."""
    return rowtype in _SEQUENCES or not any("__fields__" in vars(cls) for cls in rowtype.__mro__)


def _value_spec(column: Any, value: Any) -> tuple[Any, ...] | None:
    """``fill_frame``'s spec (less field and buffer) for values like ``value`` into ``column``'s dtype."""
    if not isinstance(column, np.ndarray):
        return None
    if type(value) is np.ndarray:
        same = value.dtype == column.dtype and value.shape == column.shape[1:] and value.flags.c_contiguous
        if not same or value.ndim == 0 or value.size == 0 or value.dtype.kind not in "biuf" or not value.dtype.isnative:
            return None
        return (1, value.data.format, value.shape, value.nbytes, np.ndarray)
    code = _STRUCT_CODES.get(column.dtype)
    if code is None:
        return None
    if type(value) in (float, int) and column.ndim == 1:
        return (0, 0, code, None)
    if type(value) in _SEQUENCES and column.ndim == 2 and column.shape[1] == len(value) > 0:
        return (0, len(value), code, type(value))
    return None


def fill_frame(
    rows: Any, plan: RowPlan, columns: list[np.ndarray], span: tuple[int, int], size: int
) -> tuple[int, tuple[Any] | None]:
    """Chunks of ``size`` rows pulled from the iterator ``rows`` into rows ``span`` of ``columns``
    (laid out as ``plan.like``'s), each row packed as it comes, exactly where :func:`pack_rows` of
    its chunk would pack it, then dropped: (the row reached, the first row it does not handle, in
    a 1-tuple: a row may be None; or None). That row's chunk is then packed as one chunk: its
    rows so far from :func:`rebuilt_rows`, that row and the rest."""
    specs = tuple((*spec, column) for spec, column in zip(plan.specs, columns, strict=True))
    names = plan.like.names if plan.rowtype is not None else None
    end, leftover = native.fill_frame(rows, plan.rowtype, plan.fields, names, specs, *span, size)
    return end, leftover


def rebuilt_rows(plan: RowPlan, columns: list[np.ndarray], start: int, end: int) -> list[Any]:
    """Rows ``start:end`` of frame columns that :func:`fill_frame` packed, as rows that pack the
    same way, with any row after them, as the rows it was given: of the plan's row type (a
    ``Row`` with its field names), its lists/tuples of Python numbers of each column's dtype (a
    float where it was an int in a float64 column: the same float64) and arrays of its dtype."""
    values = [_rebuilt_values(spec, column[start:end]) for spec, column in zip(plan.specs, columns, strict=True)]
    if plan.rowtype is None:
        return values[0]
    if plan.rowtype is list:
        return [list(row) for row in zip(*values)]
    if plan.rowtype is tuple:
        return list(zip(*values))
    new = tuple.__new__  # a tuple subclass's own constructor may take other arguments (namedtuple's, Row's)
    if not plan.like.names:
        return [new(plan.rowtype, row) for row in zip(*values)]
    rows = []
    for row in zip(*values):  # pyspark's Row: a tuple whose __fields__ name its values
        rebuilt: Any = new(plan.rowtype, row)
        rebuilt.__fields__ = list(plan.like.names)
        rows.append(rebuilt)
    return rows


def _rebuilt_values(spec: tuple[Any, ...], column: np.ndarray) -> list[Any]:
    """One column's values as :func:`fill_frame` took them (see :func:`_value_spec`)."""
    if spec[1] == 1:  # arrays
        return list(column.copy())
    if spec[2] == 0:  # one number a row
        return column.tolist()  # type: ignore[no-any-return]
    valuetype = spec[4]
    return column.tolist() if valuetype is list else [valuetype(v) for v in column.tolist()]


def pack_rows(
    rows: Sequence[Any], partition: int | None = None, first_row: int = 0, scratch: Scratch | None = None
) -> ColumnBatch:
    """Turn Python rows (scalars, arrays, tuples/lists, dicts, Rows) into a ColumnBatch.

    Every row must have the layout of the first; violations raise InputError naming the column,
    partition and row (counted from the start of the partition). An empty row (``()``, ``[]``,
    ``Row()``, ``{}``) is one: its batch would have no column to count the rows by. With
    ``scratch``, columns of large arrays reuse its memory (see :class:`Scratch`).
    """
    first = rows[0]
    if isinstance(first, (tuple, list, dict)) and not len(first):
        raise _empty_row(first, partition, first_row)
    if isinstance(first, dict):
        names = list(first)
        try:
            cols = [[row[k] for row in rows] for k in names]
            if any(len(row) != len(names) for row in rows):  # extra keys would be dropped silently
                raise KeyError
        except Exception:  # indexing a row that is not such a dict may raise anything (a Row: AttributeError)
            bad = next((i for i, r in enumerate(rows) if not isinstance(r, dict) or set(r) != set(names)), None)
            if bad is None:
                raise  # every row is a dict of these keys: its own error
            got = rows[bad]
            what = f"keys {list(got)}" if isinstance(got, dict) else f"a {type(got).__name__}, not a dict with keys"
            raise InputError(
                f"row has keys other than the first row's {names}: received {what}",
                partition=partition,
                row=first_row + bad,
            ) from None
        return ColumnBatch(
            [_column(c, n, partition, first_row, scratch) for c, n in zip(cols, names)],
            "dict",
            names,
            OTHER + "".join(_kind(first[k]) for k in names),
        )
    if isinstance(first, (tuple, list)):
        width = len(first)
        fields = getattr(first, "__fields__", None)
        labels: list[str] | None = list(fields) if fields else None
        columns = _native_columns(rows, labels, scratch)
        if columns is None:
            if not _uniform_sequences(rows, width):
                raise _ragged_rows(rows, width, partition, first_row)
            transposed: list[Any] = list(zip(*rows))
            columns = [
                _column(c, labels[j] if labels else j, partition, first_row, scratch) for j, c in enumerate(transposed)
            ]
        return ColumnBatch(
            columns,
            "tuple",
            labels,
            (OTHER if labels else _kind(first)) + "".join(map(_kind, first)),  # a Row stays a Row-like tuple
        )
    return ColumnBatch([_column(rows, 0, partition, first_row, scratch)], "scalar", None, OTHER + _kind(first))
