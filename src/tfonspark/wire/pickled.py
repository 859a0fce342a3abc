"""Columns straight from PySpark's pickled row batches, without a Python object per number.

A cached (or unioned, parallelized, checkpointed) RDD holds its rows as pickled lists of rows.
Unpickling a row of 784 floats makes 784 float objects (~18 us), and packing those into a
numpy column costs about as much again (~11 ns a value, whatever does it). CPython's pickler
writes a float as ``G`` + 8 big-endian bytes and a small int as ``K``/``M``/``J`` + 1/2/4
bytes, so rows of one shape are byte strings of one length with their opcodes in the same
places. :class:`PickledRows` learns that layout from a batch's first row, checks every opcode
byte of every row against it (vectorised) and reads the numbers with strided numpy views.

Anything it does not recognise (other opcodes, memo references to a shared object, bools,
``None``, strings, rows of another length, a mix of floats and ints in one list, a truncated
number, a frame header inside an opcode's argument) makes :meth:`PickledRows.decode` return
None: the caller then unpickles the batch as PySpark would, so results and errors are those
of the row path. ``decode`` returns columns only for bytes whose every byte it has accounted
for (each opcode checked, each number read), so they are exactly what ``pickle.loads`` makes;
it raises nothing, and every step of its walk over a row moves forward. The bytes come from
Spark's own storage and are only read as numbers here, never executed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .codec import LIST, OTHER, TUPLE, ColumnBatch

__all__ = ["PickledRows"]

_FRAME = 0x95
_PROTOCOLS = (4, 5)  # framed protocols, with MEMOIZE; PySpark pickles with the highest (5)
_LIST_BATCH = 1000  # the pickler's APPENDS group size
#: number opcodes: (payload bytes, dtype of the payload)
_NUMBERS = {ord("G"): (8, ">f8"), ord("K"): (1, "u1"), ord("M"): (2, "<u2"), ord("J"): (4, "<i4")}
_FLOAT = ord("G")
_EMPTY_LIST, _MEMOIZE, _MARK, _APPENDS, _APPEND = b"]", b"\x94", b"(", b"e", b"a"
_TUPLES = {0x85: 1, 0x86: 2, 0x87: 3}
_TUPLE = ord("t")
#: more columns than this and the row path is cheaper (one strided read per column per batch)
MAX_COLUMNS = 64


@dataclass(frozen=True)
class _Run:
    """``count`` numbers of one opcode, ``stride`` bytes apart, the first payload at ``offset``."""

    offset: int
    count: int
    stride: int
    code: int


@dataclass(frozen=True)
class _Field:
    """One column: a bare number (``runs`` of one number, ``seq`` False) or a list/tuple of them."""

    runs: tuple[_Run, ...]
    seq: bool

    @property
    def width(self) -> int:
        return sum(r.count for r in self.runs)

    @property
    def dtype(self) -> np.dtype[Any]:
        return np.dtype(np.float64 if self.runs[0].code == _FLOAT else np.int64)


@dataclass(frozen=True)
class _Template:
    """The byte layout of one row: its length, where its opcodes are and what they are."""

    length: int
    op_positions: np.ndarray  # opcodes other than numbers, checked one by one
    op_values: np.ndarray
    op_runs: tuple[_Run, ...]  # runs of number opcodes, checked with one strided view each
    fields: tuple[_Field, ...]
    scalar: bool  # the row is a bare number, not a tuple/list
    starts: np.ndarray  # bool per byte of the row: an opcode starts there
    kinds: str  # ColumnBatch.kinds: the row's container and each column's (every row has the same opcodes)


class PickledRows:
    """Decode one partition's pickled batches; remembers the row layout between batches."""

    def __init__(self) -> None:
        self._template: _Template | None = None

    def decode(self, blob: bytes) -> ColumnBatch | None:
        """The rows of one pickled batch as columns, or None if the layout is not recognised."""
        read = _opcodes(blob)
        if read is None:
            return None
        ops, cuts = read
        if len(ops) < 5 or ops[:2] != _EMPTY_LIST + _MEMOIZE:
            return None
        single = ops[-2:] == _APPEND + b"."
        if not single and ops[-2:] != _APPENDS + b".":
            return None
        template = self._template
        groups = None if template is None else _groups(ops, template.length, single)
        if template is None or groups is None or not _matches(ops, groups, template):
            learned = _learn(ops, 2 if single else 3, single)
            if learned is None:
                return None
            template, groups = learned
            self._template = template
        if cuts and not _cuts_at_opcodes(cuts, groups, template, len(ops)):
            return None
        return _extract(ops, groups, template)


