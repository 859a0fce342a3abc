"""The driver's RendezvousServer: registration at scale, hostile peers, lifecycle, ports, secrecy."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import logging
import os
import pickle
import resource
import shlex
import socket
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.waiting import wait_until
from tfonspark import settings
from tfonspark.config import NodeConfig
from tfonspark.driver.nodes import rendezvous
from tfonspark.driver.nodes.rendezvous import RendezvousServer, bind_server_socket
from tfonspark.driver.nodes.roles import build_cluster_spec, plan_roles
from tfonspark.errors import AuthenticationError, ConfigError, ProtocolError
from tfonspark.executor.relay import MAX_EVENT_BYTES
from tfonspark.testing import free_ports
from tfonspark.wire import events as ev
from tfonspark.wire import framing as f
from tfonspark.wire import messages as m

SECRET = hashlib.sha256(b"rendezvous-test-secret").digest()
WRONG = hashlib.sha256(b"not-the-secret").digest()
CLUSTER = "cluster-under-test"
HELLO = len(f.MAGIC) + 1 + f.NONCE  # what the server says before the peer has proved anything


# ---- helpers ----------------------------------------------------------------------------------


@pytest.fixture
def make_server():
    servers: list[RendezvousServer] = []

    def make(roles, secret: bytes = SECRET, host: str = "127.0.0.1", **kwargs) -> RendezvousServer:
        server = RendezvousServer(CLUSTER, roles, secret, host, **kwargs)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.close()


def address_of(executor_id: int) -> str:
    return f"127.0.0.1:{20000 + executor_id}"


def register(
    server: RendezvousServer,
    executor_id: int,
    *,
    cluster_id: str = CLUSTER,
    secret: bytes = SECRET,
    timeout: float = 30,
) -> f.Connection:
    """Connect and send Register (the reply comes once every planned node has registered)."""
    conn = f.connect(server.address, secret, timeout=timeout)
    conn.settimeout(timeout)
    m.send_message(
        conn, m.Register(executor_id, "127.0.0.1", 20000 + executor_id, f"key-{executor_id}", os.getpid(), cluster_id)
    )
    return conn


def reply(conn: f.Connection) -> m.Message:
    return m.recv_message(conn, m.ClusterReady, m.Reject)


def evil_pickle(target: Path) -> bytes:
    class Evil:
        def __reduce__(self):
            return os.system, (f"touch {shlex.quote(str(target))}",)

    return pickle.dumps(Evil())


def _mac(key: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"".join(parts), hashlib.sha256).digest()


def signed_frame(key: bytes, payload: bytes, seq: int = 0, direction: bytes = b"c") -> bytes:
    header = struct.pack(">I", len(payload))
    return header + _mac(key, direction, struct.pack(">Q", seq), header, payload) + payload


def record_a_real_handshake(secret: bytes) -> bytes:
    """What an eavesdropper sees a real supervisor send: its hello, proof and Register frame."""
    lis = socket.socket()
    lis.bind(("127.0.0.1", 0))
    lis.listen(1)
    recorded = bytearray()

    def decoy() -> None:
        s, _ = lis.accept()
        conn = f.server_handshake(s, secret)
        conn.settimeout(5)
        with contextlib.suppress(OSError, ProtocolError):
            conn.recv()
        conn.close()

    t = threading.Thread(target=decoy, daemon=True)
    t.start()
    sock = socket.create_connection(lis.getsockname(), timeout=5)
    orig = sock.sendall

    class Tap:
        def __getattr__(self, name):
            return getattr(sock, name)

        def sendall(self, data):
            recorded.extend(bytes(data))
            return orig(data)

    conn = f.client_handshake(Tap(), secret, timeout=5)  # type: ignore[arg-type]
    m.send_message(conn, m.Register(0, "127.0.0.1", 20000, "key-0", 1, CLUSTER))
    t.join(5)
    conn.close()
    lis.close()
    return bytes(recorded)


def hostile(address, send: Callable[[socket.socket, bytes], None]) -> int:
    """Run one hostile peer; return how many bytes the server sent it (only its hello is allowed)."""
    got = 0
    with socket.create_connection(address, timeout=10) as s:
        hello = b""
        with contextlib.suppress(OSError):
            hello = f._recv_exact(s, HELLO)
        got += len(hello)
        with contextlib.suppress(OSError):
            send(s, bytes(hello))
            s.shutdown(socket.SHUT_WR)
        with contextlib.suppress(OSError):
            while chunk := s.recv(65536):
                got += len(chunk)
    return got


def attacks(tmp_path: Path) -> dict[str, Callable[[socket.socket, bytes], None]]:
    """Every way a peer without the secret tries to get in."""
    replay = record_a_real_handshake(SECRET)
    target = tmp_path / "pwned"
    forged_key = os.urandom(32)

    def forged_hello(hello: bytes, key: bytes) -> bytes:
        client_nonce = os.urandom(f.NONCE)
        return f.MAGIC + bytes([f.VERSION]) + client_nonce + _mac(key, b"c", hello[5:], client_nonce)

    register = m.encode(m.Register(1, "6.6.6.6", 666, "evil", 666, CLUSTER))
    return {
        "nothing": lambda s, hello: None,
        "random bytes": lambda s, hello: s.sendall(os.urandom(300)),
        "http": lambda s, hello: s.sendall(b"GET / HTTP/1.1\r\nHost: driver\r\n\r\n" + b"\0" * 64),
        "truncated handshake": lambda s, hello: s.sendall(f.MAGIC + bytes([f.VERSION]) + os.urandom(20)),
        "oversized length": lambda s, hello: s.sendall(struct.pack(">I", 0xFFFFFFFF) + os.urandom(200)),
        "forged proof + oversized frame": lambda s, hello: s.sendall(
            forged_hello(hello, WRONG) + struct.pack(">I", 0xFFFFFFFF) + os.urandom(f.TAG)
        ),
        "replayed handshake": lambda s, hello: s.sendall(replay),
        "forged frame": lambda s, hello: s.sendall(forged_hello(hello, WRONG) + signed_frame(forged_key, register)),
        "pickle as hello": lambda s, hello: s.sendall(evil_pickle(target).ljust(HELLO + f.TAG, b".")),
        "pickle after forged hello": lambda s, hello: s.sendall(
            forged_hello(hello, WRONG) + signed_frame(forged_key, evil_pickle(target))
        ),
        "nonce reflected back": lambda s, hello: s.sendall(
            f.MAGIC + bytes([f.VERSION]) + hello[5:] + _mac(WRONG, b"s", hello[5:], hello[5:])
        ),
    }


def wrong_secret_client(server: RendezvousServer) -> BaseException | None:
    try:
        conn = f.connect(server.address, WRONG, timeout=10)
    except (OSError, ProtocolError) as exc:
        return exc
    conn.close()
    return None


# ---- (a) scale --------------------------------------------------------------------------------


def test_thousand_clients_register_concurrently(make_server):
    n = 1000
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4 * n:  # each registration holds a client and a server socket
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4 * n), hard))
        if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < 2 * n + 100:
            pytest.skip("not enough file descriptors for 1,000 connections")
    roles = plan_roles(n, num_ps=2, master_node="chief", eval_node=True)
    server = make_server(roles)
    replies: list[m.Message | None] = [None] * n
    conns: list[f.Connection | None] = [None] * n
    errors: list[BaseException] = []
    go = threading.Barrier(n + 1, timeout=60)

    def node(i: int) -> None:
        try:
            go.wait()
            conns[i] = conn = register(server, i, timeout=60)
            replies[i] = reply(conn)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=node, args=(i,), daemon=True) for i in range(n)]
    try:
        for t in threads:
            t.start()
        go.wait()
        start = time.monotonic()
        for t in threads:
            t.join(max(0.1, 90 - (time.monotonic() - start)))
        elapsed = time.monotonic() - start
        print(f"\n{n} concurrent registrations answered in {elapsed:.2f}s")
        assert not errors, errors[:3]
        assert elapsed < 60
        expected = build_cluster_spec(roles, {i: address_of(i) for i in range(n)})
        assert server.cluster_spec == expected
        assert len(expected["worker"]) == n - 4 and expected["ps"] == [address_of(0), address_of(1)]
        for i, r in enumerate(replies):
            assert isinstance(r, m.ClusterReady), (i, r)
            assert r.cluster_spec == expected
            assert (r.job_name, r.task_index) == (roles[i].job_name, roles[i].task_index)
        assert server.registered() == n
        assert server.rejected == 0
        assert not server.failures()
    finally:
        for c in conns:
            if c is not None:
                c.close()


# ---- (b) hostile peers --------------------------------------------------------------------------


def test_hostile_peers_are_rejected_while_a_real_cluster_registers(make_server, tmp_path):
    server = make_server(plan_roles(2))
    evil = attacks(tmp_path)
    silent = socket.create_connection(server.address, timeout=5)  # holds a connection, says nothing
    sent_back: dict[str, int] = {}

    def attack(name: str) -> None:
        sent_back[name] = hostile(server.address, evil[name])

    threads = [threading.Thread(target=attack, args=(name,), daemon=True) for name in evil]
    wrong: list = []
    threads.append(threading.Thread(target=lambda: wrong.append(wrong_secret_client(server)), daemon=True))
    for t in threads[: len(threads) // 2]:
        t.start()
    node0 = register(server, 0)
    for t in threads[len(threads) // 2 :]:
        t.start()
    node1 = register(server, 1)
    try:
        r0, r1 = reply(node0), reply(node1)
        assert isinstance(r0, m.ClusterReady) and isinstance(r1, m.ClusterReady)
        assert r0.cluster_spec == r1.cluster_spec == {"worker": [address_of(0), address_of(1)]}
        for t in threads:
            t.join(15)
        silent.close()
        expected = len(evil) + 2  # + the wrong-secret client and the silent peer
        assert wait_until(lambda: server.rejected >= expected), (server.rejected, expected)
        assert server.rejected == expected
        # no hostile peer received anything beyond the server's opening nonce
        assert set(sent_back) == set(evil)
        assert all(n <= HELLO for n in sent_back.values()), sent_back
        assert isinstance(wrong[0], (OSError, ProtocolError))
        assert not (tmp_path / "pwned").exists()
        # the nodes' addresses are the real ones, nothing forged got in
        assert {n.address for n in server.nodes.values()} == {address_of(0), address_of(1)}
        # and the real connections keep working after the attacks
        m.send_message(node0, m.NodeUp(0, 123, "127.0.0.1", 5555))
        assert wait_until(lambda: server.nodes[0].up is not None)
        assert server.nodes[0].up.data_port == 5555
    finally:
        node0.close()
        node1.close()


def test_hostile_peers_after_the_cluster_formed_do_not_disturb_it(make_server, tmp_path):
    server = make_server(plan_roles(1))
    node = register(server, 0)
    try:
        assert isinstance(reply(node), m.ClusterReady)
        evil = attacks(tmp_path)
        for send in evil.values():
            assert hostile(server.address, send) <= HELLO
        assert wait_until(lambda: server.rejected == len(evil))
        assert not server.failures() and not (tmp_path / "pwned").exists()
    finally:
        node.close()


def test_authenticated_peer_sending_a_pickle_is_dropped_without_unpickling(make_server, tmp_path):
    server = make_server(plan_roles(2))
    target = tmp_path / "pwned"
    conn = f.connect(server.address, SECRET, timeout=5)
    conn.settimeout(5)
    conn.send(evil_pickle(target))
    with pytest.raises((OSError, ProtocolError)):
        conn.recv()  # dropped, no reply
    conn.close()
    assert not target.exists()
    # the slots are still free for the real nodes
    assert server.registered() == 0
    n0, n1 = register(server, 0), register(server, 1)
    try:
        assert isinstance(reply(n0), m.ClusterReady) and isinstance(reply(n1), m.ClusterReady)
    finally:
        n0.close()
        n1.close()


def test_authenticated_peer_sending_the_wrong_first_message_is_dropped(make_server):
    server = make_server(plan_roles(1))
    conn = f.connect(server.address, SECRET, timeout=5)
    conn.settimeout(5)
    m.send_message(conn, m.NodeUp(0, 1, "h", 1))
    with pytest.raises((OSError, ProtocolError)):
        conn.recv()
    conn.close()
    assert server.registered() == 0 and not server.failures()


# ---- (c) refusals -------------------------------------------------------------------------------


def test_registration_for_another_cluster_is_rejected(make_server):
    server = make_server(plan_roles(1))
    conn = register(server, 0, cluster_id="someone-elses-cluster")
    try:
        r = reply(conn)
        assert isinstance(r, m.Reject) and "another cluster" in r.reason
    finally:
        conn.close()
    assert server.registered() == 0 and server.cluster_spec is None


@pytest.mark.parametrize("executor_id", [2, 99, -1])
def test_unknown_executor_id_is_rejected(make_server, executor_id):
    server = make_server(plan_roles(2))
    conn = register(server, executor_id)
    try:
        r = reply(conn)
        assert isinstance(r, m.Reject) and str(executor_id) in r.reason
    finally:
        conn.close()
    assert server.registered() == 0


def test_double_registration_is_rejected_before_and_after_the_cluster_forms(make_server):
    server = make_server(plan_roles(2))
    first = register(server, 0)
    assert wait_until(lambda: server.registered() == 1)
    twice = register(server, 0)
    later: f.Connection | None = None
    try:
        r = reply(twice)
        assert isinstance(r, m.Reject) and "registered twice" in r.reason
        node1 = register(server, 1)
        assert isinstance(reply(first), m.ClusterReady) and isinstance(reply(node1), m.ClusterReady)
        later = register(server, 1)  # a retried Spark task after the cluster formed
        r = reply(later)
        assert isinstance(r, m.Reject) and "already formed" in r.reason
        assert server.cluster_spec == {"worker": [address_of(0), address_of(1)]}
        node1.close()
    finally:
        for c in (first, twice, later):
            if c is not None:
                c.close()


# ---- (d) lifecycle --------------------------------------------------------------------------------


def test_node_up_exit_and_lost_connections_are_recorded(make_server):
    server = make_server(plan_roles(4))
    conns = [register(server, i) for i in range(4)]
    try:
        assert all(isinstance(reply(c), m.ClusterReady) for c in conns)
        ups = [m.NodeUp(i, 1000 + i, "127.0.0.1", 7000 + i, f"http://tb{i}") for i in range(4)]
        for c, up in zip(conns, ups, strict=True):
            m.send_message(c, up)
        assert server.wait_for(lambda nodes: all(n.up for n in nodes), timeout=10)
        assert [n.up for n in server.nodes.values()] == ups

        m.send_message(conns[0], m.NodeExit(0, 0))  # finished cleanly
        conns[1].close()  # executor died
        m.send_message(conns[2], m.NodeExit(2, 1, traceback="ValueError: boom"))  # crashed
        m.send_message(conns[3], m.NodeExit(3, -15, stopped=True))  # stopped on purpose
        # (wait_for itself returns as soon as any node fails, so poll for all four here)
        assert wait_until(lambda: all(n.finished for n in server.nodes.values()))

        nodes = server.nodes
        assert nodes[0].exit == m.NodeExit(0, 0) and not nodes[0].failed and not nodes[0].lost
        assert nodes[1].exit is None and "broke" in nodes[1].lost and nodes[1].failed
        assert nodes[2].exit.traceback == "ValueError: boom" and nodes[2].failed
        assert nodes[3].exit.stopped and not nodes[3].failed
        assert [n.role.executor_id for n in server.failures()] == [1, 2]
    finally:
        for c in conns:
            c.close()


def test_a_connection_dropped_after_exit_is_not_a_loss(make_server):
    server = make_server(plan_roles(1))
    conn = register(server, 0)
    assert isinstance(reply(conn), m.ClusterReady)
    m.send_message(conn, m.NodeExit(0, 0))
    conn.close()
    assert server.wait_for(lambda nodes: all(n.finished for n in nodes), timeout=10)
    time.sleep(0.05)
    assert not server.nodes[0].lost and not server.failures()


def test_wait_for_returns_early_when_a_node_is_lost(make_server):
    server = make_server(plan_roles(2))
    conns = [register(server, i) for i in range(2)]
    for c in conns:
        assert isinstance(reply(c), m.ClusterReady)
    conns[1].close()
    start = time.monotonic()
    assert server.wait_for(lambda nodes: all(n.exit for n in nodes), timeout=30) is False
    assert time.monotonic() - start < 5
    assert [n.role.executor_id for n in server.failures()] == [1]
    conns[0].close()


def test_wait_for_times_out(make_server):
    server = make_server(plan_roles(2))
    start = time.monotonic()
    assert server.wait_for(lambda nodes: all(n.address for n in nodes), timeout=0.2) is False
    assert 0.15 < time.monotonic() - start < 3


def test_stop_node_sends_stop_to_the_supervisor(make_server):
    server = make_server(plan_roles(1))
    conn = register(server, 0)
    try:
        assert isinstance(reply(conn), m.ClusterReady)
        server.stop_node(server.nodes[0], grace_secs=1.5)
        assert m.recv_message(conn, m.Stop) == m.Stop(1.5)
        m.send_message(conn, m.NodeExit(0, -15, stopped=True))
        assert server.wait_for(lambda nodes: all(n.finished for n in nodes), timeout=10)
        server.stop_node(server.nodes[0], grace_secs=1.5)  # finished: a no-op, no error
    finally:
        conn.close()


def test_close_releases_nodes_waiting_for_the_cluster(make_server):
    server = make_server(plan_roles(2))
    conn = register(server, 0)
    assert wait_until(lambda: server.registered() == 1)
    start = time.monotonic()
    server.close()
    with pytest.raises((OSError, ProtocolError)):
        conn.recv()
    assert time.monotonic() - start < 5
    conn.close()
    assert not server.failures()  # closing the server is not a node failure


# ---- (e) ports ----------------------------------------------------------------------------------


def _server_from_environment(make_server, environ: dict[str, str], host: str = "127.0.0.1") -> RendezvousServer:
    """The server as run() makes it (advertising ``host``), from settings resolved from ``environ``."""
    resolved = settings.resolve(environ=environ)
    return make_server(plan_roles(1), host=host, port_spec=resolved.server_port, bind_host=resolved.server_host or None)


def test_tfos_server_port_is_honoured(make_server):
    for _ in range(5):  # another process may grab the port in between; retry a few times
        (port,) = free_ports()
        try:
            server = _server_from_environment(make_server, {"TFOS_SERVER_PORT": str(port)})
        except ConfigError:
            continue
        assert server.address == ("127.0.0.1", port)
        return
    pytest.fail("could not bind any free port through TFOS_SERVER_PORT")


def test_tfos_server_port_range_skips_busy_ports(make_server):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    low = busy.getsockname()[1]
    try:
        server = _server_from_environment(make_server, {"TFOS_SERVER_PORT": f"{low}-{low + 20}"})
        assert low < server.address[1] <= low + 20
        # all ports of the range busy -> a ConfigError that names the setting
        with pytest.raises(ConfigError, match="TFOS_SERVER_PORT"):
            _server_from_environment(make_server, {"TFOS_SERVER_PORT": f"{low}-{low}"})
    finally:
        busy.close()


def test_the_server_itself_reads_no_environment(make_server, monkeypatch):
    monkeypatch.setenv("TFOS_SERVER_PORT", "not-a-port")  # settings.resolve() reads these, once, in run()
    monkeypatch.setenv("TFOS_SERVER_HOST", "0.0.0.0")
    server = make_server(plan_roles(1))
    assert server.address[0] == "127.0.0.1" and server.address[1] > 0


def test_tfos_server_host_is_honoured(make_server):
    server = _server_from_environment(make_server, {"TFOS_SERVER_HOST": "127.0.0.1"}, host="0.0.0.0")
    assert server.address[0] == "127.0.0.1"


@pytest.mark.parametrize("spec", ["abc", "10-5", "5000-", "-5000", "5000-50x", "70000", "1-99999", "1.5"])
def test_bad_tfos_server_port_is_a_config_error(make_server, spec):
    with pytest.raises(ConfigError, match="TFOS_SERVER_PORT") as info:
        _server_from_environment(make_server, {"TFOS_SERVER_PORT": spec})
    assert repr(spec) in str(info.value) and "(from the environment)" in str(info.value)
    with pytest.raises(ConfigError, match="port_spec") as info:  # given directly, the argument is named
        make_server(plan_roles(1), port_spec=spec)
    assert repr(spec) in str(info.value)


def test_bind_server_socket_any_port():
    sock = bind_server_socket("127.0.0.1")
    try:
        assert sock.getsockname()[1] > 0
    finally:
        sock.close()


def _time_wait_port() -> int:
    """A port whose listener is closed but whose accepted connection is in TIME-WAIT (it closed first)."""
    sock = bind_server_socket("127.0.0.1")
    port = sock.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port), timeout=5)
    accepted, _ = sock.accept()
    accepted.close()  # the server side closes first: its end (on the server's port) goes to TIME-WAIT
    client.recv(1)  # the FIN arrived
    client.close()
    sock.close()
    return port


def test_a_fixed_server_port_can_be_bound_again_while_in_time_wait():
    """A restart (max_restarts) re-binds the same server_port right after the last attempt closed it."""
    port = _time_wait_port()
    again = bind_server_socket("127.0.0.1", str(port))  # before SO_REUSEADDR: "Address already in use"
    try:
        assert again.getsockname()[1] == port
        assert again.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR)
    finally:
        again.close()


def test_reuse_addr_does_not_share_a_live_listener_or_a_reserved_port():
    live = bind_server_socket("127.0.0.1")
    port = live.getsockname()[1]
    try:
        with pytest.raises(ConfigError, match=f"port.*{port}"):
            bind_server_socket("127.0.0.1", str(port))  # both have SO_REUSEADDR: still refused
    finally:
        live.close()
    reserved = socket.socket()  # as host.reserve_port holds a node's port: bound, no listen
    reserved.bind(("127.0.0.1", 0))
    try:
        with pytest.raises(ConfigError):
            bind_server_socket("127.0.0.1", str(reserved.getsockname()[1]))
    finally:
        reserved.close()


# ---- (f) the secret stays secret -------------------------------------------------------------------


def _forms(secret: bytes) -> list[str]:
    return [
        secret.hex(),
        secret.hex().upper(),
        repr(secret),
        str(secret),
        base64.b64encode(secret).decode(),
        secret.decode("latin-1"),
    ]


def test_secret_never_appears_in_logs(make_server, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    server = make_server(plan_roles(1))
    for send in attacks(tmp_path).values():
        hostile(server.address, send)
    exc = wrong_secret_client(server)
    node = register(server, 0)
    other = register(server, 5)
    try:
        assert isinstance(reply(node), m.ClusterReady) and isinstance(reply(other), m.Reject)
    finally:
        other.close()
        node.close()
    assert wait_until(lambda: server.nodes[0].lost != "")
    assert wait_until(lambda: server.rejected >= 12)
    records = [r for r in caplog.records if r.name.startswith("tfonspark")]
    assert records, "expected the server to log the rejected connections"
    text = caplog.text + "\n".join(r.getMessage() for r in caplog.records)
    text += "\n" + str(exc) + repr(exc) + server.nodes[0].lost + repr(server.nodes[0])
    for form in _forms(SECRET):
        assert form not in text


def test_secret_never_appears_in_node_config_repr():
    secret_hex = SECRET.hex()
    config = NodeConfig(cluster_id=CLUSTER, driver_host="127.0.0.1", driver_port=1234, secret_hex=secret_hex)
    for text in (repr(config), str(config), f"{config}", f"{config!r}"):
        assert secret_hex not in text and "secret" not in text
        assert "cluster-under-test" in text  # the repr is still useful
    assert NodeConfig.from_json(config.to_json()).secret == SECRET  # it does travel to the nodes


def test_short_secret_is_rejected_without_echoing_it():
    with pytest.raises(ConfigError) as info:
        NodeConfig(cluster_id=CLUSTER, driver_host="h", driver_port=1, secret_hex="deadbeefcafe")
    assert "deadbeefcafe" not in str(info.value)


def test_authentication_errors_do_not_carry_the_secret():
    a, b = socket.socketpair()
    t = threading.Thread(target=_client_quietly, args=(b,), daemon=True)
    t.start()
    try:
        with pytest.raises(AuthenticationError) as info:
            f.server_handshake(a, SECRET, timeout=5)
    finally:
        a.close()
        t.join(5)
        b.close()
    for form in _forms(SECRET) + _forms(WRONG):
        assert form not in str(info.value) and form not in repr(info.value)


def _client_quietly(sock: socket.socket) -> None:
    with contextlib.suppress(OSError, ProtocolError):
        f.client_handshake(sock, WRONG, timeout=5)


# ---- (g) bind vs advertise, deadlines, heartbeats, events ------------------------------------------


@pytest.mark.parametrize("wildcard", ["0.0.0.0", ""])
def test_a_wildcard_bind_is_never_advertised(make_server, wildcard):
    server = make_server(plan_roles(1), bind_host=wildcard)
    assert server.address[0] == "127.0.0.1" and server.address[1] > 0
    conn = register(server, 0)  # and nodes can reach it there
    try:
        assert isinstance(reply(conn), m.ClusterReady)
    finally:
        conn.close()


def test_tfos_server_host_wildcard_is_bound_but_not_advertised(make_server):
    server = _server_from_environment(make_server, {"TFOS_SERVER_HOST": "0.0.0.0"})
    assert server.address[0] == "127.0.0.1"


def test_an_explicit_bind_host_is_advertised_as_bound():
    server = RendezvousServer(CLUSTER, plan_roles(1), SECRET, "10.9.8.7", bind_host="127.0.0.1")
    try:
        assert server.address[0] == "127.0.0.1"
    finally:
        server.close()


def test_a_wildcard_with_nothing_else_to_advertise_is_a_config_error():
    with pytest.raises(ConfigError, match="wildcard"):
        RendezvousServer(CLUSTER, plan_roles(1), SECRET, "0.0.0.0", bind_host="0.0.0.0")


@pytest.mark.parametrize("secs, timeout", [(0, 1.0), (1.0, 1.0), (2.0, 1.0), (-1, 5.0)])
def test_bad_heartbeat_settings_are_a_config_error(secs, timeout):
    with pytest.raises(ConfigError, match="heartbeat"):
        RendezvousServer(CLUSTER, plan_roles(1), SECRET, "127.0.0.1", heartbeat_secs=secs, heartbeat_timeout=timeout)


def test_register_must_follow_authentication_promptly(make_server):
    server = make_server(plan_roles(1), handshake_timeout=0.5)
    conn = f.connect(server.address, SECRET, timeout=5)  # authenticated, then says nothing
    conn.settimeout(5)
    start = time.monotonic()
    with pytest.raises((OSError, ProtocolError)):
        conn.recv()
    assert time.monotonic() - start < 2
    conn.close()
    late = register(server, 0)  # the slot is still free
    try:
        assert isinstance(reply(late), m.ClusterReady)
    finally:
        late.close()


def test_the_driver_sends_heartbeats_once_the_cluster_is_ready(make_server):
    server = make_server(plan_roles(1), heartbeat_secs=0.1, heartbeat_timeout=5.0)
    conn = register(server, 0)
    try:
        assert isinstance(reply(conn), m.ClusterReady)
        conn.settimeout(2)
        beats = [m.recv_message(conn) for _ in range(3)]
        assert beats == [m.Heartbeat()] * 3
    finally:
        conn.close()


def test_a_silent_supervisor_is_lost_after_the_heartbeat_timeout(make_server):
    server = make_server(plan_roles(2), heartbeat_secs=0.2, heartbeat_timeout=1.0)
    quiet, alive = register(server, 0), register(server, 1)
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(0.2):
            with contextlib.suppress(OSError):
                m.send_message(alive, m.Heartbeat())

    beater = threading.Thread(target=beat, daemon=True)
    try:
        assert isinstance(reply(quiet), m.ClusterReady) and isinstance(reply(alive), m.ClusterReady)
        beater.start()
        start = time.monotonic()
        assert wait_until(lambda: bool(server.nodes[0].lost), timeout=5)
        assert 0.8 < time.monotonic() - start < 2.5
        lost = server.nodes[0].lost  # says unreachable, where, for how long, and which setting sets it
        assert lost.startswith("unreachable: no heartbeat from its supervisor on 127.0.0.1 for 1s")
        assert "heartbeat_timeout" in lost
        time.sleep(0.5)
        assert not server.nodes[1].finished  # its supervisor kept sending heartbeats
        assert [n.role.executor_id for n in server.failures()] == [0]
    finally:
        stop.set()
        if beater.is_alive():
            beater.join(5)
        quiet.close()
        alive.close()


def test_node_events_are_recorded_in_order(make_server):
    server = make_server(plan_roles(1))
    conn = register(server, 0)
    try:
        assert isinstance(reply(conn), m.ClusterReady)
        first = ev.FeedStalled("f1", 3, timeout=2.5)
        second = ev.FeedRefused("f1", 4, "delivered already")
        m.send_message(conn, first)
        m.send_message(conn, m.Heartbeat())  # ignored
        m.send_message(conn, second)
        assert wait_until(lambda: server.event_count == 2)
        node = server.nodes[0]
        assert server.take_events() == [(node, first), (node, second)]
        assert server.take_events() == []  # handed out once: the server keeps no list of them
        assert not server.failures()
    finally:
        conn.close()


def test_close_closes_every_node_connection(make_server):
    server = make_server(plan_roles(1))
    conn = register(server, 0)
    assert isinstance(reply(conn), m.ClusterReady)
    server.close()
    conn.settimeout(5)
    with pytest.raises((OSError, ProtocolError)):
        while True:
            m.recv_message(conn)  # (a heartbeat may come first)
    conn.close()
    assert not server.failures()


# ---- from test_rendezvous_events.py -----------------------------------------------------------------
# Node events on the driver (issue 21, rows 4 and 5): refused when oversize or malformed without
# losing the node, handed to the watcher once and then forgotten, epoch marks kept compactly, and
# the report log bounded in count and bytes.


EVENTS_SECRET = hashlib.sha256(b"rendezvous-events-test").digest()


EVENTS_CLUSTER = "events-under-test"


@pytest.fixture
def server():
    made = RendezvousServer(EVENTS_CLUSTER, plan_roles(2), EVENTS_SECRET, "127.0.0.1")
    yield made
    made.close()


@pytest.fixture
def nodes(server):
    """Both nodes registered, the cluster formed: (connection of worker:0, of worker:1)."""
    conns = []
    for executor_id in (0, 1):
        conn = f.connect(server.address, EVENTS_SECRET, timeout=10)
        conn.settimeout(10)
        m.send_message(
            conn, m.Register(executor_id, "127.0.0.1", 20000 + executor_id, "k", os.getpid(), EVENTS_CLUSTER)
        )
        conns.append(conn)
    for conn in conns:
        assert isinstance(m.recv_message(conn, m.ClusterReady), m.ClusterReady)
    yield conns
    for conn in conns:
        conn.close()


def _taken(server: RendezvousServer, conn: f.Connection) -> list[ev.NodeEvent]:
    """Every event the server hands out until what was sent on ``conn`` so far has been recorded."""
    marker = ev.Reported({"sync": time.perf_counter_ns()})
    m.send_message(conn, marker)
    seen: list[ev.NodeEvent] = []

    def synced() -> bool:
        seen.extend(event for _, event in server.take_events())
        return marker in seen

    assert wait_until(synced)
    return [e for e in seen if e != marker]


def test_an_event_over_max_event_bytes_is_refused_and_the_node_stays(server, nodes, caplog):
    """Before: the driver kept a 1 MiB event (and a 5 MiB one broke the connection: node lost)."""
    conn = nodes[0]
    big = ev.Reported({"blob": "x" * (1024 * 1024)})
    with caplog.at_level(logging.ERROR, logger="tfonspark.driver.nodes.rendezvous"):
        m.send_message(conn, big)
        m.send_message(conn, ev.Reported({"loss": 0.5}))
        got = _taken(server, conn)
    assert got == [ev.Reported({"loss": 0.5})]
    assert not server.failures() and not server.nodes[0].finished
    assert server.refused == 1
    message = caplog.records[0].getMessage()
    assert "'reported' event from node worker:0" in message
    assert f"{len(m.encode(big))} bytes" in message
    assert f"at most {MAX_EVENT_BYTES}" in message and "MAX_EVENT_BYTES" in message


def test_a_largest_report_is_accepted(server, nodes):
    filler = 64 * 1024 - len(json.dumps({"x": ""}, separators=(",", ":")))
    event = ev.Reported({"x": "a" * filler})
    m.send_message(nodes[0], event)
    assert _taken(server, nodes[0]) == [event]


@pytest.mark.parametrize(
    ("kind", "fields", "said"),
    [
        ("epoch_read", {"feed_id": "f" * 60_000, "epoch": 0}, "feed_id is a str of 60000 characters"),
        ("feed_stalled", {"feed_id": "f" * 300, "partition": 1}, "feed_id is a str of 300 characters"),
        ("epoch_read", {"feed_id": ["not", "a", "str"], "epoch": 0}, "field feed_id must be str. Received: list"),
        ("epoch_read", {"epoch": 0}, "missing 1 required positional argument: 'feed_id'"),
        ("epoch_read", {"feed_id": "f1", "epoch": "3"}, "field epoch must be int. Received: str"),
        ("epoch_read", {"feed_id": "f1", "epoch": True}, "field epoch must be int. Received: bool"),
        ("epoch_read", {"feed_id": "f1", "epoch": -1}, "epoch is -1, and must be an int from 0 to 2**31 - 1"),
        ("feed_stalled", {"feed_id": "f1", "partition": 1, "timeout": "soon"}, "field timeout must be float"),
        ("feed_stalled", {"feed_id": "f1", "partition": 1, "received": 1.5}, "field received must be int"),
    ],
)
def test_a_bad_field_is_refused_with_what_was_received_and_what_is_valid(server, nodes, caplog, kind, fields, said):
    with caplog.at_level(logging.ERROR, logger="tfonspark.driver.nodes.rendezvous"):
        nodes[0].send(b"J" + json.dumps({"type": kind, **fields}).encode())
        assert _taken(server, nodes[0]) == []
    message = caplog.records[0].getMessage()
    assert said in message and f"'{kind}' event from node worker:0" in message
    if "characters" in said:
        assert "must be at most 256 (MAX_FEED_ID)" in message
    assert server.refused == 1 and not server.failures()
    assert server.epochs_read("f1") == {}


def test_a_malformed_message_that_is_no_event_still_loses_the_node(server, nodes):
    nodes[0].send(b'J{"type": "node_up", "executor_id": "zero"}')
    assert wait_until(lambda: server.nodes[0].lost)


def test_refusals_are_logged_at_a_bounded_rate(server, nodes, caplog):
    with caplog.at_level(logging.ERROR, logger="tfonspark.driver.nodes.rendezvous"):
        for _ in range(50):
            nodes[0].send(b'J{"type": "epoch_read", "feed_id": 7, "epoch": 0}')
        _taken(server, nodes[0])
    assert server.refused == 50
    assert len(caplog.records) == 10


def test_events_are_handed_out_once_in_order_and_then_forgotten(server, nodes):
    first = ev.FeedStalled("f1", 3, timeout=2.5)
    second = ev.Reported({"loss": 1.0})
    third = ev.Reported({"loss": 0.5})
    m.send_message(nodes[0], first)
    assert wait_until(lambda: server.event_count == 1)
    m.send_message(nodes[1], second)
    assert wait_until(lambda: server.event_count == 2)
    m.send_message(nodes[0], third)
    assert wait_until(lambda: server.event_count == 3)
    taken = server.next_events(lambda: False)
    assert taken == [(server.nodes[0], first), (server.nodes[1], second), (server.nodes[0], third)]
    assert server.take_events() == [] and server.next_events(lambda: True) == []
    assert server.event_count == 3
    assert not hasattr(server, "events")  # no list that grows with every event


def test_epoch_marks_are_kept_per_feed_and_node(server, nodes):
    for conn, epoch in [(nodes[0], 0), (nodes[0], 2), (nodes[0], 1), (nodes[1], 0)]:
        m.send_message(conn, ev.EpochRead("feed-a", epoch))
    m.send_message(nodes[1], ev.EpochRead("feed-b", 5))
    _taken(server, nodes[0])
    assert wait_until(lambda: server.event_count == 6)
    assert server.epochs_read("feed-a") == {"worker:0": 2, "worker:1": 0}  # the last epoch read through
    assert server.epochs_read("feed-b") == {"worker:1": 5}
    assert server.epochs_read("feed-c") == {}
    marks = server.epochs_read("feed-a")
    marks["worker:0"] = 99  # a copy
    assert server.epochs_read("feed-a")["worker:0"] == 2


def test_only_the_last_marked_feeds_are_remembered(server, nodes):
    count = rendezvous.MARKED_FEEDS + 10
    for i in range(count):
        m.send_message(nodes[0], ev.EpochRead(f"feed-{i}", 0))
    m.send_message(nodes[0], ev.EpochRead("feed-5", 1))  # used again
    _taken(server, nodes[0])
    assert server.epochs_read(f"feed-{count - 1}") == {"worker:0": 0}
    assert server.epochs_read("feed-5") == {"worker:0": 1}  # kept: recently used
    assert server.epochs_read("feed-6") == {}  # forgotten: 64 feeds were marked after it
    assert len(server._marks) == rendezvous.MARKED_FEEDS


def test_a_terminated_feed_is_noted_on_the_node_as_it_is_recorded(server, nodes):
    m.send_message(nodes[1], ev.FeedTerminated())
    assert wait_until(lambda: server.nodes[1].feed_ended)
    assert not server.nodes[0].feed_ended


def test_a_watcher_that_falls_behind_loses_the_oldest_reports_not_the_notices(server, nodes, monkeypatch, caplog):
    monkeypatch.setattr(rendezvous, "EVENT_BACKLOG", 50)
    stall = ev.FeedStalled("f", 1, timeout=1.0)
    with caplog.at_level(logging.WARNING, logger="tfonspark.driver.nodes.rendezvous"):
        m.send_message(nodes[0], stall)
        for step in range(120):
            m.send_message(nodes[0], ev.Reported({"step": step}))
        assert wait_until(lambda: server.event_count == 121)
    events = [e for _, e in server.take_events()]
    assert len(events) == 50 and events[0] == stall
    assert [e.metrics["step"] for e in events[1:] if isinstance(e, ev.Reported)] == list(range(71, 120))
    assert server.dropped == 71
    assert "fell behind by over 50 events" in caplog.text and "dropped the oldest waiting event" in caplog.text


def test_the_backlog_is_bounded_in_bytes(server, nodes, monkeypatch):
    monkeypatch.setattr(rendezvous, "BACKLOG_BYTES", 10 * 1024)
    for step in range(20):
        m.send_message(nodes[0], ev.Reported({"step": step, "pad": "p" * 1000}))
    assert wait_until(lambda: server.event_count == 20)
    steps = [e.metrics["step"] for _, e in server.take_events() if isinstance(e, ev.Reported)]
    assert 5 <= len(steps) <= 10 and steps == list(range(20 - len(steps), 20))
