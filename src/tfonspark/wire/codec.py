"""The batch frame: a :class:`ColumnBatch` as one frame, and back without copying.

A batch frame is ``B`` + header length (4) + JSON header + one raw buffer per column. Numeric
and boolean columns travel as raw little-endian buffers and come back as numpy views of the
received frame. Other columns (strings, mixed Python objects) are pickled; that is safe only
because every frame is authenticated before it is decoded (see :mod:`.framing`). Batches are
made from Python rows by :mod:`.packing`, from Spark's pickles by :mod:`.pickled` and from
Arrow record batches by :mod:`.arrow`.
"""

from __future__ import annotations

import json
import pickle
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ProtocolError

__all__ = ["BATCH_KIND", "LAYOUTS", "ColumnBatch", "batch_count", "decode_batch", "encode_batch"]

BATCH_KIND = b"B"
_LEN = struct.Struct(">I")
#: Row layouts: a bare value per row, a tuple/list per row, or named fields per row.
LAYOUTS = ("scalar", "tuple", "dict")


#: ``ColumnBatch.kinds`` letters: the Python container a row (first letter) or a column's values
#: (one letter per column) were fed as, so that TFoS's ``next_batch`` can give them back.
LIST, TUPLE, OTHER = "L", "T", "-"


@dataclass
class ColumnBatch:
    """``count`` rows stored as columns (axis 0 is the row).

    ``kinds`` (when known) says what Python containers the rows were fed as: the row's own
    (``L`` list, ``T`` tuple, ``-`` other) then one letter per column (a list or tuple value, or
    ``-``), e.g. ``"TL-"`` for rows ``([1.0, 2.0], 7)``. Only :meth:`rows` with ``as_fed`` reads it.
    """

    columns: list[Any]
    layout: str = "tuple"
    names: list[str] | None = None
    kinds: str | None = None

    @property
    def count(self) -> int:
        return len(self.columns[0]) if self.columns else 0

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes if isinstance(c, np.ndarray) else 64 * len(c) for c in self.columns)

    def slice(self, start: int, stop: int) -> ColumnBatch:
        return ColumnBatch([c[start:stop] for c in self.columns], self.layout, self.names, self.kinds)

    def rows(self, as_fed: bool = False) -> list[Any]:
        """Back to Python rows (only for the TFoS list-of-rows API).

        Array values come back as numpy arrays; with ``as_fed`` (TFoS's ``next_batch``), values and
        rows fed as lists or tuples come back as lists or tuples, as TFoS handed back what was fed.
        """
        kinds = self.kinds if as_fed and self.kinds and len(self.kinds) == len(self.columns) + 1 else None
        columns = [_py_values(c, kinds[j + 1] if kinds else OTHER) for j, c in enumerate(self.columns)]
        if self.layout == "scalar":
            return columns[0]
        if self.layout == "dict" and self.names is not None:
            return [dict(zip(self.names, values)) for values in zip(*columns)]
        if kinds and kinds[0] == LIST:
            return [list(values) for values in zip(*columns)]
        return list(zip(*columns))


def _py_values(col: Any, kind: str = OTHER) -> list[Any]:
    """A column as a list of per-row values: Python scalars for 1-D columns, arrays otherwise,
    nested lists (tuples at the top for ``T``) for values fed as lists or tuples."""
    if not isinstance(col, np.ndarray):
        return list(col)
    if col.ndim == 1:
        return col.tolist()  # type: ignore[no-any-return]
    if kind == LIST:
        return col.tolist()  # type: ignore[no-any-return]
    if kind == TUPLE:
        return [tuple(value) for value in col.tolist()]
    return list(col)


def _is_numeric(arr: np.ndarray) -> bool:
    return arr.dtype.kind in "biufc"


def encode_batch(batch: ColumnBatch) -> list[Any]:
    """Frame parts for ``Connection.send``: header then each column's buffer, no copies."""
    cols_meta: list[dict[str, Any]] = []
    buffers: list[Any] = []
    for col in batch.columns:
        if isinstance(col, np.ndarray) and _is_numeric(col):
            arr = np.ascontiguousarray(col)
            if arr.dtype.byteorder == ">":
                arr = arr.astype(arr.dtype.newbyteorder("<"))
            cols_meta.append({"dtype": arr.dtype.str, "shape": list(arr.shape)})
            buffers.append(memoryview(arr).cast("B") if arr.size else b"")  # type: ignore[arg-type]
        else:
            blob = pickle.dumps(list(col), protocol=pickle.HIGHEST_PROTOCOL)
            cols_meta.append({"pickle": len(blob)})
            buffers.append(blob)
    meta: dict[str, Any] = {"layout": batch.layout, "names": batch.names, "count": batch.count, "cols": cols_meta}
    if batch.kinds is not None:
        meta["kinds"] = batch.kinds
    header = json.dumps(meta).encode()
    return [BATCH_KIND + _LEN.pack(len(header)) + header, *buffers]


def batch_count(payload: memoryview) -> int:
    """The row count of a batch frame, read from its header alone (nothing is unpickled)."""
    try:
        (hlen,) = _LEN.unpack_from(payload, 1)
        header = json.loads(bytes(payload[1 + _LEN.size : 1 + _LEN.size + hlen]))
        count = header["count"] if "count" in header else decode_batch(payload).count
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ValueError(f"bad row count {count!r}")
        return count
    except (ValueError, KeyError, TypeError, struct.error) as exc:
        raise ProtocolError(f"malformed batch frame: {exc}") from None


def decode_batch(payload: memoryview) -> ColumnBatch:
    """Rebuild a batch from an authenticated frame; numeric columns are views of ``payload``."""
    if bytes(payload[:1]) != BATCH_KIND:
        raise ProtocolError(f"expected a batch frame, got payload kind {bytes(payload[:1])!r}")
    try:
        (hlen,) = _LEN.unpack_from(payload, 1)
        offset = 1 + _LEN.size + hlen
        header = json.loads(bytes(payload[1 + _LEN.size : offset]))
        columns: list[Any] = []
        for meta in header["cols"]:
            if "pickle" in meta:
                size = int(meta["pickle"])
                columns.append(pickle.loads(payload[offset : offset + size]))
            else:
                dtype = np.dtype(meta["dtype"])
                shape = tuple(int(s) for s in meta["shape"])
                if any(s < 0 for s in shape):  # a negative size would move ``offset`` backwards
                    raise ValueError(f"negative dimension in shape {shape}")
                size = int(np.prod(shape)) * dtype.itemsize
                columns.append(np.frombuffer(payload[offset : offset + size], dtype).reshape(shape))
            offset += size
        kinds = header.get("kinds")
        if kinds is not None and (not isinstance(kinds, str) or len(kinds) != len(columns) + 1):
            raise ValueError(f"bad kinds {kinds!r} for {len(columns)} columns")
        return ColumnBatch(columns, header["layout"], header["names"], kinds)
    except (ValueError, KeyError, TypeError, struct.error, pickle.UnpicklingError, EOFError) as exc:
        raise ProtocolError(f"malformed batch frame: {exc}") from None