def _opcodes(blob: bytes) -> tuple[bytes, list[int]] | None:
    """The pickle's opcode stream with its frame headers removed, and where in that stream
    each header after the first was (None if not protocol 4/5, or a frame overruns the end)."""
    if len(blob) < 3 or blob[0] != 0x80 or blob[1] not in _PROTOCOLS:
        return None
    view, parts, cuts, pos, end, done = memoryview(blob), [], [], 2, len(blob), 0
    while pos < end:
        if blob[pos] != _FRAME:
            parts.append(view[pos:])  # a last frame under 4 bytes is written without its header
            break
        if done:
            cuts.append(done)
        size = int.from_bytes(view[pos + 1 : pos + 9], "little")
        parts.append(view[pos + 9 : pos + 9 + size])
        done += len(parts[-1])
        pos += 9 + size
    if pos > end:
        return None
    return (bytes(parts[0]) if len(parts) == 1 else b"".join(parts)), cuts


def _cuts_at_opcodes(cuts: list[int], groups: list[tuple[int, int]], template: _Template, total: int) -> bool:
    """Each frame header taken out of the stream stood where an opcode starts.

    ``pickle.loads`` treats FRAME as an opcode like any other: a header that stands inside a
    number's 8 bytes (never written by the pickler, but possible in stored bytes) is read by
    it as part of that number, so the columns would differ from its rows. A batch has one cut
    per 64 KiB frame: plain Python ints are cheaper than numpy here.
    """
    length, starts = template.length, template.starts
    for at in cuts:
        if at <= 1 or at >= total - 1:
            continue  # the batch's EMPTY_LIST and MEMOIZE; STOP
        for offset, rows in groups:
            end = offset + rows * length
            if at == offset - 1 or at == end:
                break  # the group's MARK and APPENDS (one row: MEMOIZE, APPEND)
            if offset <= at < end:
                if not starts[(at - offset) % length]:
                    return False
                break
        else:
            return False
    return True


