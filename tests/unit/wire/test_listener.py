"""The shared accept loop: floods, slow peers, accept failures, limits and closing."""

from __future__ import annotations

import contextlib
import errno
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from tests.unit.attack import rendezvous_scenario
from tests.waiting import wait_until
from tfonspark.errors import ProtocolError
from tfonspark.wire import framing as f
from tfonspark.wire.listener import Listener

SECRET = bytes(range(32))


# ---- helpers --------------------------------------------------------------------------------------


class FlakySocket(socket.socket):
    """A listening socket whose next ``fail`` accept() calls raise ``error`` (e.g. EMFILE)."""

    fail = 0
    error = errno.EMFILE

    def accept(self):  # type: ignore[override]
        if self.fail > 0:
            self.fail -= 1
            raise OSError(self.error, "injected accept failure")
        return super().accept()


def tcp_listening(cls: type[socket.socket] = socket.socket) -> socket.socket:
    sock = cls(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    return sock


class Served:
    """A handler that records each connection and echoes one frame (or blocks, or keeps it)."""

    def __init__(self, mode: str = "echo") -> None:
        self.mode = mode
        self.conns: list[f.Connection] = []
        self.returned: list[float] = []
        self.entered = threading.Event()

    def __call__(self, conn: f.Connection) -> bool:
        self.conns.append(conn)
        self.entered.set()
        try:
            if self.mode == "keep":
                return True
            conn.send(bytes(conn.recv()))  # "block": the test never sends, so this waits
            return False
        finally:
            self.returned.append(time.monotonic())


@contextlib.contextmanager
def listening(
    handler: Callable[[f.Connection], bool] | None = None, sock: socket.socket | None = None, **kwargs
) -> Iterator[Listener]:
    lis = Listener(
        sock if sock is not None else tcp_listening(), SECRET, handler if handler is not None else Served(), **kwargs
    )
    try:
        yield lis
    finally:
        lis.close()


def address(lis: Listener) -> tuple[str, int]:
    return lis._sock.getsockname()


def idle_peer(addr) -> socket.socket:
    """A connection that has been accepted (it read the server's hello) and then says nothing."""
    s = socket.create_connection(addr, timeout=5)
    assert len(f._recv_exact(s, f.SERVER_HELLO)) == f.SERVER_HELLO
    return s


def closed_by_server(s: socket.socket, within: float = 5.0) -> bool:
    s.settimeout(within)
    try:
        return s.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def echo(addr, payload: bytes = b"ping") -> bytes:
    with f.connect(addr, SECRET, timeout=5) as conn:
        conn.settimeout(5)
        conn.send(payload)
        return bytes(conn.recv())


# ---- the acceptance test: a descriptor flood ------------------------------------------------------


def test_rendezvous_keeps_registering_nodes_through_a_descriptor_flood():
    """Run the server with 64 descriptors; flood it with 200 idle and 20 slow connections."""
    result = rendezvous_scenario(nofile=64, n_idle=200, n_slow=20, timeout=10)
    print("\nflood figures:", result)
    assert result["during"]["ok"], result
    assert result["during"]["seconds"] < 2
    assert result["after"]["ok"], result
    assert result["after"]["seconds"] < 2
    assert result["server"]["accept_threads_alive"] == 2
    assert result["server"]["registered"] == [1, 1]
    assert result["attacker"]["closed_by_server"] > 0  # it really ran out of descriptors


# ---- handshakes ------------------------------------------------------------------------------------


def test_authenticated_clients_reach_the_handler():
    with listening() as lis:
        assert [echo(address(lis), f"n{i}".encode()) for i in range(5)] == [b"n0", b"n1", b"n2", b"n3", b"n4"]
        assert lis.rejected == 0


def test_wrong_secret_is_rejected_and_counted():
    with listening() as lis:
        with pytest.raises((OSError, ProtocolError)):
            f.connect(address(lis), bytes(32), timeout=5)
        assert wait_until(lambda: lis.rejected == 1, 5.0)
        assert echo(address(lis)) == b"ping"


def test_slowloris_peer_is_dropped_at_the_handshake_deadline():
    """One byte every 0.1 s: every recv is quick, the handshake as a whole is not."""
    with listening(handshake_timeout=0.6) as lis:
        s = idle_peer(address(lis))
        start = time.monotonic()
        dropped = None
        for byte in (f.MAGIC * 10)[:30]:
            try:
                s.sendall(bytes([byte]))
            except OSError:
                dropped = time.monotonic() - start
                break
            s.settimeout(0.1)
            with contextlib.suppress(TimeoutError):
                if s.recv(1) == b"":
                    dropped = time.monotonic() - start
                    break
        s.close()
        assert dropped is not None and 0.5 < dropped < 1.5, dropped
        assert lis.rejected == 1
        assert echo(address(lis)) == b"ping"


def test_unix_socket_listener_serves_unsigned_connections():
    sock = f.listen_unix("tfos-test-")
    if sock is None:
        pytest.skip("no Unix sockets here")
    path = sock.getsockname()
    try:
        with listening(sock=sock, signed=False) as lis:
            with f.connect_unix(path, SECRET, timeout=5) as conn:
                assert not conn.signed
                conn.settimeout(5)
                conn.send(b"x" * 300_000)
                assert bytes(conn.recv()) == b"x" * 300_000
            assert lis.rejected == 0
    finally:
        f.remove_unix_socket(path)


# ---- limits -----------------------------------------------------------------------------------------


def test_pending_cap_evicts_the_oldest_unauthenticated_peer():
    with listening(max_pending=3, handshake_timeout=30) as lis:
        peers = [idle_peer(address(lis)) for _ in range(3)]
        newcomer = idle_peer(address(lis))  # the 4th: the oldest goes
        try:
            assert closed_by_server(peers[0])
            assert not closed_by_server(peers[1], within=0.2)
            assert echo(address(lis)) == b"ping"  # a real client still gets through (evicting #2)
            assert closed_by_server(peers[1])
            assert not closed_by_server(peers[2], within=0.2)
            assert not closed_by_server(newcomer, within=0.1)
            assert lis.rejected == 2
        finally:
            for s in [*peers, newcomer]:
                s.close()


def test_max_connections_closes_authenticated_extras():
    handler = Served("block")
    with listening(handler, max_connections=1) as lis:
        first = f.connect(address(lis), SECRET, timeout=5)
        assert handler.entered.wait(5)
        second = f.connect(address(lis), SECRET, timeout=5)
        second.settimeout(5)
        with pytest.raises((OSError, ProtocolError)):
            second.recv()
        assert lis.dropped == 1
        first.send(b"still served")
        first.settimeout(5)
        assert bytes(first.recv()) == b"still served"
        first.close()
        second.close()
        # the slot is free again: within 30 s (5 s was short for a 2-core CI at load 6)
        assert wait_until(lambda: echo(address(lis)) == b"ping", 30.0)


# ---- accept failures --------------------------------------------------------------------------------


def test_accept_loop_survives_emfile_by_evicting_then_backing_off(caplog):
    caplog.set_level(logging.WARNING, logger="tfonspark")
    sock = tcp_listening(FlakySocket)
    with listening(sock=sock, handshake_timeout=30) as lis:
        idle = idle_peer(address(lis))
        sock.fail = 5  # type: ignore[attr-defined]
        start = time.monotonic()
        assert echo(address(lis)) == b"ping"
        elapsed = time.monotonic() - start
        assert sock.fail == 0  # type: ignore[attr-defined]
        assert closed_by_server(idle)  # evicted to free a descriptor
        idle.close()
        assert elapsed < 2, elapsed
        assert lis._thread.is_alive()
    warnings = [r for r in caplog.records if "accept() failed" in r.getMessage()]
    assert len(warnings) == 1  # rate-limited: five failures, one line


@pytest.mark.parametrize("err", [errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.ECONNABORTED, errno.EBADF])
def test_accept_loop_survives_other_accept_errors(err):
    sock = tcp_listening(FlakySocket)
    sock.error = err  # type: ignore[attr-defined]
    sock.fail = 3  # type: ignore[attr-defined]
    with listening(sock=sock) as lis:
        assert echo(address(lis)) == b"ping"
        assert lis._thread.is_alive()


def test_accept_loop_survives_a_failing_thread_start(monkeypatch):
    real_start = threading.Thread.start
    failures = [2]

    def start(self: threading.Thread) -> None:
        if self.name.endswith("-conn") and failures[0] > 0:
            failures[0] -= 1
            raise RuntimeError("can't start new thread")
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    with listening() as lis:
        for _ in range(2):
            with pytest.raises((OSError, ProtocolError)):
                echo(address(lis))
        assert echo(address(lis)) == b"ping"
        assert lis.dropped == 2 and lis._thread.is_alive()


# ---- handlers and closing ---------------------------------------------------------------------------


def test_handler_errors_close_the_connection_and_the_listener_goes_on():
    def broken(conn: f.Connection) -> bool:
        raise ValueError("handler bug")

    with listening(broken) as lis:
        with f.connect(address(lis), SECRET, timeout=5) as conn:
            conn.settimeout(5)
            with pytest.raises((OSError, ProtocolError)):
                conn.recv()
        with f.connect(address(lis), SECRET, timeout=5) as conn:  # still accepting
            assert conn is not None


def test_close_closes_connections_whose_handler_is_blocked_in_recv():
    handler = Served("block")
    lis = Listener(tcp_listening(), SECRET, handler)
    client = f.connect(address(lis), SECRET, timeout=5)
    assert handler.entered.wait(5)
    start = time.monotonic()
    lis.close()
    closed_at = time.monotonic()
    assert closed_at - start < 2.5
    assert handler.returned and handler.returned[0] - start < 2  # woken, not left blocked
    client.settimeout(5)
    with pytest.raises((OSError, ProtocolError)):
        client.recv()
    client.close()
    assert not lis._thread.is_alive()
    lis.close()  # idempotent


def test_close_closes_connections_a_handler_kept_open():
    handler = Served("keep")
    lis = Listener(tcp_listening(), SECRET, handler)
    client = f.connect(address(lis), SECRET, timeout=5)
    assert wait_until(lambda: bool(handler.returned), 5.0)
    assert not handler.conns[0].closed  # kept for later (e.g. inference results)
    lis.close()
    assert handler.conns[0].closed
    client.settimeout(5)
    with pytest.raises((OSError, ProtocolError)):
        client.recv()
    client.close()


def test_close_drops_pending_peers_and_refuses_new_ones():
    lis = Listener(tcp_listening(), SECRET, Served())
    addr = address(lis)
    peer = idle_peer(addr)
    lis.close()
    assert closed_by_server(peer)
    peer.close()
    with pytest.raises(OSError):
        f.connect(addr, SECRET, timeout=1)


def test_connection_close_is_safe_from_several_threads():
    handler = Served("keep")
    with listening(handler) as lis:
        client = f.connect(address(lis), SECRET, timeout=5)
        assert wait_until(lambda: bool(handler.conns), 5.0)
        conn = handler.conns[0]
        threads = [threading.Thread(target=conn.close) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(5)
        assert conn.closed
        conn.close()
        client.close()
