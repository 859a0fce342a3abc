"""wire/framing.py: the HMAC mutual-auth handshake, signed and sequenced frames, unix sockets, deadlines."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import socket
import struct
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.unit.wire._handshake import SECRET, Listener, handshake_pair
from tfonspark.errors import AuthenticationError, ProtocolError
from tfonspark.wire import framing as f

OTHER = bytes(range(1, 33))


# ---- helpers --------------------------------------------------------------------------------


class _Recorder:
    """Stands in for a socket while a frame is built, so tests can put raw bytes on the wire."""

    def __init__(self) -> None:
        self.data = bytearray()

    def sendall(self, data) -> None:
        self.data += bytes(data)


def frame_bytes(conn: f.Connection, *parts) -> bytes:
    """The exact bytes ``conn.send(*parts)`` would write (the connection's sequence advances)."""
    real, rec = conn.sock, _Recorder()
    conn.sock = rec
    try:
        conn.send(*parts)
    finally:
        conn.sock = real
    return bytes(rec.data)


# ---- handshake --------------------------------------------------------------------------------


def test_handshake_with_the_right_secret_gives_a_working_connection(pair):
    server, client = pair
    client.send(b"hello")
    assert bytes(server.recv()) == b"hello"
    server.send(b"world", b"!")
    assert bytes(client.recv()) == b"world!"
    # both directions keep working over many frames (sequence numbers advance in step)
    for i in range(10):
        client.send(str(i).encode())
        server.send(bytes(server.recv()) + b"-ack")
        assert bytes(client.recv()) == f"{i}-ack".encode()


def test_new_secret_is_random_and_long_enough():
    a, b = f.new_secret(), f.new_secret()
    assert len(a) == 32 and a != b


def test_client_with_wrong_secret_is_rejected_by_the_server():
    server, s_exc, client, c_exc = handshake_pair(server_secret=SECRET, client_secret=OTHER)
    assert server is None and isinstance(s_exc, AuthenticationError)
    # the server drops the connection without proving anything; the client fails too
    assert client is None and isinstance(c_exc, (OSError, ProtocolError))


def test_server_with_wrong_secret_fails_too():
    server, s_exc, client, c_exc = handshake_pair(server_secret=OTHER, client_secret=SECRET)
    assert server is None and isinstance(s_exc, AuthenticationError)
    assert client is None and c_exc is not None


def test_client_checks_the_server_proof():
    """An impostor server that accepts any client but cannot prove the secret is detected."""
    lis = socket.socket()
    lis.bind(("127.0.0.1", 0))
    lis.listen(1)

    def impostor() -> None:
        s, _ = lis.accept()
        with s:
            s.sendall(f.MAGIC + bytes([f.VERSION]) + os.urandom(f.NONCE))
            f._recv_exact(s, len(f.MAGIC) + 1 + f.NONCE + f.TAG)
            s.sendall(os.urandom(f.TAG))  # a made-up server proof
            with contextlib.suppress(OSError):
                s.recv(1)

    t = threading.Thread(target=impostor, daemon=True)
    t.start()
    with pytest.raises(AuthenticationError, match="server failed"):
        f.connect(lis.getsockname(), SECRET, timeout=5)
    t.join(5)
    lis.close()


def test_client_rejects_a_server_of_another_protocol():
    lis = socket.socket()
    lis.bind(("127.0.0.1", 0))
    lis.listen(1)

    def other_server() -> None:
        s, _ = lis.accept()
        with s:
            s.sendall(b"HTTP/1.1 200 OK\r\n" + b"x" * 64)
            with contextlib.suppress(OSError):
                s.recv(1)

    t = threading.Thread(target=other_server, daemon=True)
    t.start()
    with pytest.raises(ProtocolError, match="not a tfonspark server"):
        f.connect(lis.getsockname(), SECRET, timeout=5)
    t.join(5)
    lis.close()


@pytest.mark.parametrize(
    "hello",
    [
        b"GET / HTTP/1.1\r\n" + b"x" * 80,  # another protocol
        b"TFoS" + bytes([f.VERSION + 1]) + b"\0" * 64,  # another version
    ],
)
def test_server_rejects_foreign_hellos(hello):
    lis = Listener()
    with socket.create_connection(lis.address, timeout=5) as s:
        s.sendall(hello)
        conn, exc = lis.accept()
    lis.close()
    assert conn is None and isinstance(exc, ProtocolError)


def test_server_handshake_times_out_on_a_silent_peer():
    lis = Listener(timeout=0.3)
    with socket.create_connection(lis.address, timeout=5):
        start = time.monotonic()
        conn, exc = lis.accept()
        elapsed = time.monotonic() - start
    lis.close()
    assert conn is None and isinstance(exc, TimeoutError)
    assert elapsed < 3


def test_replayed_handshake_fails_because_the_server_nonce_is_fresh():
    """Bytes recorded from a successful client handshake do not authenticate a new connection."""
    lis = Listener()
    recorded = bytearray()

    t = threading.Thread(target=lambda: lis.accept()[0].close(), daemon=True)
    t.start()
    sock = socket.create_connection(lis.address, timeout=5)
    orig_sendall = sock.sendall

    class Tap:  # records what the real client sends
        def __getattr__(self, name):
            return getattr(sock, name)

        def sendall(self, data):
            recorded.extend(data)
            return orig_sendall(data)

    conn = f.client_handshake(Tap(), SECRET, timeout=5)  # type: ignore[arg-type]
    t.join(5)
    conn.close()
    assert len(recorded) == len(f.MAGIC) + 1 + f.NONCE + f.TAG

    with socket.create_connection(lis.address, timeout=5) as s:
        s.sendall(bytes(recorded))
        conn2, exc = lis.accept()
    lis.close()
    assert conn2 is None and isinstance(exc, AuthenticationError)


# ---- frames -----------------------------------------------------------------------------------


def test_frame_tampered_in_flight_is_rejected(pair):
    server, client = pair
    raw = bytearray(frame_bytes(client, b"transfer 10 to alice"))
    raw[-5] ^= 0x01  # flip one payload bit
    client.sock.sendall(raw)
    with pytest.raises(AuthenticationError):
        server.recv()


def test_frame_with_a_tampered_tag_is_rejected(pair):
    server, client = pair
    raw = bytearray(frame_bytes(client, b"payload"))
    raw[4] ^= 0x80
    client.sock.sendall(raw)
    with pytest.raises(AuthenticationError):
        server.recv()


def test_frame_with_a_tampered_length_is_rejected(pair):
    server, client = pair
    raw = bytearray(frame_bytes(client, b"0123456789"))
    raw[3] -= 2  # claims 8 bytes: the last two become the start of the next frame
    client.sock.sendall(raw)
    with pytest.raises(AuthenticationError):
        server.recv()


def test_replayed_frame_is_rejected(pair):
    server, client = pair
    raw = frame_bytes(client, b"do it once")
    client.sock.sendall(raw)
    assert bytes(server.recv()) == b"do it once"
    client.sock.sendall(raw)  # the same frame again on the wire
    with pytest.raises(AuthenticationError, match="replayed"):
        server.recv()


def test_reordered_frames_are_rejected(pair):
    server, client = pair
    first = frame_bytes(client, b"first")
    second = frame_bytes(client, b"second")
    client.sock.sendall(second + first)
    with pytest.raises(AuthenticationError):
        server.recv()


def test_frame_from_another_connection_is_rejected():
    s1, _, c1, _ = handshake_pair()
    s2, _, c2, _ = handshake_pair()
    try:
        raw = frame_bytes(c1, b"meant for connection 1")  # sequence 0, like c2's next frame
        c2.sock.sendall(raw)
        s2.settimeout(5)
        with pytest.raises(AuthenticationError):
            s2.recv()
        # while the same bytes are fine where they belong
        c1.sock.sendall(raw)
        s1.settimeout(5)
        assert bytes(s1.recv()) == b"meant for connection 1"
    finally:
        for c in (s1, c1, s2, c2):
            c.close()


def test_reflected_frame_is_rejected(pair):
    """A frame the server sent, bounced back to it, fails (direction is signed)."""
    server, client = pair
    raw = frame_bytes(server, b"from the server")  # server's sequence 0 == client's sequence 0
    client.sock.sendall(raw)
    with pytest.raises(AuthenticationError):
        server.recv()


def test_reflected_frame_is_rejected_by_the_client_too(pair):
    server, client = pair
    raw = frame_bytes(client, b"from the client")
    server.sock.sendall(raw)
    with pytest.raises(AuthenticationError):
        client.recv()


@pytest.mark.parametrize("keep", [2, f._HEADER.size + 10, f._HEADER.size + f.TAG + 3])
def test_truncated_frame_is_rejected(pair, keep):
    server, client = pair
    raw = frame_bytes(client, b"a payload of some length")
    client.sock.sendall(raw[:keep])
    client.sock.shutdown(socket.SHUT_WR)
    with pytest.raises(ConnectionResetError, match="peer closed"):
        server.recv()


def test_truncated_frame_without_close_times_out(pair):
    server, client = pair
    raw = frame_bytes(client, b"a payload of some length")
    client.sock.sendall(raw[:-3])
    server.settimeout(0.2)
    with pytest.raises(TimeoutError):
        server.recv()


def test_oversized_length_is_rejected_before_reading_the_payload():
    server, _, client, _ = handshake_pair(max_frame=1024)
    try:
        server.settimeout(5)
        # announce 4 GiB - 1, send no payload: the limit must trip at once, not after a read
        client.sock.sendall(struct.pack(">I", 0xFFFFFFFF) + os.urandom(f.TAG))
        start = time.monotonic()
        with pytest.raises(ProtocolError, match="limit"):
            server.recv()
        assert time.monotonic() - start < 2
    finally:
        server.close()
        client.close()


def test_sender_refuses_frames_over_the_limit():
    server, _, client, _ = handshake_pair(max_frame=1024)
    try:
        with pytest.raises(ProtocolError, match="exceeds"):
            client.send(b"x" * 1000, b"y" * 25)
        client.send(b"x" * 1024)  # exactly the limit is fine, and the sequence did not advance
        server.settimeout(5)
        assert len(server.recv()) == 1024
    finally:
        server.close()
        client.close()


def test_send_accepts_several_buffer_kinds(pair):
    server, client = pair
    arr = np.arange(10, dtype=np.float64)
    client.send(b"ab", bytearray(b"cd"), memoryview(arr).cast("B"), b"")
    got = bytes(server.recv())
    assert got[:4] == b"abcd" and np.array_equal(np.frombuffer(got[4:], np.float64), arr)
    client.send()  # an empty frame
    assert bytes(server.recv()) == b""


def test_concurrent_senders_on_one_connection(pair):
    server, client = pair
    n_threads, per_thread = 8, 50

    def sender(k: int) -> None:
        for i in range(per_thread):
            client.send(f"{k}:{i}".encode(), b"." * (i * 7))

    threads = [threading.Thread(target=sender, args=(k,)) for k in range(n_threads)]
    for t in threads:
        t.start()
    got = [bytes(server.recv()).split(b".")[0].decode() for _ in range(n_threads * per_thread)]
    for t in threads:
        t.join(10)
    assert sorted(got) == sorted(f"{k}:{i}" for k in range(n_threads) for i in range(per_thread))
    for k in range(n_threads):  # each thread's frames arrive in its order
        mine = [int(x.split(":")[1]) for x in got if x.startswith(f"{k}:")]
        assert mine == list(range(per_thread))


def test_hmac_is_what_the_docstring_says(pair):
    """Pin the frame layout: length(4) tag(32) payload, tag over direction+seq+length+payload."""
    server, client = pair
    raw = frame_bytes(client, b"pin")
    length, tag, payload = raw[:4], raw[4:36], raw[36:]
    assert struct.unpack(">I", length) == (3,) and payload == b"pin"
    expected = hmac.new(client._key, b"c" + struct.pack(">Q", 0) + length + payload, hashlib.sha256)
    assert tag == expected.digest()


# ---- same-host Unix socket: handshake, then unsigned frames --------------------------------------


def test_unix_connection_carries_frames_both_ways_without_tags():
    server, s_exc, client, c_exc = handshake_pair(unix=True)
    try:
        assert s_exc is None and c_exc is None
        assert not server.signed and not client.signed
        assert frame_bytes(client, b"pin") == struct.pack(">I", 3) + b"pin"  # length + payload only
        client.send(b"hello", memoryview(b" world"))
        assert bytes(server.recv()) == b"hello world"
        server.send(b"x" * 200_000)  # larger than the one-write limit
        assert bytes(client.recv()) == b"x" * 200_000
    finally:
        for conn in (server, client):
            if conn is not None:
                conn.close()


def test_unix_connections_ask_for_a_send_buffer_that_holds_a_batch():
    server, _, client, _ = handshake_pair(unix=True)
    try:
        try:
            cap = int(Path("/proc/sys/net/core/wmem_max").read_text())
        except OSError:
            pytest.skip("no /proc/sys/net/core/wmem_max to compare with")
        want = min(f._UNIX_SEND_BUFFER, cap)
        for conn in (client, server):  # both ends send: batches one way, inference results back
            assert conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) >= want  # Linux doubles it
    finally:
        server.close()
        client.close()


