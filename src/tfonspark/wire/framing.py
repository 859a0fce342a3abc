"""Authenticated, framed connections over TCP or a same-host Unix socket.

Handshake (fixed sizes, nothing parsed before the peer is authenticated)::

    server -> client   MAGIC(4) VERSION(1) server_nonce(32)
    client -> server   MAGIC(4) VERSION(1) client_nonce(32) HMAC(secret, "c"+kind+sn+cn)(32)
    server -> client   HMAC(secret, "s"+kind+cn+sn)(32)      (mutual: the client checks it too)

where ``kind`` is ``S`` (signed frames) or ``U`` (unsigned, Unix socket only).

Both sides then derive ``session = HMAC(secret, "k"+sn+cn)``. Every frame is::

    length(4, big endian) tag(32) payload(length)
    tag = HMAC(session, direction(1) + sequence(8) + length(4) + payload)

so a frame cannot be forged without the secret, replayed (sequence), moved to another
connection (session key) or reflected back (direction). ``length`` is checked against
``max_frame`` before anything is read, and the receive buffer grows as bytes arrive (an
announced length alone allocates at most 1 MiB; on an unsigned Unix-socket connection, whose
authenticated peer alone can write the stream, the announced length is allocated at once).
``timeout`` bounds a whole handshake, not each read; :mod:`.listener` runs the server side for
many peers without a thread each.

Same-host feeds use an *unsigned* connection over a Unix socket instead: the handshake is the
same (and binds the channel kind, so a signed and an unsigned end cannot pair), then frames are
``length(4) payload``. Per-frame tags guard a stream that crosses a network, where others can
inject or alter bytes; a Unix socket's stream can only be written by the process holding the
authenticated peer's end, and lives in a directory only the cluster's user can open. Signing
would cost ~1.8 us per 3 KB row on each side, the largest single cost of a feed. On such a
connection a sender may also pass a sealed memfd (:mod:`.ring`, :meth:`Connection.offer_ring`)
and place large payloads there: the peer copies each out and frees its place, and neither
side pays the kernel's two copies through the socket.
"""

from __future__ import annotations

import array
import contextlib
import hashlib
import hmac
import os
import select
import socket
import struct
import tempfile
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, Union

from ..errors import AuthenticationError, ProtocolError
from . import ring
from .buffers import RecvBuffers, new_buffer

__all__ = [
    "CLIENT_HELLO",
    "DEFAULT_MAX_FRAME",
    "Connection",
    "SERVER_HELLO",
    "ServerHandshake",
    "client_handshake",
    "connect",
    "connect_unix",
    "listen_unix",
    "new_secret",
    "prepare_server_socket",
    "remove_unix_socket",
    "unix_send_buffer",
    "server_handshake",
]

MAGIC = b"TFoS"
VERSION = 2
NONCE = 32
TAG = 32
DEFAULT_MAX_FRAME = 256 * 1024 * 1024
_SMALL_FRAME = 64 * 1024
#: a frame buffer starts this large and doubles as bytes arrive: an announced length costs nothing
_FIRST_CHUNK = 1024 * 1024
#: what the server sends first, and what the client answers
SERVER_HELLO = len(MAGIC) + 1 + NONCE
CLIENT_HELLO = SERVER_HELLO + TAG
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


def _recv_exact(
    sock: socket.socket,
    size: int,
    into: memoryview | None = None,
    deadline: float | None = None,
    first_chunk: int = _FIRST_CHUNK,
) -> memoryview:
    """``size`` bytes from ``sock``, into ``into`` (exactly ``size`` long) or a fresh buffer.

    A fresh buffer starts at most ``first_chunk`` long and doubles as bytes arrive, so a peer
    that announces a huge frame and sends little costs little memory (each doubling zero-fills
    and copies: a 4 MB frame from a 1 MiB start writes ~4x its size). ``deadline``
    (``time.monotonic()``) bounds the whole read, not each ``recv``. Every byte of the buffer
    returned was received; a read that fails raises and the buffer is dropped.
    """
    view = into if into is not None else memoryview(new_buffer(min(size, first_chunk)))
    got = 0
    while got < size:
        if got == len(view):
            view = _grow(view, size)
        if deadline is not None:
            _time_left(sock, deadline)
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionResetError(f"peer closed the connection after {got} of {size} bytes")
        got += n
    return view


