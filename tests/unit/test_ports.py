"""ports.py: exclusive port reservation, and the hand-over: the node's port stays held until its server
binds it (issue 21, row 1).

TF's servers are stood in for by functions that bind like TF 2.21's gRPC server does (strace:
``[::]:port``, ``IPV6_V6ONLY`` off, ``SO_REUSEADDR``, no ``SO_REUSEPORT``, then ``listen``);
tests/integration/test_port_handover.py runs the real TF.
"""

from __future__ import annotations

import _socket
import contextlib
import errno
import logging
import os
import socket
import subprocess
import sys
import textwrap
import time
from types import ModuleType, SimpleNamespace

import pytest

from tfonspark import host, ports
from tfonspark.errors import ClusterError, ConfigError
from tfonspark.importhook import AfterImport
from tfonspark.tfprocess.context import NodeContext

from ._port_range import free_range, listening

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux bind() rules")

SESSION = "tensorflow.python.client.pywrap_tf_session"
EAGER = "tensorflow.python.pywrap_tfe"


@pytest.fixture(autouse=True)
def no_hooks_left():
    yield
    left = ports.pending_handovers()
    ports.release_handovers()
    assert not left, "a test left a reservation held"
    assert "bind" not in socket.socket.__dict__, "socket.bind is still hooked"
    assert not any(isinstance(f, AfterImport) for f in sys.meta_path)


def _addresses() -> list[tuple[int, str]]:
    found = [(socket.AF_INET, "0.0.0.0"), (socket.AF_INET, "127.0.0.1")]
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
        found += [(socket.AF_INET6, "::"), (socket.AF_INET6, "::1")]
    except OSError:
        pass
    return found


def _taken_by(port: int, reuseaddr: bool = False) -> list[str]:
    """The addresses another socket could bind ``port`` on right now (bind + listen, then closed)."""
    took = []
    for family, address in _addresses():
        with socket.socket(family) as sock:
            if reuseaddr:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                _socket.socket.bind(sock, (address, port))  # from C, as another process would: no hook
                sock.listen(1)
            except OSError as exc:
                assert exc.errno == errno.EADDRINUSE
            else:
                took.append(address)
    return took


def _grpc_bind(port: int) -> socket.socket:
    """What TF 2.21's gRPC server does with its port (from C++: Python's socket.bind is not involved)."""
    family = socket.AF_INET6 if socket.has_ipv6 else socket.AF_INET
    sock = socket.socket(family)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    _socket.socket.bind(sock, ("::" if family == socket.AF_INET6 else "0.0.0.0", port))  # from C++
    sock.listen(16)
    return sock


def _node(sock: socket.socket | None) -> NodeContext:
    return NodeContext(
        executor_id=0,
        job_name="worker",
        task_index=0,
        cluster_spec={"worker": ["127.0.0.1:1"]},
        default_fs="file://",
        working_dir="/tmp",
        tmp_socket=sock,
    )


@pytest.fixture
def fake_tf(monkeypatch):
    """TF's two server-start modules, each starting a gRPC-like server on the port it is given."""
    seen: dict[str, list] = {"during": []}

    def start(port):
        seen["during"].append(_taken_by(port))  # what another process could take mid-start
        return _grpc_bind(port)

    session = ModuleType(SESSION)
    session.TF_NewServer = start
    eager = ModuleType(EAGER)
    eager.TFE_EnableCollectiveOps = lambda handle, port: start(port)
    eager.TFE_ContextSetServerDef = lambda handle, keep_alive, port: start(port)
    monkeypatch.setitem(sys.modules, SESSION, session)
    monkeypatch.setitem(sys.modules, EAGER, eager)
    return SimpleNamespace(session=session, eager=eager, start=start, seen=seen)


# ---- held until the server binds it --------------------------------------------------------------


@pytest.mark.parametrize("call", ["TF_NewServer", "TFE_EnableCollectiveOps", "TFE_ContextSetServerDef"])
def test_the_port_stays_held_until_tf_starts_its_server(fake_tf, call):
    """The TF process released the port before map_fun was even unpickled; another user
    spinning on bind() took it, and TF's server then failed or lost the peers to it."""
    reserved = ports.reserve_port()
    port = reserved.getsockname()[1]
    ctx = _node(reserved)
    ctx.release_port()  # what the TF process does before map_fun (release_port=True)
    assert ctx.tmp_socket is None and reserved.fileno() == -1
    time.sleep(0.05)  # map_fun is unpickled, imports TF, builds its model...
    assert _taken_by(port) == [] and _taken_by(port, reuseaddr=True) == []  # nobody, whatever options
    if call == "TF_NewServer":
        started = fake_tf.session.TF_NewServer(port)
    elif call == "TFE_EnableCollectiveOps":  # MultiWorkerMirroredStrategy()
        started = fake_tf.eager.TFE_EnableCollectiveOps("ctx", port)
    else:  # connect_to_cluster, ParameterServerStrategy's coordinator
        started = fake_tf.eager.TFE_ContextSetServerDef("ctx", 600, port)
    with started:
        assert fake_tf.seen["during"] == [[]]  # no socket without SO_REUSEADDR got it mid-start: no gap
        assert started.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
        assert _taken_by(port, reuseaddr=True) == []  # the server has it now
        assert ports.pending_handovers() == []  # and the reservation is gone
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            started.accept()[0].close()  # the peer reached the server
    assert fake_tf.session.TF_NewServer is fake_tf.start  # the hooks are gone with it