def test_unix_client_with_the_wrong_secret_is_rejected():
    server, s_exc, client, c_exc = handshake_pair(client_secret=OTHER, unix=True)
    assert server is None and isinstance(s_exc, AuthenticationError)
    assert client is None and c_exc is not None


@pytest.mark.parametrize("server_signed", [True, False])
def test_signed_and_unsigned_ends_never_pair(server_signed):
    """The channel kind is part of the handshake proof: no end can misread the other's frames."""
    a, b = socket.socketpair()
    out: dict = {}

    def serve() -> None:
        try:
            out["server"] = f.server_handshake(a, SECRET, timeout=5, signed=server_signed)
        except BaseException as exc:  # noqa: BLE001
            out["server"] = exc

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    with pytest.raises((AuthenticationError, ConnectionError, OSError)):
        f.client_handshake(b, SECRET, timeout=5, signed=not server_signed)
    b.close()
    t.join(10)
    a.close()
    assert isinstance(out["server"], (AuthenticationError, ConnectionError, OSError))


def test_unix_socket_lives_in_a_private_directory_and_is_removed():
    lis = f.listen_unix("tfos-feed-")
    assert lis is not None
    path = lis.getsockname()
    directory = os.path.dirname(path)
    assert os.stat(directory).st_mode & 0o777 == 0o700
    lis.close()
    f.remove_unix_socket(path)
    assert not os.path.exists(directory)