#: room for the file descriptors one ``SCM_RIGHTS`` message may carry before it is refused
_FD_SPACE = socket.CMSG_SPACE(4 * array.array("i").itemsize) if hasattr(socket, "CMSG_SPACE") else 0


def _recv_with_fds(sock: socket.socket, size: int) -> tuple[memoryview, list[int]]:
    """``size`` bytes from a Unix socket and the file descriptors passed with them."""
    view = memoryview(bytearray(size))
    got, fds = 0, list[int]()
    while got < size:
        n, ancillary, flags, _ = sock.recvmsg_into([view[got:]], _FD_SPACE)
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.extend(array.array("i", data[: len(data) - len(data) % 4]))
        if flags & getattr(socket, "MSG_CTRUNC", 0):
            _close_all(fds)
            raise ProtocolError("peer passed more file descriptors than a frame may carry")
        if n == 0:
            _close_all(fds)
            raise ConnectionResetError(f"peer closed the connection after {got} of {size} bytes")
        got += n
    return view, fds


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _grow(view: memoryview, size: int) -> memoryview:
    """A buffer twice as long as the full ``view`` (at most ``size``), holding its bytes."""
    bigger = new_buffer(min(2 * len(view), size))
    bigger[: len(view)] = view
    return memoryview(bigger)