def test_a_tf_imported_after_the_release_is_hooked_as_it_loads(tmp_path, monkeypatch):
    (tmp_path / "fake_tf_server_lib.py").write_text(
        textwrap.dedent(
            """
            import _socket
            import socket

            def new_server(port):
                sock = socket.socket(socket.AF_INET6)
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                _socket.socket.bind(sock, ("::", port))
                sock.listen(1)
                return sock
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(ports.SERVER_STARTS, "fake_tf_server_lib", ("new_server",))
    monkeypatch.delitem(sys.modules, "fake_tf_server_lib", raising=False)
    reserved = ports.reserve_port()
    port = reserved.getsockname()[1]
    _node(reserved).release_port()
    import fake_tf_server_lib  # as `import tensorflow` in map_fun, after the release

    assert getattr(fake_tf_server_lib.new_server, "_tfos_handover", False)
    with fake_tf_server_lib.new_server(port):
        assert ports.pending_handovers() == []


def test_a_tf_without_the_expected_server_start_gets_the_port_at_once(monkeypatch, caplog):
    odd = ModuleType(SESSION)  # a TF whose server start we cannot see: do not block its server
    monkeypatch.setitem(sys.modules, SESSION, odd)
    reserved = ports.reserve_port()
    port = reserved.getsockname()[1]
    with caplog.at_level(logging.WARNING, logger="tfonspark.ports"):
        _node(reserved).release_port()
    assert "has no TF_NewServer" in caplog.text and "releasing it now" in caplog.text
    assert ports.pending_handovers() == []
    _grpc_bind(port).close()


# ---- Python binds, explicit release, forks -------------------------------------------------------


@pytest.mark.parametrize("reuseaddr", [True, False])
def test_a_python_bind_of_the_port_gets_it(reuseaddr):
    """TFoS programs call ctx.release_port() and then bind the port themselves."""
    reserved = ports.reserve_port()
    port = reserved.getsockname()[1]
    _node(reserved).release_port()
    with socket.socket() as other:  # another port: untouched, the reservation stays
        other.bind(("127.0.0.1", 0))
    assert len(ports.pending_handovers()) == 1
    with socket.socket() as mine:
        if reuseaddr:
            mine.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        mine.bind(("127.0.0.1", port))
        mine.listen(1)
        assert ports.pending_handovers() == []


def test_release_port_now_frees_the_port_at_once():
    for deferred_first in (False, True):
        reserved = ports.reserve_port()
        port = reserved.getsockname()[1]
        ctx = _node(reserved)
        if deferred_first:
            ctx.release_port()
            assert _taken_by(port) == []
        ctx.release_port(now=True)  # a server in a child process, or outside Python and TF
        assert ctx.tmp_socket is None and ports.pending_handovers() == []
        with socket.socket() as anyone:
            anyone.bind(("0.0.0.0", port))


def test_a_forked_child_does_not_keep_the_port_from_the_server():
    reserved = ports.reserve_port()
    port = reserved.getsockname()[1]
    _node(reserved).release_port()
    ready_r, ready_w = os.pipe()
    pid = os.fork()  # e.g. a multiprocessing pool started in map_fun before the strategy
    if pid == 0:
        os.write(ready_w, b"x")
        time.sleep(5)
        os._exit(0)
    try:
        os.read(ready_r, 1)
        ports.release_handovers()  # the parent's copy goes...
        with socket.socket() as anyone:  # ...and the child's went at the fork
            anyone.bind(("0.0.0.0", port))
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.close(ready_r)
        os.close(ready_w)


def test_the_held_port_is_not_inherited_by_child_processes():
    reserved = ports.reserve_port()
    assert reserved.get_inheritable()  # so the supervisor can pass it to the TF process
    _node(reserved).release_port()
    (handover,) = ports.pending_handovers()
    assert not handover._sock.get_inheritable()
    handover.release()


def test_start_cluster_server_leaves_nothing_held_whatever_tf_does(monkeypatch):
    fake = SimpleNamespace(
        train=SimpleNamespace(ClusterSpec=lambda spec: spec),
        distribute=SimpleNamespace(Server=lambda cluster, **kw: "a server that bound nothing"),
    )
    monkeypatch.setitem(sys.modules, "tensorflow", fake)
    reserved = ports.reserve_port()
    port = reserved.getsockname()[1]
    ctx = _node(reserved)
    assert ctx.start_cluster_server() == ({"worker": ["127.0.0.1:1"]}, "a server that bound nothing")
    assert ports.pending_handovers() == []
    with socket.socket() as anyone:
        anyone.bind(("0.0.0.0", port))


# ---- issue 43, row 4: another user's socket that got in during TF's own start ---------------------


def _grpc_start(port: int) -> socket.socket:
    """TF 2.21's gRPC server with its fallback: ``[::]:port``, else ``0.0.0.0:port`` (where the
    dual-stack bind failed, e.g. beside a listener on ``[::1]``), else "Could not start"."""
    try:
        return _grpc_bind(port)
    except OSError:
        pass
    sock = socket.socket(socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        _socket.socket.bind(sock, ("0.0.0.0", port))
        sock.listen(16)
    except OSError:
        sock.close()
        raise RuntimeError("UnknownError: Could not start gRPC server") from None
    return sock


class _Intruder:
    """Another process that binds ``address`` with SO_REUSEADDR and listens (TF's window: the
    reservation shares the port while TF starts), until closed."""

    def __init__(self, address: str, port: int) -> None:
        import subprocess

        family = "AF_INET6" if ":" in address else "AF_INET"
        code = (
            f"import socket, sys; s = socket.socket(socket.{family}); "
            "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
            f"s.bind(({address!r}, {port})); s.listen(1); print('up', flush=True); sys.stdin.read()"
        )
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.proc.stdout is not None and self.proc.stdout.readline() == b"up\n"

    def close(self) -> None:
        self.proc.communicate(timeout=10)


@pytest.mark.parametrize(("address", "tf_fails"), [("::1", False), ("127.0.0.1", True), ("::", True)])
def test_a_socket_that_got_in_during_tfs_start_fails_the_node_naming_it(fake_tf, address, tf_fails):
    """Seen: a listener co-bound on [::1] during TF's start let TF start (on 0.0.0.0) and got the
    ::1 peers; one on the wildcard made TF fail with no word of who holds the port."""
    reserved = ports.reserve_port()
    port = reserved.getsockname()[1]
    intruders: list[_Intruder] = []

    def start_beside_an_intruder(handle, port=port):
        intruders.append(_Intruder(address, port))  # in the window: the reservation shares the port now
        return _grpc_start(port)

    fake_tf.eager.TFE_EnableCollectiveOps = start_beside_an_intruder
    _node(reserved).release_port()  # hooks TF's loaded modules
    try:
        with pytest.raises(ClusterError) as info:
            fake_tf.eager.TFE_EnableCollectiveOps("ctx")
        text = str(info.value)
        shown = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
        assert f"another process also listens on this node's port {port}: {shown} (uid {os.getuid()})" in text
        assert ("Could not start gRPC server" in text) is tf_fails  # TF's own error, where it had one
        assert ports.pending_handovers() == []
    finally:
        for intruder in intruders:
            intruder.close()


def test_a_server_alone_on_its_port_starts(fake_tf):
    reserved = ports.reserve_port()
    port = reserved.getsockname()[1]
    _node(reserved).release_port()
    with fake_tf.eager.TFE_EnableCollectiveOps("ctx", port):
        assert ports.foreign_listeners(port) == []  # its own listener is not foreign
        with socket.socket() as other:
            other.bind(("127.0.0.1", 0))
            other.listen(1)
            assert ports.foreign_listeners(other.getsockname()[1]) == []  # nor any other of this process


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


# ---- the port range (the port_range setting) -------------------------------------------------------


def _bounds(spec: str) -> tuple[int, int]:
    low, high = spec.split("-")
    return int(low), int(high)


def test_reservations_from_a_range_take_its_free_ports_from_the_low_end_without_collisions():
    """Two nodes on one host reserve from the same range: each gets its own port of it."""
    spec = free_range(4)
    low, _ = _bounds(spec)
    with contextlib.ExitStack() as held:
        first = held.enter_context(ports.reserve_port(port_range=spec, what="worker:0's TF port"))
        second = held.enter_context(ports.reserve_port(port_range=spec, what="worker:1's TF port"))
        assert [first.getsockname()[1], second.getsockname()[1]] == [low, low + 1]
        held.enter_context(listening(low + 2))  # a listener of another server of this host: skipped too
        third = held.enter_context(ports.reserve_port(port_range=spec))
        assert third.getsockname()[1] == low + 3
        assert not third.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR)  # a reservation as ever


def test_a_range_with_no_port_left_is_a_config_error_naming_the_setting_the_range_and_who_needed_it():
    spec = free_range(2)
    low, high = _bounds(spec)
    with ports.reserve_port(low), ports.reserve_port(high):
        with pytest.raises(ConfigError) as info:
            ports.reserve_port(port_range=spec, what="worker:1's TF port")
        said = str(info.value)
        assert said.startswith(f"port_range '{spec}' has no free port left for worker:1's TF port on host ")
        assert "its 2 ports are taken" in said and "spark.tfonspark.portRange" in said
        assert "TFONSPARK_PORT_RANGE" in said and "docs/ports.md" in said
        with socket.socket() as sock, pytest.raises(ConfigError, match=r"no free port left for the feed server"):
            ports.bind_within(sock, "127.0.0.1", "the feed server", spec)


def test_a_fixed_port_is_that_port_whatever_the_range():
    spec = free_range(3)
    low, high = _bounds(spec)
    with ports.reserve_port(high, port_range=f"{low}-{low}") as sock:
        assert sock.getsockname()[1] == high


def test_bind_within_takes_the_first_port_of_the_range_no_socket_holds():
    spec = free_range(3)
    low, _ = _bounds(spec)
    with ports.reserve_port(low), socket.socket() as sock:  # a node's reservation holds the first port
        assert ports.bind_within(sock, "127.0.0.1", "the feed server", spec) == low + 1
        sock.listen(1)
        assert sock.getsockname()[1] == low + 1
        with socket.socket() as other:
            assert ports.bind_within(other, "127.0.0.1", "another server", spec) == low + 2


def test_without_a_range_a_listener_takes_any_free_port():
    with socket.socket() as sock:
        port = ports.bind_within(sock, "127.0.0.1", "the feed server", "")
        assert port > 0 and sock.getsockname()[1] == port
    assert ports.range_ports("") == [0]
    assert ports.range_ports("7000") == [7000] and ports.range_ports("7000-7002") == [7000, 7001, 7002]


def test_a_process_confines_its_listeners_once_and_a_given_range_wins():
    spec, other = free_range(2), free_range(2)
    assert ports.confined() == ""
    try:
        ports.confine(spec)
        assert ports.confined() == spec
        with socket.socket() as sock:
            assert ports.bind_within(sock, "127.0.0.1", "the feed server") == _bounds(spec)[0]
        with socket.socket() as sock:
            assert ports.bind_within(sock, "127.0.0.1", "the feed server", other) == _bounds(other)[0]
        port = ports.free_port_within("127.0.0.1", "TensorBoard")
        assert port == _bounds(spec)[0]  # free again: the probe is closed
    finally:
        ports.confine("")
    with pytest.raises(ConfigError, match=r"^port_range must be .*Received: '9-1'"):
        ports.confine("9-1")


def test_a_port_a_server_of_ours_left_in_time_wait_is_skipped():
    """A restarted node's new feed server cannot bind a port whose connections linger: the next one."""
    spec = free_range(2)
    low, _ = _bounds(spec)
    server = listening(low)
    peer = socket.create_connection(("127.0.0.1", low))
    accepted = server.accept()[0]
    accepted.close()  # the server's side closes first: its end stays in TIME-WAIT
    server.close()
    peer.close()
    with socket.socket() as sock:
        assert ports.bind_within(sock, "127.0.0.1", "the feed server", spec) == low + 1


def test_a_port_held_for_a_tf_server_is_never_taken_by_our_own_listeners():
    """The driver reserves the coordinator's port (a hand-over to ParameterServerStrategy's server),
    then its rendezvous server and others look for a port of the same range. Before, the bind
    hook gave them the held port (the rendezvous server sets SO_REUSEADDR, which co-binds), and
    TF's server failed with "Could not start gRPC server" (CI, test_port_range.py)."""
    spec = free_range(3)
    low, _ = _bounds(spec)
    handover = ports.hand_over_port(ports.reserve_port(port_range=spec, what="the driver's chief task"))
    try:
        assert handover.port == low and ports.held_for_servers() == {low}
        with ports.listen_reusable("127.0.0.1", ports.range_ports(spec), 8) as rendezvous:
            assert rendezvous.getsockname()[1] == low + 1
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            assert ports.bind_within(sock, "127.0.0.1", "the feed server", spec) == low + 1
        assert handover in ports.pending_handovers()  # still held for the TF server
        with pytest.raises(OSError, match=f"port {low} is reserved in this process for a TF server"):
            ports.listen_reusable("127.0.0.1", [low], 8)
    finally:
        handover.release()
    assert ports.held_for_servers() == set()