def test_listen_unix_without_a_writable_temp_dir_means_tcp_only(monkeypatch, tmp_path):
    monkeypatch.setattr(f.tempfile, "tempdir", str(tmp_path / "missing"))
    assert f.listen_unix("tfos-feed-") is None


def test_remove_unix_socket_touches_nothing_it_did_not_make(tmp_path):
    other = tmp_path / "data.txt"
    other.write_text("keep")
    f.remove_unix_socket(str(other))
    f.remove_unix_socket("")
    assert other.read_text() == "keep"


def test_listen_unix_declines_paths_longer_than_the_platform_allows(monkeypatch, tmp_path):
    deep = tmp_path / ("d" * 120)
    deep.mkdir()
    monkeypatch.setattr(f.tempfile, "tempdir", str(deep))
    assert f.listen_unix("tfos-feed-") is None
    assert list(deep.iterdir()) == []  # nothing left behind


# ---- messages ---------------------------------------------------------------------------------


# ---- bootstrap ----------------------------------------------------------------------------------


# ---- reused receive buffers ------------------------------------------------------------------------


# ---- hostile lengths and slow peers ---------------------------------------------------------------


def test_an_announced_huge_frame_allocates_as_bytes_arrive(pair):
    """Announcing 200 MiB and sending 10 bytes must not make the receiver allocate 200 MiB."""
    import tracemalloc

    server, client = pair
    client.sock.sendall(struct.pack(">I", 200 * 1024 * 1024) + os.urandom(f.TAG) + b"0123456789")
    client.sock.shutdown(socket.SHUT_WR)
    tracemalloc.start()
    try:
        with pytest.raises(ConnectionResetError, match="peer closed"):
            server.recv()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * 1024 * 1024, peak


