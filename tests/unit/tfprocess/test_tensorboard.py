"""Where TensorBoard (``tensorboard=True``) serves, and that it says so (issue 43, row 13).

The choice: TensorBoard serves on the chief's advertised address (``bind_host`` overrides it),
so the URL ``cluster.tensorboard_url()`` gives opens from a browser on the cluster's network, as
TFoS's did on TF 1 (TensorBoard 1.x bound every interface). TensorBoard has no authentication:
anyone who reaches that address reads the log directory. So it binds that one address, never a
wildcard unless asked, and the chief logs a WARNING saying exactly that whenever it is reachable
from other hosts. A real TensorBoard is started here.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import urllib.request

import pytest

from tests.waiting import wait_until
from tfonspark.tfprocess import tensorboard

from .._port_range import free_range, listening

pytest.importorskip("tensorboard")


def _own_address() -> str:
    """An address of this host other than loopback, or "" where it has none."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("203.0.113.1", 9))  # TEST-NET-3; no packet is sent: it picks the outgoing address
            address = probe.getsockname()[0]
    except OSError:
        return ""
    return "" if address.startswith("127.") else address


def _accepts(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=2).close()
        return True
    except OSError:
        return False


@pytest.fixture
def children():
    """Kill TensorBoard after the test: it is the TF process's child, gone with its process group there."""
    import psutil

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield before  # what ran already: another test file's JVMs in this worker, which are not TensorBoard's
    for proc in psutil.Process().children(recursive=True):
        if proc.pid not in before:
            proc.kill()
            proc.wait(10)


@pytest.mark.timeout(120)
def test_tensorboard_serves_the_advertised_address_only_without_authentication_and_warns(tmp_path, caplog, children):
    """Before: the same serving, and nothing said so on the node."""
    host = _own_address()
    if not host:
        pytest.skip("this host has no address besides loopback")
    with caplog.at_level(logging.INFO, logger="tfonspark.tfprocess.tensorboard"):
        url = tensorboard.start_tensorboard(str(tmp_path), host, timeout=60)
    port = int(url.rpartition(":")[2])
    assert url == f"http://{host}:{port}"
    with urllib.request.urlopen(f"{url}/data/logdir", timeout=10) as response:  # no credentials asked
        assert response.status == 200 and os.fspath(tmp_path) in response.read().decode()
    assert not _accepts("127.0.0.1", port)  # that one address, not a wildcard
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
    said = warnings[0].getMessage()
    assert "without authentication" in said and url in said and str(tmp_path) in said
    assert "bind_host" in said and "private network" in said


@pytest.mark.timeout(120)
def test_tensorboard_on_loopback_is_noted_at_info_only(tmp_path, caplog, children):
    with caplog.at_level(logging.INFO, logger="tfonspark.tfprocess.tensorboard"):
        url = tensorboard.start_tensorboard(str(tmp_path), "127.0.0.1", timeout=60)
    port = int(url.rpartition(":")[2])
    assert wait_until(lambda: _accepts("127.0.0.1", port), 5)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any("without authentication" in m and "this host only" in m for m in infos), infos


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


@pytest.mark.timeout(120)
def test_under_a_port_range_tensorboard_and_all_it_starts_listen_inside_it(tmp_path, children):
    """Issue 45, item 4: TensorBoard takes the first free port of the range (another server holds
    the first one), and starts no data server of its own on a port outside it."""
    import psutil

    spec = free_range(3)
    low, high = (int(p) for p in spec.split("-"))
    with listening(low):
        url = tensorboard.start_tensorboard(str(tmp_path), "127.0.0.1", timeout=60, port_range=spec)
        assert url == f"http://127.0.0.1:{low + 1}"
        with urllib.request.urlopen(f"{url}/data/logdir", timeout=10) as response:
            assert response.status == 200
        time.sleep(1)  # a data server would have started by now, with TensorBoard's first request
        mine = [p for p in psutil.Process().children(recursive=True) if p.pid not in children]
        held = {c.laddr.port for p in mine for c in p.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
        assert held and all(low <= port <= high for port in held), (spec, held)
