"""The optional C packer of rows of Python numbers (``_pack.c``); see its header comment."""

from typing import Any

def pack_column(out: Any, rows: Any, rowtype: type | None, fields: int, field: int, width: int, code: str, /) -> bool:
    """One column of ``rows`` into ``out`` as float64 ("d") or int64 ("q"); False to fall back."""

def number_code(value: Any, /) -> str | None:
    """ "d" (float64) or "q" (int64): numpy's dtype for a flat list/tuple of numbers; None: ask numpy."""

def empty_bytearray(size: int, /) -> bytearray:
    """A bytearray of ``size`` bytes whose contents are not set (the caller overwrites them)."""