@pytest.mark.parametrize("size", [0, 1, f._FIRST_CHUNK, f._FIRST_CHUNK + 1, 3 * f._FIRST_CHUNK + 12345])
def test_frames_of_any_size_arrive_intact(pair, size):
    server, client = pair
    data = os.urandom(size)
    sender = threading.Thread(target=client.send, args=(data,))
    sender.start()
    got = server.recv()
    sender.join(5)
    assert len(got) == size and bytes(got) == data


@pytest.fixture
def unix_pair():
    server, s_exc, client, c_exc = handshake_pair(unix=True)
    assert s_exc is None and c_exc is None and not server.signed
    server.settimeout(5)
    client.settimeout(5)
    yield server, client
    server.close()
    client.close()


@pytest.mark.parametrize("size", [0, 1, f._FIRST_CHUNK + 1, 3 * f._FIRST_CHUNK + 12345])
def test_unsigned_frames_arrive_intact_in_one_buffer_of_their_size(unix_pair, size):
    """On a Unix socket the authenticated peer's announced length is allocated at once: no
    doubling from 1 MiB, whose zero-fills and copies wrote ~4x a 4 MB frame."""
    import tracemalloc

    server, client = unix_pair
    data = os.urandom(size)
    sender = threading.Thread(target=client.send, args=(data,))
    tracemalloc.start()
    try:
        sender.start()
        got = server.recv()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        sender.join(5)
    assert len(got) == size and bytes(got) == data
    assert len(got.obj) == size  # type: ignore[arg-type]
    if size > f._FIRST_CHUNK:
        assert peak < 1.25 * size, (peak, size)  # doubling peaks at the last two buffers together