def _time_left(sock: socket.socket, deadline: float) -> None:
    """Let the next socket call wait only until ``deadline``; TimeoutError once it has passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the handshake took too long")
    sock.settimeout(left)


def _send_by(sock: socket.socket, data: bytes, deadline: float) -> None:
    _time_left(sock, deadline)
    sock.sendall(data)


class Connection:
    """One authenticated connection; ``send``/``recv`` move whole signed frames.

    Sends are serialised by a lock so several threads may send on one connection; only one
    thread may receive.
    """

    def __init__(
        self,
        sock: socket.socket,
        session: bytes,
        is_client: bool,
        max_frame: int = DEFAULT_MAX_FRAME,
        signed: bool = True,
    ) -> None:
        self.sock = sock
        self.signed = signed
        self._key = session
        self._out_dir = b"c" if is_client else b"s"
        self._in_dir = b"s" if is_client else b"c"
        self._out_seq = 0
        self._in_seq = 0
        self.max_frame = max_frame
        self._send_lock = threading.Lock()
        self.buffers: RecvBuffers | None = None  # where large payloads are received, if set
        self._closed = False
        self._close_lock = threading.Lock()
        self._ring: ring.SendRing | None = None  # large payloads go through shared memory (unsigned)
        self._peer_ring: ring.RecvRing | None = None  # the peer's ring, once offered
        self._inbox: deque[memoryview] = deque()  # payloads read while waiting for ring space

    def offer_ring(self) -> bool:
        """Send large payloads through shared memory from now on (:mod:`.ring`): on an unsigned
        (same-host) connection whose sends and receives come from one thread, where sealed
        memfds exist. True if it does."""
        if self.signed or self._ring is not None:
            return False
        shared = ring.take_send_ring()
        if shared is None:
            return False
        fds = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [shared.fd]))]
        with self._send_lock:
            data = ring.control(b"O", shared.capacity, shared.ident)
            sent = self.sock.sendmsg([data], fds)
            if sent < len(data):
                self.sock.sendall(data[sent:])
            self._ring = shared
        return True

    def send(self, *parts: Buffer) -> None:
        """Send one frame whose payload is the concatenation of ``parts`` (no copy)."""
        length = sum(memoryview(p).nbytes for p in parts)
        if length > self.max_frame:
            raise ProtocolError(f"frame of {length} bytes exceeds the limit of {self.max_frame}")
        if self._ring is not None and ring.MIN_PAYLOAD <= length <= self._ring.capacity:
            self._send_shared(parts, length)
            return
        header = _HEADER.pack(length)
        with self._send_lock:
            if self.signed:
                header += _mac(self._key, self._out_dir, _SEQ.pack(self._out_seq), header, *parts)
                self._out_seq += 1
            if length <= _SMALL_FRAME:  # one write: no small-packet delay between header and body
                self.sock.sendall(b"".join([header, *parts]))
                return
            self.sock.sendall(header)
            for part in parts:
                self.sock.sendall(part)

    def _send_shared(self, parts: Sequence[Buffer], length: int) -> None:
        """One payload through the ring, once the peer has freed its place; only its place
        goes over the socket. Frames that arrive meanwhile wait for :meth:`recv`."""
        shared = self._ring
        assert shared is not None
        with self._send_lock:
            position, end = shared.place(length)
            while not shared.fits(end):  # the peer frees places as it reads; socket timeout applies
                self._receive_aside()
            shared.write(position, [memoryview(p) for p in parts], end)
            self.sock.sendall(ring.control(b"F", position, length))

    def poll(self) -> bool:
        """Whether a payload has arrived, without waiting for one (ring frames are handled)."""
        while not self._inbox and select.select([self.sock], [], [], 0)[0]:
            self._receive_aside()
        return bool(self._inbox)

    def _receive_aside(self) -> None:
        """Read one frame nobody asked for yet: a ring frame is handled, a payload kept for :meth:`recv`."""
        payload = self._recv_frame()
        if payload is not None:
            self._inbox.append(payload)

    def recv(self) -> memoryview:
        """Receive one frame and return its verified payload."""
        if self._inbox:
            return self._inbox.popleft()
        while True:
            payload = self._recv_frame()
            if payload is not None:
                return payload

    def _recv_frame(self) -> memoryview | None:
        """One frame's payload, or None for a ring frame, handled here."""
        if self.signed:
            head = _recv_exact(self.sock, _HEADER.size + TAG)
            fds: list[int] = []
        else:
            head, fds = _recv_with_fds(self.sock, _HEADER.size)
        (length,) = _HEADER.unpack_from(head)
        if length & ring.FLAG and not self.signed:
            return self._ring_frame(length & ~ring.FLAG, fds)
        _close_all(fds)
        if fds:
            raise ProtocolError("peer passed file descriptors with a data frame")
        if length > self.max_frame:
            raise ProtocolError(f"peer announced a frame of {length} bytes; limit is {self.max_frame}")
        pool = self.buffers
        into = pool.reuse(length) if pool is not None else None
        # unsigned: a Unix socket only the authenticated peer writes, so its announced length is
        # what it sends; allocated at once, not grown by doubling (copies of a frame it has sent)
        payload = _recv_exact(self.sock, length, into, first_chunk=_FIRST_CHUNK if self.signed else length)
        if pool is not None and into is None:
            pool.adopt(payload.obj)  # type: ignore[arg-type]
        if not self.signed:
            return payload
        expected = _mac(self._key, self._in_dir, _SEQ.pack(self._in_seq), head[: _HEADER.size], payload)
        if not hmac.compare_digest(expected, bytes(head[_HEADER.size :])):
            raise AuthenticationError("frame signature invalid (forged, replayed or reordered frame)")
        self._in_seq += 1
        return payload

    def _ring_frame(self, size: int, fds: list[int]) -> memoryview | None:
        """A ring control frame (see :mod:`.ring`): the payload it places, or None."""
        try:
            if size != ring.BODY.size:
                raise ProtocolError(f"ring frame of {size} bytes")
            kind, first, second = ring.BODY.unpack(_recv_exact(self.sock, size))
            if kind == b"O" and len(fds) == 1 and self._peer_ring is None:
                self._peer_ring = ring.RecvRing(fds.pop(), first, second)
                return None
            if fds:
                raise ProtocolError(f"peer passed file descriptors with a ring frame {kind!r}")
            if kind == b"R" and self._ring is not None:
                self._ring.free(first)
                return None
            if kind == b"F" and self._peer_ring is not None:
                return self._copy_out(self._peer_ring, first, second)
            raise ProtocolError(f"unexpected ring frame {kind!r}")
        finally:
            _close_all(fds)

    def _copy_out(self, shared: ring.RecvRing, position: int, length: int) -> memoryview:
        """A payload from the peer's ring, into a buffer as :meth:`recv` would fill; its place freed."""
        if length > self.max_frame:
            raise ProtocolError(f"peer announced a frame of {length} bytes; limit is {self.max_frame}")
        shared.check(position, length)  # before any memory is allocated for it
        payload = self.buffers.take(length) if self.buffers is not None else memoryview(new_buffer(length))
        end = shared.read(position, length, payload)
        with self._send_lock:
            self.sock.sendall(ring.control(b"R", end))
        return payload

    def settimeout(self, timeout: float | None) -> None:
        """Bound each later ``send``/``recv`` to ``timeout`` seconds (None: wait forever).

        A read past it raises ``TimeoutError``; if part of a frame had arrived the stream is out
        of step, so the caller closes the connection.
        """
        self.sock.settimeout(timeout)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Wake any thread blocked on this connection and release it; safe to repeat, from any thread."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        if self._ring is not None:
            ring.return_send_ring(self._ring)  # kept for this process's next connection if idle
        if self._peer_ring is not None:
            self._peer_ring.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _no_delay(sock: socket.socket) -> None:
    """Send small control frames at once (TCP only; other socket kinds have no Nagle delay)."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _kind(signed: bool) -> bytes:
    """The channel kind both ends must agree on (part of every handshake proof)."""
    return b"S" if signed else b"U"


def _client_proof(secret: bytes, kind: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return _mac(secret, b"c", kind, server_nonce, client_nonce)


def _server_proof(secret: bytes, kind: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return _mac(secret, b"s", kind, client_nonce, server_nonce)


def _session_key(secret: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return _mac(secret, b"k", server_nonce, client_nonce)


def prepare_server_socket(sock: socket.socket, signed: bool) -> None:
    """Socket options for an accepted connection (no Nagle delay; a Unix socket's send buffer)."""
    _no_delay(sock)
    if not signed:
        unix_send_buffer(sock)  # results flow back on it (inference)


class ServerHandshake:
    """The server's side of the handshake as pure steps, for blocking and event-driven servers.

    Send :attr:`hello`, read :data:`CLIENT_HELLO` bytes, send what :meth:`answer` returns,
    then :meth:`connection` wraps the socket.
    """

    def __init__(self, secret: bytes, signed: bool = True) -> None:
        self.signed = signed
        self._secret = secret
        self._nonce = os.urandom(NONCE)
        self._session = b""
        self.hello = MAGIC + bytes([VERSION]) + self._nonce

    def answer(self, client_hello: Buffer) -> bytes:
        """Check the client's hello; the server's proof to send back. Raises if it fails."""
        hello = bytes(client_hello)
        if len(hello) != CLIENT_HELLO or hello[:4] != MAGIC or hello[4] != VERSION:
            raise ProtocolError("peer is not a tfonspark client of this protocol version")
        client_nonce, proof = hello[5 : 5 + NONCE], hello[5 + NONCE :]
        kind = _kind(self.signed)
        if not hmac.compare_digest(proof, _client_proof(self._secret, kind, self._nonce, client_nonce)):
            raise AuthenticationError("client failed the cluster-secret challenge")
        self._session = _session_key(self._secret, self._nonce, client_nonce)
        return _server_proof(self._secret, kind, self._nonce, client_nonce)

    def connection(self, sock: socket.socket, max_frame: int = DEFAULT_MAX_FRAME) -> Connection:
        """The authenticated connection (after :meth:`answer` succeeded and its proof was sent)."""
        if not self._session:
            raise AuthenticationError("the client has not been authenticated")
        return Connection(sock, self._session, False, max_frame, self.signed)


def server_handshake(
    sock: socket.socket, secret: bytes, timeout: float = 10.0, max_frame: int = DEFAULT_MAX_FRAME, signed: bool = True
) -> Connection:
    """Authenticate a freshly accepted client; raise AuthenticationError if it lacks the secret.

    ``timeout`` bounds the whole handshake. ``signed=False`` only for a Unix socket (see the
    module docstring).
    """
    deadline = time.monotonic() + timeout
    prepare_server_socket(sock, signed)
    handshake = ServerHandshake(secret, signed)
    _send_by(sock, handshake.hello, deadline)
    proof = handshake.answer(_recv_exact(sock, CLIENT_HELLO, deadline=deadline))
    _send_by(sock, proof, deadline)
    sock.settimeout(None)
    return handshake.connection(sock, max_frame)


def client_handshake(
    sock: socket.socket, secret: bytes, timeout: float = 10.0, max_frame: int = DEFAULT_MAX_FRAME, signed: bool = True
) -> Connection:
    """Authenticate to a server and check that the server holds the same secret.

    ``timeout`` bounds the whole handshake.
    """
    deadline = time.monotonic() + timeout
    hello = _recv_exact(sock, SERVER_HELLO, deadline=deadline)
    if bytes(hello[:4]) != MAGIC or hello[4] != VERSION:
        raise ProtocolError("peer is not a tfonspark server of this protocol version")
    server_nonce = bytes(hello[5:])
    client_nonce = os.urandom(NONCE)
    kind = _kind(signed)
    proof = _client_proof(secret, kind, server_nonce, client_nonce)
    _send_by(sock, MAGIC + bytes([VERSION]) + client_nonce + proof, deadline)
    answer = bytes(_recv_exact(sock, TAG, deadline=deadline))
    if not hmac.compare_digest(answer, _server_proof(secret, kind, server_nonce, client_nonce)):
        raise AuthenticationError("server failed the cluster-secret challenge")
    sock.settimeout(None)
    return Connection(sock, _session_key(secret, server_nonce, client_nonce), True, max_frame, signed)


def connect(
    address: Sequence[Any], secret: bytes, timeout: float = 10.0, max_frame: int = DEFAULT_MAX_FRAME
) -> Connection:
    """Open an authenticated client connection to ``(host, port)``."""
    sock = socket.create_connection((address[0], int(address[1])), timeout=timeout)
    _no_delay(sock)
    try:
        return client_handshake(sock, secret, timeout, max_frame)
    except BaseException:
        sock.close()
        raise


def connect_unix(path: str, secret: bytes, timeout: float = 10.0, max_frame: int = DEFAULT_MAX_FRAME) -> Connection:
    """Open an authenticated, unsigned connection to a same-host server's Unix socket."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix_send_buffer(sock)
    try:
        sock.settimeout(timeout)
        sock.connect(path)
        return client_handshake(sock, secret, timeout, max_frame, signed=False)
    except BaseException:
        sock.close()
        raise


#: a whole batch frame fits in flight, so sender and receiver do not wake each other per 200 KB
_UNIX_SEND_BUFFER = 4 * 1024 * 1024


def unix_send_buffer(sock: socket.socket) -> None:
    """Ask for a send buffer that holds a batch frame (the kernel caps it at net.core.wmem_max)."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _UNIX_SEND_BUFFER)


#: AF_UNIX paths are limited to ~104-108 bytes; a longer temp dir means TCP only
_MAX_UNIX_PATH = 100
_UNIX_NAME = "feed.sock"


def listen_unix(prefix: str) -> socket.socket | None:
    """A listening Unix socket in a fresh 0700 directory, or None where none can be had."""
    if not hasattr(socket, "AF_UNIX"):
        return None
    try:
        directory = tempfile.mkdtemp(prefix=prefix)  # mode 0700: only this user can connect
    except OSError:  # no writable temp dir: feeds use TCP
        return None
    path = os.path.join(directory, _UNIX_NAME)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if len(path) > _MAX_UNIX_PATH:
            raise OSError(f"socket path {path!r} is longer than {_MAX_UNIX_PATH} bytes")
        sock.bind(path)
        sock.listen(256)
    except OSError:
        sock.close()
        remove_unix_socket(path)
        return None
    return sock


def remove_unix_socket(path: str) -> None:
    """Remove a socket made by :func:`listen_unix` and its directory (even after its owner died)."""
    if not path or os.path.basename(path) != _UNIX_NAME:
        return
    with contextlib.suppress(OSError):
        os.unlink(path)
    with contextlib.suppress(OSError):
        os.rmdir(os.path.dirname(path))
