"""Large frames through shared memory on a same-host (unsigned) connection: ``wire/ring.py``."""

from __future__ import annotations

import array
import fcntl
import os
import socket
import struct
import tempfile
import threading
import time
from collections import OrderedDict
from typing import Any

import pytest

from tfonspark.errors import ProtocolError
from tfonspark.wire import framing as f
from tfonspark.wire import ring

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not ring.supported(), reason="no sealed memfds on this platform"),
]

KEY = b"k" * 32
KB = 1024


@pytest.fixture(autouse=True)
def small_ring(monkeypatch):
    """A 256 KB ring, so that a few frames wrap it; no ring left over from another test."""
    monkeypatch.setattr(ring, "CAPACITY", 256 * KB)
    monkeypatch.setattr(ring, "_spare", [])
    monkeypatch.setattr(ring, "_kept", OrderedDict())


def _pair() -> tuple[f.Connection, f.Connection]:
    """An unsigned server/client pair over a Unix socketpair (the handshake is tested elsewhere)."""
    a, b = socket.socketpair()
    return f.Connection(a, KEY, False, signed=False), f.Connection(b, KEY, True, signed=False)


@pytest.fixture
def unix_pair():
    """:func:`_pair`, with timeouts, closed after the test."""
    server, client = _pair()
    server.settimeout(5)
    client.settimeout(5)
    yield server, client
    server.close()
    client.close()


def _in_background(fn: Any) -> threading.Thread:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - checked by the caller through .errors
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.errors = errors  # type: ignore[attr-defined]
    thread.start()
    return thread


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _send_raw(sock: socket.socket, data: bytes, fd: int | None = None) -> None:
    fds = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))] if fd is not None else []
    sock.sendmsg([data], fds)


