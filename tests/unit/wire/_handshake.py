"""The signed connections the wire's tests run over: a listener whose accepted sockets run the
server handshake, and one handshaken (server, client) pair."""

from __future__ import annotations

import socket
import threading

from tfonspark.wire import framing as f

SECRET = bytes(range(32))


class Listener:
    """A listening socket whose accepted sockets run ``server_handshake``: TCP on 127.0.0.1
    (signed frames) or, with ``unix=True``, a ``listen_unix`` socket (unsigned frames)."""

    def __init__(
        self, secret: bytes = SECRET, max_frame: int = f.DEFAULT_MAX_FRAME, timeout: float = 5.0, unix: bool = False
    ) -> None:
        self.secret, self.max_frame, self.timeout, self.unix = secret, max_frame, timeout, unix
        if unix:
            sock = f.listen_unix("tfos-feed-")
            assert sock is not None
            self.sock = sock
        else:
            self.sock = socket.socket()
            self.sock.bind(("127.0.0.1", 0))
            self.sock.listen(16)
        self.address = self.sock.getsockname()

    def accept(self) -> tuple[f.Connection | None, BaseException | None]:
        self.sock.settimeout(10)
        s, _ = self.sock.accept()
        try:
            return f.server_handshake(
                s, self.secret, timeout=self.timeout, max_frame=self.max_frame, signed=not self.unix
            ), None
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            s.close()
            return None, exc

    def connect(self, secret: bytes, max_frame: int) -> f.Connection:
        if self.unix:
            return f.connect_unix(self.address, secret, timeout=5, max_frame=max_frame)
        return f.connect(self.address, secret, timeout=5, max_frame=max_frame)

    def close(self) -> None:
        self.sock.close()
        if self.unix:  # established connections outlive the socket file
            f.remove_unix_socket(self.address)


def handshake_pair(
    server_secret: bytes = SECRET,
    client_secret: bytes = SECRET,
    max_frame: int = f.DEFAULT_MAX_FRAME,
    unix: bool = False,
):
    """(server_conn, server_exc, client_conn, client_exc) for one connection (see Listener)."""
    lis = Listener(server_secret, max_frame, unix=unix)
    out: dict = {}

    def serve() -> None:
        out["server"] = lis.accept()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    client, client_exc = None, None
    try:
        client = lis.connect(client_secret, max_frame)
    except BaseException as exc:  # noqa: BLE001
        client_exc = exc
    t.join(10)
    assert not t.is_alive(), "server handshake hung"
    lis.close()
    server, server_exc = out["server"]
    return server, server_exc, client, client_exc
