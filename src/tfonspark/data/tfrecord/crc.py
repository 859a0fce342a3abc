"""CRC-32C (Castagnoli) and TFRecord's masked form, the checksums of TFRecord framing.

:func:`crc32c` uses ``google_crc32c``'s C extension (GB/s) when it loads, else a pure
Python/numpy fallback: a table loop for small buffers, numpy lanes folded in GF(2) for big ones.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

__all__ = ["crc32c", "masked_crc32c"]

_log = logging.getLogger(__name__)

_CRC_POLY = 0x82F63B78  # CRC-32C (Castagnoli), bit-reflected
_MASK_DELTA = 0xA282EAD8
_NUMPY_MIN_BYTES = 256 * 1024  # below this the table loop beats numpy's per-call overhead
_NUMPY_LANE = 512


def crc32c(data: bytes) -> int:
    """CRC-32C of ``data``, the checksum of TFRecord framing (hardware-accelerated if available)."""
    return _crc_backend()(bytes(data))


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC-32C: the CRC rotated right by 15 bits plus a constant.

    Masking keeps the CRC of data that itself contains CRCs from being trivially zero.
    """
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


@functools.cache
def _crc_backend() -> Callable[[bytes], int]:
    """``google_crc32c`` when its C extension loads (GB/s); otherwise our slower fallback."""
    try:
        import google_crc32c

        if getattr(google_crc32c, "implementation", "c") == "c":
            return google_crc32c.value  # type: ignore[no-any-return]
    except ImportError:
        pass
    _log.warning(
        "google-crc32c (with its C extension) is not installed: TFRecord CRCs use a pure "
        "Python/numpy fallback (10-150 MB/s). `pip install google-crc32c` for GB/s."
    )
    return _crc32c_fallback


@functools.cache
def _crc_table() -> tuple[int, ...]:
    """The 256-entry table of the byte-at-a-time reflected CRC-32C."""
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ _CRC_POLY if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


def _crc32c_fallback(data: bytes) -> int:
    """CRC-32C without the C library: numpy lanes for big buffers, a table loop for small."""
    if len(data) >= _NUMPY_MIN_BYTES:
        return _crc32c_numpy(data)
    return _crc32c_table(data)


def _crc32c_table(data: bytes) -> int:
    """Byte-at-a-time CRC-32C (about 10 MB/s)."""
    table = _crc_table()
    crc = 0xFFFFFFFF
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _crc32c_numpy(data: bytes, lane: int = _NUMPY_LANE) -> int:
    """CRC-32C of a big buffer, vectorized across lanes (100-170 MB/s).

    The CRC register update is linear over GF(2), so: invert the first 4 bytes (same as starting
    the register at 0xFFFFFFFF), pad zeros in front (no effect on a register that starts at 0),
    cut into ``k`` equal lanes, run all lanes at once, then fold neighbours pairwise: the left
    CRC is shifted over the right lane's length by a 32x32 bit matrix and XORed into the right.
    """
    import numpy as np

    size = len(data)
    if size < 4:
        return _crc32c_table(data)
    lanes = 1
    while lanes * lane < size:
        lanes *= 2
    buf = np.zeros(lanes * lane, dtype=np.uint8)
    start = lanes * lane - size
    buf[start:] = np.frombuffer(data, dtype=np.uint8)
    buf[start : start + 4] ^= 0xFF
    table = np.array(_crc_table(), dtype=np.uint32)
    rows = buf.reshape(lanes, lane)
    regs = np.zeros(lanes, dtype=np.uint32)
    eight = np.uint32(8)
    for j in range(lane):
        regs = table[(regs ^ rows[:, j]) & 0xFF] ^ (regs >> eight)
    shift = _zero_shift_matrix(lane)
    while len(regs) > 1:
        regs = _gf2_apply(shift, regs[0::2]) ^ regs[1::2]
        shift = _gf2_apply(shift, shift)  # shifting over twice the length
    return int(regs[0]) ^ 0xFFFFFFFF


@functools.cache
def _zero_shift_matrix_cached(nbytes: int) -> tuple[int, ...]:
    """Columns of the matrix that advances a CRC register over ``nbytes`` zero bytes."""
    table = _crc_table()
    columns = []
    for bit in range(32):
        reg = 1 << bit
        for _ in range(nbytes):
            reg = table[reg & 0xFF] ^ (reg >> 8)
        columns.append(reg)
    return tuple(columns)


def _zero_shift_matrix(nbytes: int) -> Any:
    """:func:`_zero_shift_matrix_cached` as a numpy uint32 vector of columns."""
    import numpy as np

    return np.array(_zero_shift_matrix_cached(nbytes), dtype=np.uint32)


def _gf2_apply(columns: Any, regs: Any) -> Any:
    """Multiply each uint32 in ``regs`` by the GF(2) matrix given by its 32 ``columns``."""
    import numpy as np

    out = np.zeros_like(regs)
    one = np.uint32(1)
    for bit in range(32):
        out ^= ((regs >> np.uint32(bit)) & one) * columns[bit]
    return out