def _memfd(size: int, seals: int = 0) -> int:
    fd = os.memfd_create("test", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


# ---- the ring at work -------------------------------------------------------------------------


def test_large_payloads_go_through_shared_memory_and_arrive_intact_in_order(unix_pair):
    server, client = unix_pair
    assert client.offer_ring()
    sizes = [70 * KB, 200 * KB, 5, 100 * KB, 130 * KB, 64 * KB, 250 * KB, 300 * KB, 64 * KB - 1]
    payloads = [os.urandom(n) for n in sizes * 3]  # wraps the 256 KB ring many times

    def send() -> None:
        for p in payloads:
            client.send(p[:10], memoryview(p)[10:])  # parts, as encode_batch gives them

    sender = _in_background(send)
    got = [bytes(server.recv()) for _ in payloads]
    sender.join(10)
    assert not sender.errors and got == payloads
    shared = client._ring
    assert shared is not None
    through_ring = sum(len(p) for p in payloads if ring.MIN_PAYLOAD <= len(p) <= shared.capacity)
    assert shared.head >= through_ring > 0  # the 300 KB payloads and the small ones took the socket
    assert shared.head > 3 * shared.capacity  # the sender waited for freed places, turn after turn


def test_poll_applies_released_places_without_waiting_and_reports_a_message(unix_pair):
    server, client = unix_pair
    client.offer_ring()
    client.send(os.urandom(100 * KB))
    server.recv()  # copies the payload out and frees its place: an R frame waits for the client
    time.sleep(0.05)
    start = time.monotonic()
    assert client.poll() is False  # the R frame was read, no payload is waiting
    assert time.monotonic() - start < 1
    assert client._ring is not None and client._ring.idle
    server.send(b"terminate")
    time.sleep(0.05)
    assert client.poll() is True
    assert bytes(client.recv()) == b"terminate"


def test_a_message_that_comes_while_the_sender_waits_for_room_is_kept_for_recv(unix_pair):
    server, client = unix_pair
    client.offer_ring()
    client.send(os.urandom(200 * KB))  # the ring is nearly full until the server reads it
    sender = _in_background(lambda: client.send(os.urandom(200 * KB)))
    time.sleep(0.1)
    assert sender.is_alive()  # waiting for the first payload's place
    server.send(b"pending")  # arrives while the sender reads the socket for R frames
    assert len(server.recv()) == 200 * KB
    assert len(server.recv()) == 200 * KB
    sender.join(5)
    assert not sender.errors
    assert bytes(client.recv()) == b"pending"


def test_a_sender_whose_receiver_reads_nothing_times_out(unix_pair):
    server, client = unix_pair
    client.offer_ring()
    client.settimeout(0.3)
    client.send(os.urandom(200 * KB))
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        client.send(os.urandom(200 * KB))
    assert time.monotonic() - start < 3


def test_an_idle_ring_serves_the_next_connection_and_a_busy_one_is_dropped():
    server, client = _pair()
    client.offer_ring()
    first = client._ring
    client.send(os.urandom(100 * KB))
    server.recv()
    assert client.poll() is False  # reads the R frame: the ring is idle
    client.close()
    server.close()
    server, client = _pair()
    client.offer_ring()
    assert client._ring is first  # its pages are in memory already
    client.send(os.urandom(100 * KB))  # never read: the ring is still in use when closed
    client.close()
    server.close()
    assert ring._spare == []
    with pytest.raises(ValueError):
        first.map[0:1]  # closed


def _one_payload(client: f.Connection, server: f.Connection) -> Any:
    """Send one payload through the client's ring; the server's mapping of it, once read."""
    client.offer_ring()
    payload = os.urandom(100 * KB)
    client.send(payload)
    assert bytes(server.recv()) == payload
    assert server._peer_ring is not None
    return server._peer_ring.map


def test_the_receiver_maps_a_ring_offered_again_once():
    server, client = _pair()
    first = _one_payload(client, server)
    assert client.poll() is False  # the R frame: the ring is idle, kept for the next connection
    client.close()
    server.close()
    assert list(ring._kept.values()) == [first]  # kept, not unmapped
    server, client = _pair()
    try:
        assert _one_payload(client, server) is first  # the same ring: its mapping, not a new one
        assert ring._kept == {}  # in use by this connection alone
    finally:
        client.close()
        server.close()
    assert list(ring._kept.values()) == [first]


def test_rings_mapped_at_once_are_kept_apart_and_only_the_last_few():
    pairs = [_pair() for _ in range(ring.KEPT_MAPPINGS + 2)]
    maps = [_one_payload(client, server) for server, client in pairs]  # each a ring of its own
    assert len({id(m) for m in maps}) == len(maps)
    for server, client in pairs:
        client.close()
        server.close()
    assert list(ring._kept.values()) == maps[2:]  # the oldest two were unmapped
    assert all(m.closed for m in maps[:2])
    assert not any(m.closed for m in maps[2:])


def test_a_ring_offered_under_another_id_or_none_is_mapped_anew():
    fd = _memfd(ring.CAPACITY, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
    kept = ring.RecvRing(os.dup(fd), ring.CAPACITY, ident=7)
    kept.close()
    assert len(ring._kept) == 1
    other = ring.RecvRing(os.dup(fd), ring.CAPACITY, ident=8)  # the same file, another id
    anonymous = ring.RecvRing(os.dup(fd), ring.CAPACITY)  # an older sender: no id
    os.close(fd)
    assert other.map is not ring._kept[kept.key] and anonymous.map is not ring._kept[kept.key]
    anonymous.close()
    assert anonymous.map.closed and len(ring._kept) == 1  # not kept: no id to know it by
    other.close()
    assert len(ring._kept) == 2


MB = 1024 * KB


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _offered_and_closed(capacity: int, ident: int) -> None:
    """A peer offers a sealed ring of ``capacity`` bytes under ``ident``, places one payload in it
    (read by the receiver, which maps the ring), and the connection closes."""
    server, client = _pair()
    server.settimeout(5)
    try:
        fd = _memfd(capacity, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
        _send_raw(client.sock, ring.control(b"O", capacity, ident), fd)
        os.close(fd)  # the receiver's mapping alone keeps the file alive
        _send_raw(client.sock, ring.control(b"F", 0, 100 * KB))
        assert len(server.recv()) == 100 * KB
    finally:
        client.close()
        server.close()


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads RSS from /proc")
def test_rings_of_another_size_than_the_senders_are_not_kept():
    """Before (issue 43, row 12): 6 offers of 4 MB rings left 4 kept mappings, +16 MB of RSS
    (of 64 MB rings: +256 MB)."""
    before = _rss()
    for ident in range(1, 7):
        _offered_and_closed(4 * MB, ident)
    grown = _rss() - before
    assert grown < 2 * MB, f"RSS grew {grown / MB:.1f} MB"
    assert ring.kept_bytes() == 0 and len(ring._kept) == 0


def test_kept_mappings_are_bounded_in_bytes(monkeypatch):
    monkeypatch.setattr(ring, "KEPT_BYTES", 2 * ring.CAPACITY + 1)  # room for two of the sender's rings
    for ident in range(1, 5):
        _offered_and_closed(ring.CAPACITY, ident)
    assert len(ring._kept) == 2 and ring.kept_bytes() == 2 * ring.CAPACITY
    assert [key[3] for key in ring._kept] == [3, 4]  # the latest, the oldest unmapped first


def test_the_default_bounds_keep_at_most_64_mb_of_mappings():
    assert ring.KEPT_MAPPINGS * ring.CAPACITY <= ring.KEPT_BYTES <= 64 * MB
    assert ring.KEPT_BYTES >= 4 * 13 * MB  # four of the senders' real rings still fit


def test_a_ring_larger_than_the_senders_need_is_refused(unix_pair):
    """Each open connection maps at most ``MAX_CAPACITY`` (before: 64 MB; the sender's ring is 13 MB)."""
    seals = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
    assert ring.MAX_CAPACITY <= 16 * MB
    _refused(unix_pair, ring.control(b"O", 32 * MB, 9), _memfd(32 * MB, seals), "ring of 33554432 bytes")


def test_signed_connections_never_use_a_ring():
    a, b = socket.socketpair()
    client = f.Connection(b, KEY, True, signed=True)
    try:
        assert client.offer_ring() is False
    finally:
        client.close()
        a.close()


# ---- what the receiver refuses ------------------------------------------------------------------


def _refused(unix_pair: Any, data: bytes, fd: int | None = None, match: str = "") -> None:
    server, client = unix_pair
    before = _open_fds()
    _send_raw(client.sock, data, fd)
    if fd is not None:
        os.close(fd)
    with pytest.raises(ProtocolError, match=match):
        server.recv()
    assert _open_fds() == before - (1 if fd is not None else 0)  # nothing passed stays open


def test_a_ring_that_may_shrink_is_refused(unix_pair):
    _refused(unix_pair, ring.control(b"O", 64 * KB), _memfd(64 * KB), "shrink")


def test_a_ring_larger_than_its_file_is_refused(unix_pair):
    seals = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
    _refused(unix_pair, ring.control(b"O", 128 * KB), _memfd(64 * KB, seals), "ring of 131072 bytes")


def test_a_file_that_is_not_a_sealed_memfd_is_refused(unix_pair):
    with tempfile.TemporaryFile() as tmp:
        tmp.truncate(64 * KB)
        _refused(unix_pair, ring.control(b"O", 64 * KB), os.dup(tmp.fileno()), "shrink")


def test_a_payload_placed_before_any_ring_is_refused(unix_pair):
    _refused(unix_pair, ring.control(b"F", 0, 100), match="unexpected ring frame b'F'")


def test_file_descriptors_passed_with_a_data_frame_are_closed_and_refused(unix_pair):
    _refused(unix_pair, struct.pack(">I", 3) + b"abc", _memfd(4096), "file descriptors")


def _ring_in_use(unix_pair: Any) -> None:
    """The client's ring offered, and mapped by the server (which keeps a descriptor for it)."""
    server, client = unix_pair
    client.offer_ring()
    client.send(os.urandom(100 * KB))
    assert len(server.recv()) == 100 * KB


def test_a_second_ring_is_refused(unix_pair):
    _ring_in_use(unix_pair)
    _refused(unix_pair, ring.control(b"O", 64 * KB), _memfd(64 * KB, fcntl.F_SEAL_SHRINK), "ring frame b'O'")


@pytest.mark.parametrize(
    ("position", "length", "match"),
    [(450 * KB, 100 * KB, "within"), (512 * KB, 300 * KB, "within"), (-1, 10, None)],
)
def test_a_payload_outside_the_ring_is_refused(unix_pair, position, length, match):
    _ring_in_use(unix_pair)
    if position < 0:  # behind what the receiver already read
        position, match = 0, "expected at least"
    _refused(unix_pair, ring.control(b"F", position, length), match=match)


U64 = 2**64


@pytest.mark.parametrize("capacity", [256 * KB, 250 * KB])  # 2**64 a whole number of turns, and not
@pytest.mark.parametrize("back", [100 * KB, 1, 64])  # how far before 2**64 the payload starts
def test_a_payload_ending_past_the_last_u64_turn_is_refused(monkeypatch, capacity, back):
    """Before (issue 43, row 9): it passed ``check()``; then ``control(b"R", end)`` raised ``struct.error``."""
    monkeypatch.setattr(ring, "CAPACITY", capacity)
    server, client = _pair()
    server.settimeout(5)
    try:
        _ring_in_use((server, client))
        position = U64 - back
        length = min(back, capacity - position % capacity)  # within the ring: only the end is past 2**64 - 1
        assert position % capacity + length <= capacity and position + length >= U64
        _send_raw(client.sock, ring.control(b"F", position, length))
        with pytest.raises(ProtocolError, match="2\\*\\*64"):
            server.recv()
    finally:
        server.close()
        client.close()


def test_any_place_in_the_last_turns_is_refused_or_read_never_another_error(monkeypatch):
    """Every (position, length) a peer can send near 2**64: a ProtocolError or a payload, never struct.error."""
    capacity = 250 * KB
    monkeypatch.setattr(ring, "CAPACITY", capacity)
    top = U64 - 1
    cases = [
        (top - k, n)
        for k in (0, 1, 63, 64, capacity - 1, capacity, 2 * capacity + 7)
        for n in (0, 1, 64 * KB, capacity)
    ]
    for position, length in cases:
        server, client = _pair()
        server.settimeout(5)
        client.settimeout(5)
        try:
            _ring_in_use((server, client))
            _send_raw(client.sock, ring.control(b"F", position, length))
            try:
                got = server.recv()
            except ProtocolError:
                continue
            assert len(got) == length and position + length < U64
        finally:
            server.close()
            client.close()


def test_a_ring_frame_on_a_signed_connection_is_refused():
    a, b = socket.socketpair()
    server = f.Connection(a, KEY, False, signed=True)
    try:
        b.sendall(ring.control(b"O", 64 * KB)[:4] + bytes(f.TAG))
        with pytest.raises(ProtocolError, match="exceeds|limit"):
            server.recv()
    finally:
        server.close()
        b.close()
