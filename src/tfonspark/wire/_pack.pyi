"""The optional C packer of rows of Python numbers (``_pack.c``); see its header comment."""

from typing import Any

def pack_column(out: Any, rows: Any, rowtype: type | None, fields: int, field: int, width: int, code: str, /) -> bool:
    """One column of ``rows`` into ``out`` as float64 ("d") or int64 ("q"); False to fall back."""

def number_code(value: Any, /) -> str | None:
    """ "d" (float64) or "q" (int64): numpy's dtype for a flat list/tuple of numbers; None: ask numpy."""

def empty_bytearray(size: int, /) -> bytearray:
    """A bytearray of ``size`` bytes whose contents are not set (the caller overwrites them)."""

def pack_arrays(
    out: Any,
    rows: Any,
    rowtype: type | None,
    fields: int,
    field: int,
    arraytype: type,
    fmt: str,
    shape: tuple[int, ...],
    /,
) -> bool:
    """One column of ``rows`` of equal C-contiguous arrays into ``out``; False where numpy must decide."""

def fill_frame(
    rows: Any,
    rowtype: type | None,
    fields: int,
    names: list[str] | None,
    specs: tuple[tuple[Any, ...], ...],
    start: int,
    stop: int,
    size: int,
    /,
) -> tuple[int, tuple[Any] | None]:
    """Chunks of ``size`` rows pulled from the iterator ``rows``, each row packed into the specs'
    buffers as it comes, then dropped: (the row reached, (the first row it does not handle,) or None)."""