def _groups(ops: bytes, length: int, single: bool) -> list[tuple[int, int]] | None:
    """(offset, rows) of each APPENDS group of rows ``length`` bytes long, if the sizes add up."""
    total = len(ops)
    if length <= 0:
        return None
    if single:
        return [(2, 1)] if total == 2 + length + 2 else None
    groups = 1
    while True:  # more groups leave fewer rows: at most rows / 1,000 + 1 rounds
        rows, rest = divmod(total - 3 - 2 * groups, length)
        if rows <= 0 or (groups - 1) * _LIST_BATCH >= rows:
            return None
        if not rest and -(-rows // _LIST_BATCH) == groups:
            out, pos = [], 2
            for first in range(0, rows, _LIST_BATCH):
                count = min(_LIST_BATCH, rows - first)
                if ops[pos : pos + 1] != _MARK or ops[pos + 1 + count * length : pos + 2 + count * length] != _APPENDS:
                    return None
                out.append((pos + 1, count))
                pos += 2 + count * length
            return out
        groups += 1


def _matches(ops: bytes, groups: list[tuple[int, int]], template: _Template) -> bool:
    """Every row of every group has the template's opcodes at the template's places."""
    data = np.frombuffer(ops, np.uint8)
    length = template.length
    for offset, rows in groups:
        block = data[offset : offset + rows * length].reshape(rows, length)
        if not (block[:, template.op_positions] == template.op_values).all():
            return False
        for run in template.op_runs:
            codes = np.ndarray((rows, run.count), np.uint8, ops, offset + run.offset - 1, (length, run.stride))
            if not (codes == run.code).all():
                return False
    return True


def _extract(ops: bytes, groups: list[tuple[int, int]], template: _Template) -> ColumnBatch:
    """Read every field's numbers out of the rows with strided views (one per run and group)."""
    count = sum(rows for _, rows in groups)
    columns = []
    for field in template.fields:
        out = np.empty((count, field.width), field.dtype)
        done = 0
        for offset, rows in groups:
            column = 0
            for run in field.runs:
                view: np.ndarray = np.ndarray(
                    (rows, run.count),
                    _NUMBERS[run.code][1],
                    ops,
                    offset + run.offset,
                    (template.length, run.stride),
                )
                out[done : done + rows, column : column + run.count] = view
                column += run.count
            done += rows
        columns.append(out if field.seq else out[:, 0])
    return ColumnBatch(columns, "scalar" if template.scalar else "tuple", None, template.kinds)


# ---- learning a row's layout from its bytes ---------------------------------------------------------
class _Walk:
    """A small stack machine over one row's opcodes: numbers, lists and tuples of them only.

    Pickles are postfix (a tuple's opcode follows its items), so a row's end is not known from
    its bytes alone: every place where the stack holds one finished item is a candidate end,
    which :func:`_learn` accepts only if rows of that length tile the whole batch.
    """

    def __init__(self, ops: bytes, start: int) -> None:
        self.ops, self.start, self.pos = ops, start, start
        self.data = np.frombuffer(ops, np.uint8)
        self.op_positions: list[int] = []
        self.op_runs: list[_Run] = []
        self.stack: list[Any] = []  # runs of numbers (a list of _Run), ("list"|"tuple", items), or _MARK

    def opcode(self) -> None:
        self.op_positions.append(self.pos - self.start)
        self.pos += 1

    def numbers(self, code: int) -> bool:
        """A run of numbers of one opcode (found at numpy speed), pushed as one stack item; a
        number that is the row itself stands alone (the next row may start with the same opcode).
        False if not even one number's payload is there (a truncated pickle)."""
        stride = _NUMBERS[code][0] + 1
        whole = (len(self.ops) - self.pos) // stride  # numbers whose payload is all there
        if whole < 1:
            return False
        count = _run_length(self.data, self.pos, stride, code, whole) if self.stack else 1
        rel = self.pos - self.start
        self.op_runs.append(_Run(rel + 1, count, stride, code))
        self.stack.append([self.op_runs[-1]])
        self.pos += count * stride
        return True

    def pop_to_mark(self) -> list[Any] | None:
        items = []
        while self.stack and self.stack[-1] is not _MARK:
            items.append(self.stack.pop())
        if not self.stack:
            return None
        self.stack.pop()
        return items[::-1]

    def pop_values(self, n: int) -> list[Any] | None:
        """The last ``n`` values (a run counts as its numbers; it is split if need be)."""
        items: list[Any] = []
        while n > 0:
            if not self.stack or self.stack[-1] is _MARK:
                return None
            top = self.stack[-1]
            if isinstance(top, list) and _total(top) > n:
                run = top[-1]
                if run.count <= n:
                    return None
                keep = _Run(run.offset, run.count - n, run.stride, run.code)
                self.stack[-1] = [*top[:-1], keep]
                items.append([_Run(run.offset + keep.count * run.stride, n, run.stride, run.code)])
                break
            items.append(self.stack.pop())
            n -= _total(top) if isinstance(top, list) else 1
        return items[::-1]

    def step(self) -> bool:
        """One opcode; False when it is not one a recognised row can hold."""
        op = self.ops[self.pos]
        if op in _NUMBERS:
            return self.numbers(op)
        self.opcode()
        items: list[Any] | None
        if op == _EMPTY_LIST[0]:
            self.stack.append(("list", []))
        elif op == _MEMOIZE[0]:
            return bool(self.stack) and isinstance(self.stack[-1], tuple)
        elif op == _MARK[0]:
            self.stack.append(_MARK)
        elif op in (_APPENDS[0], _APPEND[0]):
            items = self.pop_to_mark() if op == _APPENDS[0] else self.pop_values(1)
            if not items or not self.stack or not isinstance(self.stack[-1], tuple) or self.stack[-1][0] != "list":
                return False
            self.stack[-1][1].extend(items)
        elif op in _TUPLES or op == _TUPLE:
            items = self.pop_to_mark() if op == _TUPLE else self.pop_values(_TUPLES[op])
            if not items:
                return False
            self.stack.append(("tuple", items))
        else:
            return False
        return True

    def at_item_end(self) -> bool:
        """The stack holds one finished item and no MEMOIZE of it follows."""
        return len(self.stack) == 1 and self.stack[0] is not _MARK and self.ops[self.pos : self.pos + 1] != _MEMOIZE


def _learn(ops: bytes, start: int, single: bool) -> tuple[_Template, list[tuple[int, int]]] | None:
    """The layout of the row at ``ops[start:]`` (a number, or a list/tuple of numbers and of
    lists/tuples of one kind of number) that every row of the batch has; else None."""
    walk = _Walk(ops, start)
    end = len(ops) - 2  # the top list's last APPEND(S) and STOP
    while walk.pos < end:
        before = walk.pos
        if not walk.step() or walk.pos <= before:
            return None
        if not walk.at_item_end():
            continue
        length = walk.pos - start
        if not single and walk.pos < end and ops[walk.pos] != ops[start]:
            continue  # the next row would start with another opcode
        groups = _groups(ops, length, single)
        if groups is None:
            continue
        fields = _fields(walk.stack[0])
        if fields is None or not fields[0] or len(fields[0]) > MAX_COLUMNS:
            return None
        kinds = _kinds(walk.stack[0])
        positions = np.asarray(walk.op_positions, np.int64)
        values = walk.data[start + positions]
        starts = np.zeros(length, bool)
        starts[positions] = True
        for run in walk.op_runs:
            starts[run.offset - 1 : run.offset - 1 + run.count * run.stride : run.stride] = True
        template = _Template(length, positions, values, tuple(walk.op_runs), fields[0], fields[1], starts, kinds)
        if _matches(ops, groups, template):
            return template, groups
    return None


def _fields(row: Any) -> tuple[tuple[_Field, ...], bool] | None:
    """The row's columns and whether it is a bare number."""
    if isinstance(row, list):  # a run of numbers: the row is one number
        return ((_Field(tuple(row), False),), True) if _total(row) == 1 else None
    out: list[_Field] = []
    for item in _flatten_runs(row[1]):
        if isinstance(item, _Run):
            out.extend(
                _Field((_Run(item.offset + i * item.stride, 1, item.stride, item.code),), False)
                for i in range(item.count)
            )
            continue
        runs = _flatten_runs(item[1])
        if not runs or not all(isinstance(r, _Run) for r in runs) or len({r.code for r in runs}) != 1:
            return None  # nested deeper, empty, or floats mixed with ints: the row path decides
        out.append(_Field(tuple(runs), True))
    return tuple(out), False


def _kinds(row: Any) -> str:
    """``ColumnBatch.kinds`` of a row :func:`_fields` accepted: its container, then each column's."""
    if isinstance(row, list):
        return OTHER + OTHER
    letters = [LIST if row[0] == "list" else TUPLE]
    for item in _flatten_runs(row[1]):
        if isinstance(item, _Run):
            letters.extend(OTHER * item.count)
        else:
            letters.append(LIST if item[0] == "list" else TUPLE)
    return "".join(letters)


def _flatten_runs(items: list[Any]) -> list[Any]:
    """Items of a list/tuple with each pushed run of numbers spliced in as its runs."""
    out: list[Any] = []
    for item in items:
        if isinstance(item, list):
            out.extend(item)
        else:
            out.append(item)
    return out


def _run_length(data: np.ndarray, pos: int, stride: int, code: int, limit: int) -> int:
    """How many bytes ``stride`` apart from ``pos`` on (at most ``limit``) are ``code`` before
    the first that is not. Scanned in growing windows, so a run costs in proportion to its
    length, not to the rest of the batch (a row of many short runs would be quadratic)."""
    done, window = 0, 1024
    while done < limit:
        n = min(window, limit - done)
        first = pos + done * stride
        others = np.flatnonzero(data[first : first + n * stride : stride] != code)
        if others.size:
            return done + int(others[0])
        done += n
        window *= 8
    return limit


def _total(runs: list[_Run]) -> int:
    return sum(r.count for r in runs)
