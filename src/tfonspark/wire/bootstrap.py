"""The start-up message a parent writes on its child's stdin: a JSON header and an opaque payload.

Pipes to a child we spawned are trusted (no network peer can write to them); the payload holds
the cloudpickled ``(map_fun, tf_args)`` and is only unpickled by the TF process itself.
"""

from __future__ import annotations

import json
import struct
from typing import IO, Any

from ..errors import ProtocolError

__all__ = ["STATUS_PREFIX", "read_bootstrap", "write_bootstrap"]

_LEN = struct.Struct(">Q")
#: marks the supervisor's status lines on its stdout (the node task reads them; other output is log)
STATUS_PREFIX = "TFOS-STATUS "


def write_bootstrap(stream: IO[bytes], header: dict[str, Any], payload: bytes) -> None:
    line = json.dumps(header).encode()
    stream.write(_LEN.pack(len(line)) + line + _LEN.pack(len(payload)))
    stream.write(payload)
    stream.flush()


def _read(stream: IO[bytes], size: int) -> bytes:
    data = stream.read(size)
    if data is None or len(data) != size:
        raise ProtocolError(f"bootstrap truncated: expected {size} bytes")
    return data


def read_bootstrap(stream: IO[bytes]) -> tuple[dict[str, Any], bytes]:
    (hlen,) = _LEN.unpack(_read(stream, _LEN.size))
    header = json.loads(_read(stream, hlen))
    (plen,) = _LEN.unpack(_read(stream, _LEN.size))
    return header, _read(stream, plen)
