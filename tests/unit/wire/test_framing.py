"""The wire: HMAC mutual-auth handshake, signed and sequenced frames, typed JSON messages."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import io
import os
import pickle
import shlex
import socket
import struct
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tfonspark.errors import AuthenticationError, ProtocolError
from tfonspark.wire import bootstrap, packing
from tfonspark.wire import buffers as bufs
from tfonspark.wire import events as ev
from tfonspark.wire import framing as f
from tfonspark.wire import messages as m

SECRET = bytes(range(32))
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


@pytest.fixture
def pair():
    server, s_exc, client, c_exc = handshake_pair()
    assert s_exc is None and c_exc is None
    server.settimeout(5)
    client.settimeout(5)
    yield server, client
    server.close()
    client.close()


def _evil_payload(target: Path) -> bytes:
    """A pickle that runs ``touch target`` when (and only when) it is unpickled."""

    class Evil:
        def __reduce__(self):
            return os.system, (f"touch {shlex.quote(str(target))}",)

    return pickle.dumps(Evil())


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

EXAMPLES = [
    m.Register(executor_id=3, host="10.0.0.1", port=2222, executor_key="abcd", pid=42, cluster_id="c1"),
    m.ClusterReady(job_name="worker", task_index=1, cluster_spec={"ps": ["h:1"], "worker": ["h:2", "h:3"]}),
    m.Reject(reason="no such executor: ünïcødé"),
    m.Heartbeat(),
    ev.FeedStalled(feed_id="f1", partition=3, received=16, timeout=2.5, train=False),
    ev.Reported(metrics={"loss": 0.5, "step": 3, "tags": ["a"]}),
    ev.EpochRead(feed_id="f1", epoch=2),
    ev.ServerRestarted(restart=1, limit=3, exit_code=-9, down_s=7.3),
    ev.TaskExit(exit_code=-9, stopped=True, traceback="tb"),
    ev.FeedTerminated(),
    ev.FeedRefused(feed_id="f1", partition=2, reason="delivered already"),
    ev.FeedHeld(feed_id="f1", partition=5),
    ev.FeedStarved(qname="input", waited=31.5),
    ev.FeedWaiting(what="data", waited=30.0, setting="feed_timeout", feed_id="f1", partition=2),
    ev.FeedSocket(data_path="/tmp/tfos-feed-x/feed.sock"),
    ev.ProcessUp(host="10.0.0.7", data_port=5555, data_path="", tensorboard_url="http://x"),
    ev.ProcessError(traceback="Traceback (most recent call last):\n  ..."),
    ev.TaskUp(tf_pid=99),
    ev.TaskFailed(reason="stopped (SIGTERM) before the TF process started"),
    ev.TaskRejected(reason="executor id 7 is not part of this cluster"),
    m.NodeUp(
        executor_id=1,
        tf_pid=99,
        data_host="127.0.0.1",
        data_port=5000,
        tensorboard_url="http://x",
        data_path="/tmp/tfos-feed-x/feed.sock",
    ),
    m.NodeExit(executor_id=1, exit_code=-9, traceback="Traceback...\n", output_tail="tail", stopped=True),
    m.Stop(grace_secs=2.5),
    m.StopRequest(cluster_id="c1", reason="operator"),
    m.Ack(count=7),
    m.FeedStart(qname="input", train=False, partition=4, columns=["a", "b"]),
    m.FeedEnd(count=100),
    m.FeedClose(qname="input"),
    m.FeedRelease(qname="input", feed_id="f1", final=True),
    m.Terminate(),
    m.Pending(),
    m.ResultsEnd(count=100),
]


def test_examples_cover_every_message_type():
    assert {type(e) for e in EXAMPLES} == set(m._REGISTRY.values())


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda e: type(e).__name__)
def test_messages_round_trip(message):
    payload = m.encode(message)
    assert payload[:1] == m.JSON_KIND
    assert m.decode(payload) == message
    assert m.decode(memoryview(payload)) == message


def test_messages_round_trip_over_a_connection(pair):
    server, client = pair
    for message in EXAMPLES:
        m.send_message(client, message)
        assert m.recv_message(server) == message


def test_recv_message_enforces_the_expected_types(pair):
    server, client = pair
    m.send_message(client, m.Ack(1))
    with pytest.raises(ProtocolError, match="expected register, received ack"):
        m.recv_message(server, m.Register)
    m.send_message(client, m.Stop())
    assert isinstance(m.recv_message(server, m.Register, m.Stop), m.Stop)


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"Jnot json",
        b'J{"type":"no_such_type"}',
        b'J{"count":1}',  # no type
        b'J{"type":"ack","count":1,"admin":true}',  # unknown field
        b'J{"type":"feed_end"}',  # missing field
        b'J{"type":"","count":1}',  # the base class is not a message
        b'J{"type":["ack"]}',
        b"J[1, 2]",
        b'J"ack"',  # JSON that is not an object
        b"J1",
        b"J" + b"[" * 100_000 + b"]" * 100_000,  # nesting deep enough to blow the stack
        b"J\xff\xfe",  # not UTF-8
        b'B{"type":"ack"}',  # a batch frame where a message belongs
        b'{"type":"ack","count":1}',  # no kind byte
    ],
    ids=repr,
)
def test_decode_rejects_malformed_messages(payload):
    with pytest.raises(ProtocolError):
        m.decode(payload)


def test_decode_never_unpickles(tmp_path):
    live = tmp_path / "proof-the-payload-is-live"
    pickle.loads(_evil_payload(live))  # the gadget really runs code when unpickled ...
    assert live.exists()

    target = tmp_path / "pwned"
    evil = _evil_payload(target)
    for payload in (evil, b"J" + evil, b"B" + evil, memoryview(evil)):
        with pytest.raises(ProtocolError):
            m.decode(payload)
    assert not target.exists()  # ... but decode never unpickles it


def test_recv_message_never_unpickles(pair, tmp_path):
    server, client = pair
    target = tmp_path / "pwned"
    client.send(_evil_payload(target))  # an authenticated peer, still no pickle on the control plane
    with pytest.raises(ProtocolError):
        m.recv_message(server)
    assert not target.exists()


# ---- bootstrap ----------------------------------------------------------------------------------


def test_bootstrap_round_trip():
    stream = io.BytesIO()
    bootstrap.write_bootstrap(stream, {"config": "{}", "port_fd": 7}, b"\x00payload\xff" * 1000)
    stream.seek(0)
    header, payload = bootstrap.read_bootstrap(stream)
    assert header == {"config": "{}", "port_fd": 7}
    assert payload == b"\x00payload\xff" * 1000


@pytest.mark.parametrize("cut", [0, 3, 8, 12, -1])
def test_bootstrap_truncated_is_a_protocol_error(cut):
    stream = io.BytesIO()
    bootstrap.write_bootstrap(stream, {"a": 1}, b"payload")
    data = stream.getvalue()
    with pytest.raises(ProtocolError, match="truncated"):
        bootstrap.read_bootstrap(io.BytesIO(data[:cut]))


# ---- reused receive buffers ------------------------------------------------------------------------

BIG = 1024 * 1024


def test_recv_buffers_reuse_memory_once_no_view_of_it_is_alive():
    pool = bufs.RecvBuffers(16 * BIG)
    first = pool.take(4 * BIG)
    first[:5] = b"first"
    buffers = [first.obj]  # references, not views: they do not keep a buffer in use
    held = np.frombuffer(first[:5], np.uint8)  # a decoded batch is a numpy view like this
    del first
    second = pool.take(4 * BIG)
    # the viewed buffer was not handed out again (fresh memory is not zeroed: compare identities)
    assert second.obj is not buffers[0]
    buffers.append(second.obj)
    del second
    assert bytes(held) == b"first" and pool.nbytes == 8 * BIG
    del held
    again = pool.take(3 * BIG)  # smaller frames fit in a free buffer (up to half its size)
    assert len(again) == 3 * BIG and any(again.obj is b for b in buffers)
    assert pool.nbytes == 8 * BIG  # nothing new was allocated


def test_recv_buffers_keep_within_their_capacity():
    pool = bufs.RecvBuffers(10 * BIG)
    views = [pool.take(4 * BIG) for _ in range(5)]  # all in use: only two fit in the pool
    assert all(len(v) == 4 * BIG for v in views)
    assert pool.nbytes == 8 * BIG
    del views
    assert len(pool.take(BIG)) == BIG  # free 4 MB buffers are too large for it; no room for a third
    big = pool.take(8 * BIG)  # free buffers that do not fit make room
    assert len(big) == 8 * BIG and pool.nbytes <= 10 * BIG


def test_recv_buffers_leave_small_and_huge_frames_to_fresh_memory():
    pool = bufs.RecvBuffers(4 * BIG)
    assert len(pool.take(100)) == 100 and len(pool.take(5 * BIG)) == 5 * BIG
    assert pool.nbytes == 0


@pytest.mark.parametrize("unix", [False, True])
def test_payloads_stay_intact_while_later_frames_reuse_buffers(unix):
    server, _, client, _ = handshake_pair(unix=unix)
    try:
        server.settimeout(5)
        server.buffers = bufs.RecvBuffers(8 * BIG)
        kept = []
        for i in range(6):
            sender = threading.Thread(target=client.send, args=(np.full(BIG // 4, i, np.float32),))
            sender.start()
            arr = np.frombuffer(server.recv(), np.float32)
            sender.join(5)
            if i % 2 == 0:
                kept.append((i, arr))  # held like a batch the consumer has not let go of
            del arr
        assert all((arr == i).all() for i, arr in kept)
        assert server.buffers.nbytes <= 5 * BIG  # released frames were reused
    finally:
        server.close()
        client.close()


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


def test_new_buffer_is_a_bytearray_of_the_size_asked_with_or_without_the_c_part():
    for make in (bufs.new_buffer, bufs._load_empty(), bytearray):
        buf = make(12345)
        assert type(buf) is bytearray and len(buf) == 12345
        buf[-1] = 7  # writable, and resizable like any bytearray (the pool's unused probe)
        buf.append(0)
        assert len(buf) == 12346
    if packing.native is not None:  # built: it does not zero-fill, and says so in its name
        assert bufs._make_bytearray is packing.native.empty_bytearray
    for size in (-1, -2):  # with or without the C part, as the C part has always answered
        with pytest.raises(ValueError, match=">= 0"):
            bufs.new_buffer(size)


def test_the_pools_unused_probe_never_moves_a_new_buffer():
    buf = bufs.new_buffer(1 << 20)
    address = np.frombuffer(buf, np.uint8).__array_interface__["data"][0]
    assert bufs._unused(buf) and len(buf) == 1 << 20
    assert np.frombuffer(buf, np.uint8).__array_interface__["data"][0] == address
    view = memoryview(buf)
    assert not bufs._unused(buf)
    view.release()
    assert bufs._unused(buf)


def test_a_grown_frame_buffer_joins_the_pool_for_reuse(pair):
    server, client = pair
    server.buffers = bufs.RecvBuffers(16 * BIG)
    size = 3 * BIG + 5
    for i in range(3):
        sender = threading.Thread(target=client.send, args=(bytes([i]) * size,))
        sender.start()
        got = server.recv()
        sender.join(5)
        assert bytes(got[:3]) == bytes([i]) * 3 and len(got) == size
        del got
    assert server.buffers.nbytes == size  # one buffer, reused by the later frames


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
