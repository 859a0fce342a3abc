"""Authenticated, framed connections over TCP.

Handshake (fixed sizes, nothing parsed before the peer is authenticated)::

    server -> client   MAGIC(4) VERSION(1) server_nonce(32)
    client -> server   MAGIC(4) VERSION(1) client_nonce(32) HMAC(secret, "c"+sn+cn)(32)
    server -> client   HMAC(secret, "s"+cn+sn)(32)           (mutual: the client checks it too)

Both sides then derive ``session = HMAC(secret, "k"+sn+cn)``. Every frame is::

    length(4, big endian) tag(32) payload(length)
    tag = HMAC(session, direction(1) + sequence(8) + length(4) + payload)

so a frame cannot be forged without the secret, replayed (sequence), moved to another
connection (session key) or reflected back (direction). ``length`` is checked against
``max_frame`` before anything is read.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import socket
import struct
import threading
from collections.abc import Sequence
from typing import Union

from ..errors import AuthenticationError, ProtocolError

__all__ = [
    "DEFAULT_MAX_FRAME",
    "Connection",
    "client_handshake",
    "connect",
    "new_secret",
    "server_handshake",
]

MAGIC = b"TFoS"
VERSION = 1
NONCE = 32
TAG = 32
DEFAULT_MAX_FRAME = 256 * 1024 * 1024
_SMALL_FRAME = 64 * 1024
_HEADER = struct.Struct(">I")
_SEQ = struct.Struct(">Q")

Buffer = Union[bytes, bytearray, memoryview]  # noqa: UP007 (a runtime alias on Python 3.10)


def new_secret() -> bytes:
    """A fresh random per-cluster secret."""
    return os.urandom(32)


def _mac(key: bytes, *parts: Buffer) -> bytes:
    mac = hmac.new(key, digestmod=hashlib.sha256)
    for part in parts:
        mac.update(part)
    return mac.digest()


def _recv_exact(sock: socket.socket, size: int) -> bytearray:
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionResetError(f"peer closed the connection after {got} of {size} bytes")
        got += n
    return buf


class Connection:
    """One authenticated connection; ``send``/``recv`` move whole signed frames.

    Sends are serialised by a lock so several threads may send on one connection; only one
    thread may receive.
    """

    def __init__(self, sock: socket.socket, session: bytes, is_client: bool,
                 max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.sock = sock
        self._key = session
        self._out_dir = b"c" if is_client else b"s"
        self._in_dir = b"s" if is_client else b"c"
        self._out_seq = 0
        self._in_seq = 0
        self.max_frame = max_frame
        self._send_lock = threading.Lock()

    def send(self, *parts: Buffer) -> None:
        """Send one frame whose payload is the concatenation of ``parts`` (no copy)."""
        length = sum(memoryview(p).nbytes for p in parts)
        if length > self.max_frame:
            raise ProtocolError(f"frame of {length} bytes exceeds the limit of {self.max_frame}")
        header = _HEADER.pack(length)
        with self._send_lock:
            tag = _mac(self._key, self._out_dir, _SEQ.pack(self._out_seq), header, *parts)
            self._out_seq += 1
            if length <= _SMALL_FRAME:  # one write: no small-packet delay between header and body
                self.sock.sendall(b"".join([header, tag, *parts]))
                return
            self.sock.sendall(header + tag)
            for part in parts:
                self.sock.sendall(part)

    def recv(self) -> memoryview:
        """Receive one frame and return its verified payload."""
        head = _recv_exact(self.sock, _HEADER.size + TAG)
        (length,) = _HEADER.unpack_from(head)
        if length > self.max_frame:
            raise ProtocolError(f"peer announced a frame of {length} bytes; limit is {self.max_frame}")
        payload = _recv_exact(self.sock, length) if length else bytearray()
        expected = _mac(self._key, self._in_dir, _SEQ.pack(self._in_seq), head[: _HEADER.size], payload)
        if not hmac.compare_digest(expected, bytes(head[_HEADER.size:])):
            raise AuthenticationError("frame signature invalid (forged, replayed or reordered frame)")
        self._in_seq += 1
        return memoryview(payload)

    def settimeout(self, timeout: float | None) -> None:
        self.sock.settimeout(timeout)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _no_delay(sock: socket.socket) -> None:
    """Send small control frames at once (TCP only; other socket kinds have no Nagle delay)."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def server_handshake(sock: socket.socket, secret: bytes, timeout: float = 10.0,
                     max_frame: int = DEFAULT_MAX_FRAME) -> Connection:
    """Authenticate a freshly accepted client; raise AuthenticationError if it lacks the secret."""
    _no_delay(sock)
    sock.settimeout(timeout)
    server_nonce = os.urandom(NONCE)
    sock.sendall(MAGIC + bytes([VERSION]) + server_nonce)
    hello = _recv_exact(sock, len(MAGIC) + 1 + NONCE + TAG)
    if bytes(hello[:4]) != MAGIC or hello[4] != VERSION:
        raise ProtocolError("peer is not a tfonspark client of this protocol version")
    client_nonce = bytes(hello[5 : 5 + NONCE])
    proof = bytes(hello[5 + NONCE :])
    if not hmac.compare_digest(proof, _mac(secret, b"c", server_nonce, client_nonce)):
        raise AuthenticationError("client failed the cluster-secret challenge")
    sock.sendall(_mac(secret, b"s", client_nonce, server_nonce))
    sock.settimeout(None)
    return Connection(sock, _mac(secret, b"k", server_nonce, client_nonce), False, max_frame)


def client_handshake(sock: socket.socket, secret: bytes, timeout: float = 10.0,
                     max_frame: int = DEFAULT_MAX_FRAME) -> Connection:
    """Authenticate to a server and check that the server holds the same secret."""
    sock.settimeout(timeout)
    hello = _recv_exact(sock, len(MAGIC) + 1 + NONCE)
    if bytes(hello[:4]) != MAGIC or hello[4] != VERSION:
        raise ProtocolError("peer is not a tfonspark server of this protocol version")
    server_nonce = bytes(hello[5:])
    client_nonce = os.urandom(NONCE)
    proof = _mac(secret, b"c", server_nonce, client_nonce)
    sock.sendall(MAGIC + bytes([VERSION]) + client_nonce + proof)
    answer = bytes(_recv_exact(sock, TAG))
    if not hmac.compare_digest(answer, _mac(secret, b"s", client_nonce, server_nonce)):
        raise AuthenticationError("server failed the cluster-secret challenge")
    sock.settimeout(None)
    return Connection(sock, _mac(secret, b"k", server_nonce, client_nonce), True, max_frame)


def connect(address: Sequence, secret: bytes, timeout: float = 10.0,
            max_frame: int = DEFAULT_MAX_FRAME) -> Connection:
    """Open an authenticated client connection to ``(host, port)``."""
    sock = socket.create_connection((address[0], int(address[1])), timeout=timeout)
    _no_delay(sock)
    try:
        return client_handshake(sock, secret, timeout, max_frame)
    except BaseException:
        sock.close()
        raise
