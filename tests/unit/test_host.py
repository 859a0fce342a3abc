"""host.py, ports.py and tfprocess/tensorboard.py: exclusive port reservation, bind vs advertised."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys

import pytest

from tfonspark import host, ports
from tfonspark.tfprocess import tensorboard


def _bind(
    address: tuple,
    *,
    family: int = socket.AF_INET,
    reuseaddr: bool = False,
    reuseport: bool = False,
    listen: bool = False,
) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if reuseaddr:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuseport:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
        if listen:
            sock.listen(1)
    except BaseException:
        sock.close()
        raise
    return sock


def _local_addresses() -> list[str]:
    addresses = ["0.0.0.0", "127.0.0.1"]
    advertised = host.local_ip_towards("192.0.2.1")
    if advertised not in addresses:
        addresses.append(advertised)
    return addresses


@pytest.mark.parametrize(
    "options", [{}, {"reuseaddr": True}, {"reuseport": True, "reuseaddr": True}, {"reuseport": True}]
)
def test_reserved_port_cannot_be_bound_by_anyone_else(options):
    if options.get("reuseport") and not hasattr(socket, "SO_REUSEPORT"):
        pytest.skip("no SO_REUSEPORT")
    reserved = ports.reserve_port()
    port = reserved.getsockname()[1]
    assert reserved.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR) == 0
    if hasattr(socket, "SO_REUSEPORT"):
        assert reserved.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) == 0
    try:
        for address in _local_addresses():  # wildcard, loopback and the node's own address
            with pytest.raises(OSError) as info:
                _bind((address, port), listen=True, **options).close()
            assert info.value.errno == errno.EADDRINUSE, (address, options)
    finally:
        reserved.close()
    # once released, TensorFlow (which sets SO_REUSEADDR) can bind and listen at once
    for opts in ({}, options):
        _bind(("0.0.0.0", port), listen=True, **opts).close()
    _bind((_local_addresses()[-1], port), reuseaddr=True, listen=True).close()


def test_reservation_is_inheritable_and_never_listens():
    reserved = ports.reserve_port()
    try:
        assert reserved.get_inheritable()
        assert reserved.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 0
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", reserved.getsockname()[1]), timeout=2).close()
    finally:
        reserved.close()


def test_ipv6_reservation_also_holds_the_ipv4_port():
    reserved = ports.reserve_port(ipv6=True)
    try:
        port = reserved.getsockname()[1]
        if reserved.family == socket.AF_INET6:
            assert reserved.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 0
        with pytest.raises(OSError) as info:
            _bind(("0.0.0.0", port), reuseaddr=True).close()
        assert info.value.errno == errno.EADDRINUSE
    finally:
        reserved.close()


def test_a_chosen_port_can_be_reserved_again_after_release():
    first = ports.reserve_port()
    port = first.getsockname()[1]
    first.close()
    again = ports.reserve_port(port)
    try:
        assert again.getsockname()[1] == port
        with pytest.raises(OSError):
            ports.reserve_port(port)
    finally:
        again.close()


@pytest.mark.parametrize("address", ["", "0.0.0.0", "::", "[::]", " 0.0.0.0 "])
def test_wildcards_are_recognised(address):
    assert host.is_wildcard(address)


@pytest.mark.parametrize("address", ["127.0.0.1", "10.1.2.3", "::1", "node-7.example"])
def test_addresses_are_not_wildcards(address):
    assert not host.is_wildcard(address)


def test_bind_address_defaults_to_the_advertised_one():
    assert host.bind_address("", "10.1.2.3") == "10.1.2.3"
    assert host.bind_address("0.0.0.0", "10.1.2.3") == "0.0.0.0"
    assert host.bind_address("127.0.0.1", "10.1.2.3") == "127.0.0.1"


def test_a_wildcard_spark_local_ip_is_never_advertised(monkeypatch):
    monkeypatch.setenv("SPARK_LOCAL_IP", "0.0.0.0")
    found = host.local_ip_towards("127.0.0.1")
    assert found and not host.is_wildcard(found)
    monkeypatch.setenv("SPARK_LOCAL_IP", "10.9.8.7")
    assert host.local_ip_towards("127.0.0.1") == "10.9.8.7"


# ---- TensorBoard: binds the bind host, advertises the node's address ---------------------------


class _FakeTensorBoard:
    last: list[str] = []

    def __init__(self, cmd, **_kwargs):
        _FakeTensorBoard.last = list(cmd)

    def poll(self):
        return None


@pytest.fixture
def fake_tensorboard(monkeypatch):
    connected: list[tuple] = []

    class _Conn:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def create_connection(address, timeout=None):
        connected.append(address)
        return _Conn()

    monkeypatch.setattr(tensorboard.subprocess, "Popen", _FakeTensorBoard)
    monkeypatch.setattr(tensorboard.socket, "create_connection", create_connection)
    return connected


def _arg(cmd, name):
    return cmd[cmd.index(name) + 1]


def test_tensorboard_binds_the_advertised_address_by_default(fake_tensorboard, tmp_path):
    url = tensorboard.start_tensorboard(str(tmp_path), "127.0.0.1", 6123)
    cmd = _FakeTensorBoard.last
    assert _arg(cmd, "--host") == "127.0.0.1" and _arg(cmd, "--port") == "6123"
    assert url == "http://127.0.0.1:6123"
    assert fake_tensorboard == [("127.0.0.1", 6123)]


def test_tensorboard_on_a_wildcard_bind_host_still_advertises_the_node(fake_tensorboard, tmp_path):
    url = tensorboard.start_tensorboard(str(tmp_path), "10.1.2.3", 6124, bind_host="0.0.0.0")
    assert _arg(_FakeTensorBoard.last, "--host") == "0.0.0.0"
    assert url == "http://10.1.2.3:6124"
    assert fake_tensorboard == [("127.0.0.1", 6124)]  # readiness is probed over loopback


def test_tensorboard_free_port_is_picked_on_the_bind_host(fake_tensorboard, tmp_path, monkeypatch):
    bound: list[tuple] = []
    real_socket = socket.socket

    class _Recording(real_socket):
        def bind(self, address):
            bound.append(address)
            return super().bind(address)

    monkeypatch.setattr(tensorboard.socket, "socket", _Recording)
    url = tensorboard.start_tensorboard(str(tmp_path), "127.0.0.1")
    port = int(_arg(_FakeTensorBoard.last, "--port"))
    assert bound == [("127.0.0.1", 0)] and port > 0
    assert url == f"http://127.0.0.1:{port}"


def test_tensorboard_takes_its_port_from_the_caller_not_the_environment(fake_tensorboard, tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORBOARD_PORT", "6999")  # the supervisor reads it into NodeConfig.tensorboard_port
    url = tensorboard.start_tensorboard(str(tmp_path), "127.0.0.1", 6126)
    assert _arg(_FakeTensorBoard.last, "--port") == "6126" and url == "http://127.0.0.1:6126"


def test_tensorboard_ipv6_url_is_bracketed(fake_tensorboard, tmp_path):
    url = tensorboard.start_tensorboard(str(tmp_path), "fd00::5", 6125, bind_host="::")
    assert url == "http://[fd00::5]:6125"
    assert _arg(_FakeTensorBoard.last, "--host") == "::"
    assert fake_tensorboard == [("::1", 6125)]


# ---- the reservation holds the port on every family (issue 21, row 8) --------------------------


def _ipv6_addresses() -> list[str]:
    """The IPv6 addresses an intruder could bind here: the wildcard and loopback (when the host has IPv6)."""
    if not socket.has_ipv6:
        return []
    try:
        _bind(("::1", 0), family=socket.AF_INET6).close()
    except OSError:
        return []
    return ["::", "::1"]


@pytest.mark.parametrize(
    "options", [{}, {"reuseaddr": True}, {"reuseport": True, "reuseaddr": True}, {"reuseport": True}]
)
def test_the_reservation_also_holds_the_port_on_ipv6(options):
    """Another user bound [::1]:port during an IPv4-only reservation and got the connections made to ::1."""
    addresses = _ipv6_addresses()
    if not addresses:
        pytest.skip("no IPv6 on this host")
    if options.get("reuseport") and not hasattr(socket, "SO_REUSEPORT"):
        pytest.skip("no SO_REUSEPORT")
    reserved = ports.reserve_port()  # what the supervisor does for a node with an IPv4 address
    port = reserved.getsockname()[1]
    try:
        for address in addresses:
            with pytest.raises(OSError) as info:
                _bind((address, port), family=socket.AF_INET6, listen=True, **options).close()
            assert info.value.errno == errno.EADDRINUSE, (address, options)
        for address in _local_addresses():  # and still every IPv4 address
            with pytest.raises(OSError) as info:
                _bind((address, port), listen=True, **options).close()
            assert info.value.errno == errno.EADDRINUSE, (address, options)
    finally:
        reserved.close()
    for address in addresses:  # released: TF's server (dual-stack, SO_REUSEADDR) binds at once
        _bind((address, port), family=socket.AF_INET6, reuseaddr=True, listen=True).close()


def test_a_host_without_ipv6_still_gets_an_ipv4_reservation(monkeypatch):
    real_socket = socket.socket

    def no_ipv6(family=socket.AF_INET, *args, **kwargs):
        if family == socket.AF_INET6:
            raise OSError(errno.EAFNOSUPPORT, "Address family not supported by protocol")
        return real_socket(family, *args, **kwargs)

    monkeypatch.setattr(ports.socket, "socket", no_ipv6)
    reserved = ports.reserve_port()
    try:
        assert reserved.family == socket.AF_INET
        with pytest.raises(OSError) as info:
            _bind(("0.0.0.0", reserved.getsockname()[1]), reuseaddr=True).close()
        assert info.value.errno == errno.EADDRINUSE
    finally:
        reserved.close()


# ---- issue 43: a reservation kept across servers (share, seal), and who else listens -------------


def _bindable(port: int, reuseaddr: bool) -> list[str]:
    """The addresses another socket binds ``port`` on now (each closed again)."""
    took = []
    for family, address in [(socket.AF_INET, "0.0.0.0"), (socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")]:
        try:
            _bind((address, port), family=family, reuseaddr=reuseaddr).close()
            took.append(address)
        except OSError as exc:
            assert exc.errno == errno.EADDRINUSE
    return took


def _tf_server(port: int) -> socket.socket:
    """As TF 2.21's gRPC server binds: ``[::]:port`` dual-stack with SO_REUSEADDR, then listens."""
    sock = socket.socket(socket.AF_INET6)
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("::", port))
    return sock


