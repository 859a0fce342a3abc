"""Column batches of one layout joined into one, large numpy columns into reused memory.

``DataFeed`` joins the pieces of a read that spans received frames; the results held for one
frame (:mod:`.feedresults`) are joined to travel back as one frame. A pool (:class:`RecvBuffers`)
holds the large joins: a fresh multi-MB array is page-faulted in at every read.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import InputError
from ..wire.buffers import RecvBuffers
from ..wire.codec import ColumnBatch

__all__ = ["concat"]


def concat(parts: list[ColumnBatch], pool: RecvBuffers | None = None) -> ColumnBatch:
    """``parts`` as one batch; large numpy columns go into ``pool``'s reused memory."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    columns: list[Any] = []
    for j, col in enumerate(first.columns):
        pieces = [p.columns[j] for p in parts]
        if isinstance(col, np.ndarray) and all(isinstance(p, np.ndarray) for p in pieces):
            try:
                columns.append(_joined(pieces, pool))
                continue
            except ValueError:
                raise InputError(
                    f"batches disagree on the shape of column {j}: {[p.shape[1:] for p in pieces]}", column=j
                ) from None
        columns.append([v for p in pieces for v in p])
    return ColumnBatch(columns, first.layout, first.names, first.kinds)


def _joined(pieces: list[np.ndarray], pool: RecvBuffers | None) -> np.ndarray:
    """``np.concatenate(pieces)``, written into a buffer of ``pool`` when it is large enough."""
    rest = pieces[0].shape[1:]
    dtype = np.result_type(*pieces)
    count = sum(len(p) for p in pieces)
    nbytes = count * dtype.itemsize * math.prod(rest)
    if pool is None or dtype.hasobject or nbytes < pool.MIN_SIZE or any(p.shape[1:] != rest for p in pieces):
        return np.concatenate(pieces)  # a shape mismatch raises ValueError here, as before
    out = np.frombuffer(pool.take(nbytes), dtype=dtype).reshape(count, *rest)
    np.concatenate(pieces, out=out)
    return out