def test_server_handshake_deadline_covers_the_whole_handshake():
    """A client trickling its hello a byte at a time fails at the deadline, not per byte."""
    a, b = socket.socketpair()

    def trickle() -> None:
        with contextlib.suppress(OSError):
            f._recv_exact(b, f.SERVER_HELLO)
            for byte in (f.MAGIC * 20)[:60]:
                b.sendall(bytes([byte]))
                time.sleep(0.05)

    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    start = time.monotonic()
    try:
        with pytest.raises(TimeoutError):
            f.server_handshake(a, SECRET, timeout=0.5)
        assert time.monotonic() - start < 1.0
    finally:
        a.close()
        b.close()
        t.join(5)


def test_client_handshake_deadline_covers_the_whole_handshake():
    a, b = socket.socketpair()

    def trickle() -> None:
        with contextlib.suppress(OSError):
            for byte in (f.MAGIC + bytes([f.VERSION]) + bytes(f.NONCE))[:30]:
                a.sendall(bytes([byte]))
                time.sleep(0.05)

    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    start = time.monotonic()
    try:
        with pytest.raises(TimeoutError):
            f.client_handshake(b, SECRET, timeout=0.5)
        assert time.monotonic() - start < 1.0
    finally:
        a.close()
        b.close()
        t.join(5)


def test_a_read_deadline_raises_timeout_error(pair):
    server, client = pair
    server.settimeout(0.2)
    start = time.monotonic()
    with pytest.raises(TimeoutError) as info:
        server.recv()
    assert isinstance(info.value, OSError) and time.monotonic() - start < 2
    server.settimeout(5)  # nothing had arrived: the connection is still in step
    client.send(b"late")
    assert bytes(server.recv()) == b"late"


def test_connection_close_is_idempotent(pair):
    server, client = pair
    server.close()
    server.close()
    assert server.closed
    client.settimeout(5)
    with pytest.raises((OSError, ProtocolError)):
        client.recv()


def test_server_handshake_object_refuses_to_connect_unauthenticated_peers():
    handshake = f.ServerHandshake(SECRET)
    with pytest.raises(ProtocolError):
        handshake.answer(b"x" * f.CLIENT_HELLO)
    with pytest.raises(AuthenticationError):
        handshake.connection(socket.socket())