@pytest.mark.skipif(not socket.has_ipv6, reason="TF's server binds [::]")
def test_a_sealed_reservation_holds_the_port_once_its_server_is_gone():
    """What a worker that restarts in place relies on: the reservation, shared for its server's
    start and sealed once it listens, still holds the port against everyone when the server dies
    (its connections lingering), and lets the next server bind beside it, shared again."""
    reserved = ports.reserve_port()
    port = reserved.getsockname()[1]
    try:
        for _ in range(2):  # the first server, then the restarted one
            ports.share_port(reserved)
            assert _bindable(port, reuseaddr=True) != []  # TF's own window: any SO_REUSEADDR socket
            assert _bindable(port, reuseaddr=False) == []  # never one without the option
            server = _tf_server(port)
            server.listen(16)
            ports.seal_port(reserved)
            peer = socket.create_connection(("127.0.0.1", port))
            server.accept()[0].close()  # the server's side closes first: its connection lingers
            server.close()  # the server dies
            assert _bindable(port, reuseaddr=True) == [] and _bindable(port, reuseaddr=False) == []
            peer.close()
    finally:
        reserved.close()


@pytest.mark.skipif(not socket.has_ipv6, reason="TF's server binds [::]")
def test_sealed_before_its_server_listens_the_server_could_not():
    """Why a Python bind() releases the reservation unsealed: Linux checks again at listen()."""
    reserved = ports.reserve_port()
    try:
        ports.share_port(reserved)
        server = _tf_server(reserved.getsockname()[1])
        ports.seal_port(reserved)
        with server, pytest.raises(OSError) as info:
            server.listen(1)
        assert info.value.errno == errno.EADDRINUSE
    finally:
        reserved.close()


def test_foreign_listeners_names_another_processs_listener_not_ours():
    with socket.socket() as mine:
        mine.bind(("127.0.0.1", 0))
        mine.listen(1)
        assert ports.foreign_listeners(mine.getsockname()[1]) == []
    code = "import socket, sys; s = socket.socket(socket.AF_INET6); s.bind(('::1', 0)); s.listen(1); "
    code += "print(s.getsockname()[1], flush=True); sys.stdin.read()"
    other = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert other.stdout is not None
        port = int(other.stdout.readline())
        (found,) = ports.foreign_listeners(port)
        assert (found.address, found.port, found.uid) == ("::1", port, os.getuid()) and found.inode > 0
    finally:
        other.communicate(timeout=10)
