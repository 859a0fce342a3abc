"""TFRecord framing: streams and files of length-prefixed, CRC-checked records.

Each record is ``uint64 length (LE) | uint32 masked CRC-32C of length | data | uint32 masked
CRC-32C of data``. Both CRCs are checked on read; a bad or truncated record raises
:class:`~tfonspark.errors.DataFormatError` naming the file and the byte offset where it starts.
"""

from __future__ import annotations

import posixpath
import struct
from collections.abc import Iterable, Iterator
from typing import Any

from ... import fs
from ...errors import DataFormatError
from .crc import masked_crc32c

__all__ = ["iter_file_records", "read_records", "read_tfrecord_file", "write_records", "write_tfrecord_file"]

_LENGTH = struct.Struct("<Q")
_HEADER = struct.Struct("<QI")
_U32 = struct.Struct("<I")


def write_records(stream: Any, records: Iterable[bytes]) -> int:
    """Frame and write each record to a binary ``stream``; return how many were written."""
    count = 0
    for data in records:
        length = _LENGTH.pack(len(data))
        stream.write(length + _U32.pack(masked_crc32c(length)))
        stream.write(data)
        stream.write(_U32.pack(masked_crc32c(data)))
        count += 1
    return count


def read_records(stream: Any, path: str) -> Iterator[tuple[int, bytes]]:
    """Yield ``(byte offset, data)`` per record of a binary ``stream``, checking both CRCs."""
    offset = 0
    while True:
        header = stream.read(_HEADER.size)
        if not header:
            return
        if len(header) < _HEADER.size:
            raise DataFormatError(
                f"truncated TFRecord header ({len(header)} of {_HEADER.size} bytes)",
                path=path,
                offset=offset,
            )
        length, length_crc = _HEADER.unpack(header)
        if masked_crc32c(header[:8]) != length_crc:
            raise DataFormatError(
                "corrupt TFRecord length (CRC mismatch; not a TFRecord file?)",
                path=path,
                offset=offset,
            )
        data = stream.read(length)
        footer = stream.read(_U32.size)
        if len(data) < length or len(footer) < _U32.size:
            raise DataFormatError(
                f"truncated TFRecord (header says {length} data bytes plus a 4-byte CRC, "
                f"file holds {len(data) + len(footer)})",
                path=path,
                offset=offset,
            )
        if masked_crc32c(data) != _U32.unpack(footer)[0]:
            raise DataFormatError("corrupt TFRecord data (CRC mismatch)", path=path, offset=offset)
        yield offset, data
        offset += _HEADER.size + length + _U32.size


def write_tfrecord_file(path: str, records: Iterable[bytes]) -> int:
    """Write ``records`` (bytes) as one TFRecord file at a local path or URI; return the count."""
    filesystem, fs_path = fs.filesystem(fs.qualify(path))
    filesystem.create_dir(posixpath.dirname(fs_path), recursive=True)
    with fs.open_write(filesystem, fs_path) as out:
        return write_records(out, records)


def read_tfrecord_file(path: str) -> Iterator[bytes]:
    """Yield the records of one TFRecord file (local path or URI), checking CRCs."""
    for _, data in iter_file_records(fs.qualify(path)):
        yield data


def iter_file_records(uri: str) -> Iterator[tuple[int, bytes]]:
    """``(offset, data)`` per record of the file at a qualified ``uri``."""
    filesystem, fs_path = fs.filesystem(uri)
    with fs.open_read(filesystem, fs_path) as stream:
        yield from read_records(stream, uri)
