"""Issue 43, rows 2 and 3: no moment without a socket of ours on the node's port when its server
changes process: a spare adopted at a cluster restart, a worker's server restarted in place.

The first start is ``test_port_handover.py``'s (real TensorFlow). Here the TF processes are the
real ones (a supervisor, its standby, a keeper and its spare), with a stand-in for TensorFlow:
a ``tensorflow`` package that is empty but for a ``TF_NewServer`` binding as TF 2.21's gRPC
server does (``[::]:port``, ``SO_REUSEADDR``, from C), so standbys and spares are ready at once
and the port's hand-over hooks it as it hooks TF's. Eight intruders, user nobody
(``port_intruder.py``), spin on ``bind()`` + ``listen()`` of the port, on 0.0.0.0, 127.0.0.1,
:: and ::1, each plain and with ``SO_REUSEADDR``: from the reservation (or from before the
server's death) until the new server is up for the plain ones, and until the new server's
start for the others (which TF's own start leaves a window to:
``test_port_handover.py`` measures that one). Before: the adoption closed the reservation, then
bound the spare's socket, and intruders took the port in the gap in 14 of 30 adoptions (load 3;
2 of 30 at load 5-9); a restart in place bound the port again after the death, and the
``SO_REUSEADDR`` intruders took it at the first restart in 6 of 6 runs (3 with a standby, 3
without). After: 0 of 30 adoptions and 0 of 2 x 10 restarts (these hand-overs, run more times).
"""

from __future__ import annotations

import contextlib
import glob
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import tfonspark
from tests.integration.port_intruder import Intruder
from tests.waiting import wait_until
from tfonspark.config import NodeConfig
from tfonspark.executor import spare as spare_module
from tfonspark.executor.relay import Relay
from tfonspark.executor.supervisor import Supervisor
from tfonspark.host import process_alive
from tfonspark.ports import reserve_port
from tfonspark.testing import FakeDriver
from tfonspark.wire import events as ev
from tfonspark.wire import framing as f
from tfonspark.wire import messages as m
from tfonspark.wire.bootstrap import write_bootstrap

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux bind() rules")

SECRET_HEX = "4e" * 32
SRC = Path(tfonspark.__file__).resolve().parents[1]
NICE = 10  # eight intruders spin below the nodes' priority, one always on a core the node does not use


#: the stand-in for TF's server start, binding as TF 2.21's gRPC server does (strace: ``[::]:port``,
#: ``IPV6_V6ONLY`` off, ``SO_REUSEADDR``, then ``listen``), from C: not through Python's ``socket.bind``
FAKE_SERVER_START = """\
import _socket
import socket


def TF_NewServer(port):
    sock = socket.socket(socket.AF_INET6)
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    _socket.socket.bind(sock, ("::", port))
    sock.listen(16)
    return sock
"""


def _serving(args, ctx):
    """A worker's server: waits at its start for the test's go, then starts a server as TF's does."""
    import os
    import time

    port = int(ctx.cluster_spec[ctx.job_name][ctx.task_index].rpartition(":")[2])
    gate = args["gate"]
    open(os.path.join(gate, f"starting-{os.getpid()}"), "w").close()
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(gate, "go")):  # the test stops its SO_REUSEADDR intruders first
        if time.monotonic() > deadline:
            raise TimeoutError("the test never said go")
        time.sleep(0.01)
    from tensorflow.python.client import pywrap_tf_session  # hooked by the port's hand-over as it loads

    server = pywrap_tf_session.TF_NewServer(port)
    open(os.path.join(gate, f"serving-{os.getpid()}"), "w").close()
    peers = []
    while True:
        peers.append(server.accept()[0])  # a peer stays connected: the kill leaves its connection behind


def _payload(gate: Path) -> bytes:
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        return cloudpickle.dumps((_serving, {"gate": str(gate)}))
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


@pytest.fixture
def no_tensorflow(tmp_path, monkeypatch):
    """A stand-in ``tensorflow`` (:data:`FAKE_SERVER_START`) first on the path of every process started from here."""
    fake = tmp_path / "fake"
    (fake / "tensorflow" / "python" / "client").mkdir(parents=True)
    for package in ("tensorflow", "tensorflow/python", "tensorflow/python/client"):
        (fake / package / "__init__.py").write_text("")
    (fake / "tensorflow" / "python" / "client" / "pywrap_tf_session.py").write_text(FAKE_SERVER_START)
    path = os.pathsep.join([str(fake), str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])])
    monkeypatch.setenv("PYTHONPATH", path)
    gate = tmp_path / "gate"
    gate.mkdir()
    return gate


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
        return True
    except OSError:
        return False


def _starting(gate: Path) -> set[str]:
    return set(glob.glob(str(gate / "starting-*")))


def _served(gate: Path, starting: str) -> bool:
    """Whether the server whose start wrote ``starting`` is up: its start returned, the port sealed."""
    return os.path.exists(starting.replace("starting-", "serving-"))


ADDRESSES = ["0.0.0.0", "127.0.0.1", "::", "::1"]


def _through_a_handover(gate: Path, port: int, hand_over, seen: set[str]) -> dict[str, dict]:
    """Intruders spin from before ``hand_over()`` until the new server listens; their reports,
    by ``"plain 0.0.0.0"``, ``"reuseaddr ::1"``...: one intruder per address and kind, each
    spinning on its own address (one spinning on four missed gaps of a few microseconds).

    Where the new server never starts (its port was taken) the reports say so: ``"started"``.
    """
    (gate / "go").unlink(missing_ok=True)
    plain = {f"plain {a}": Intruder(port, False, NICE, [a]) for a in ADDRESSES}
    reuse = {f"reuseaddr {a}": Intruder(port, True, NICE, [a]) for a in ADDRESSES}
    started = False
    try:
        hand_over()
        started = wait_until(lambda: _starting(gate) - seen, 30)
        new = _starting(gate) - seen
        seen |= new
        for intruder in reuse.values():  # TF's own start would leave them a window: test_port_handover.py's
            intruder.stop()
        (gate / "go").touch()
        started = started and wait_until(lambda: all(_served(gate, path) for path in new), 30) and _accepts(port)
    finally:
        reports = {name: intruder.stop() for name, intruder in {**reuse, **plain}.items()}
    return {**reports, "started": {"took": "" if started else "the new server never started"}}


def _spun(reports: dict[str, dict]) -> bool:
    """Whether every intruder spun (more than 100 binds refused) through the hand-over."""
    return all(r["attempts"] > 100 for name, r in reports.items() if name != "started")


# ---- row 3: a worker's server restarted in place ------------------------------------------------


def _supervise(fake: FakeDriver, gate: Path, label: str, restarts: int, spare_processes: bool) -> subprocess.Popen:
    """A supervisor of one worker that restarts in place, against ``fake``; its first server up."""
    config = NodeConfig(
        cluster_id=label,
        driver_host="127.0.0.1",
        driver_port=fake.port,
        secret_hex=SECRET_HEX,
        reservation_timeout=30.0,
        heartbeat_secs=0.2,
        server_restarts=restarts,
        spare_processes=spare_processes,
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "tfonspark.executor.supervisor", "--cluster", label[:12]],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    assert proc.stdin is not None
    write_bootstrap(proc.stdin, {"config": config.to_json(), "executor_id": 0, "gpus": []}, _payload(gate))
    proc.stdin.close()
    (gate / "go").touch()
    return proc


def _bindable(port: int) -> list[str]:
    """Where another socket binds ``port`` now: ``"reuseaddr ::1"``... (``[]``: nowhere)."""
    took = []
    for family, address in [(socket.AF_INET, a) if "." in a else (socket.AF_INET6, a) for a in ADDRESSES]:
        for reuse in (0, 1):
            with socket.socket(family) as other:
                other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, reuse)
                with contextlib.suppress(OSError):
                    other.bind((address, port))
                    took.append(f"{'reuseaddr' if reuse else 'plain'} {address}")
    return took


def test_a_frozen_supervisor_still_holds_the_port_of_its_dead_server(no_tensorflow):
    """The worst moment for the old gap, made to last: the supervisor stopped (SIGSTOP) when its
    server dies. The port was free until the supervisor bound it again; now its reservation,
    kept all along, holds it whatever the supervisor is doing."""
    gate = no_tensorflow
    fake = FakeDriver(SECRET_HEX, heartbeat_secs=0.2)
    proc = _supervise(fake, gate, f"row3f-{os.getpid()}", 1, False)
    try:
        port = fake.wait_for(m.Register).port
        assert wait_until(lambda: fake.of(m.NodeUp), 30)
        tf_pid = fake.of(m.NodeUp)[-1].tf_pid
        assert wait_until(lambda: _served(gate, str(gate / f"starting-{tf_pid}")), 30) and _accepts(port)
        peer = socket.create_connection(("127.0.0.1", port), timeout=5)  # it lingers after the death
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            os.kill(tf_pid, signal.SIGKILL)
            assert wait_until(lambda: not _accepts(port), 10)  # the server is gone...
            assert _bindable(port) == []  # ...and nobody else binds its port, with SO_REUSEADDR or without
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        peer.close()
        assert wait_until(lambda: fake.of(ev.ServerRestarted), 30), fake.of(m.NodeExit)
        assert fake.of(ev.ServerRestarted)[0].accepting and _accepts(port)
    finally:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        fake.close()


@pytest.mark.parametrize("spare_processes", [True, False])  # by its standby; by a new TF process
def test_no_intruder_gets_the_port_of_a_server_restarted_in_place(no_tensorflow, spare_processes):
    gate, restarts = no_tensorflow, 3
    fake = FakeDriver(SECRET_HEX, heartbeat_secs=0.2)
    proc = _supervise(fake, gate, f"row3-{os.getpid()}", restarts, spare_processes)
    try:
        port = fake.wait_for(m.Register).port
        assert wait_until(lambda: fake.of(m.NodeUp), 30)
        first = str(gate / f"starting-{fake.of(m.NodeUp)[-1].tf_pid}")
        assert wait_until(lambda: _served(gate, first), 30) and _accepts(port), "the first server never listened"
        seen, won = _starting(gate), []
        for restart in range(1, restarts + 1):
            assert wait_until(lambda n=restart: len(fake.of(m.NodeUp)) >= n, 30)
            up = fake.of(m.NodeUp)[-1]
            time.sleep(1.0 if spare_processes else 0)  # its standby started once it served
            peer = socket.create_connection(("127.0.0.1", port), timeout=5)  # it lingers after the death

            def kill(pid: int = up.tf_pid) -> None:
                os.kill(pid, signal.SIGKILL)

            reports = _through_a_handover(gate, port, kill, seen)
            peer.close()
            won += [(restart, name, r) for name, r in reports.items() if r.get("took")]
            if won:
                break
            assert _spun(reports), reports
            assert wait_until(lambda n=restart: len(fake.of(ev.ServerRestarted)) >= n, 30), fake.of(m.NodeExit)
        assert won == []  # 0 wins in 3 restarts, 8 intruders each
        assert [e.accepting for e in fake.of(ev.ServerRestarted)] == [True] * restarts
        assert fake.of(m.NodeExit) == []
    finally:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        fake.close()


# ---- row 2: a spare adopted at a cluster restart --------------------------------------------------


def _config(**overrides) -> NodeConfig:
    fields = {
        "cluster_id": f"row2-{os.getpid()}",
        "driver_host": "127.0.0.1",
        "driver_port": 1,
        "secret_hex": SECRET_HEX,
        "heartbeat_timeout": 600.0,
    }
    return NodeConfig(**{**fields, **overrides})


def test_no_intruder_gets_the_port_of_an_adopted_spare(no_tensorflow, monkeypatch):
    gate, trials, won = no_tensorflow, 10, []
    monkeypatch.setattr(spare_module, "SPARE_DELAY_SECS", 0.0)
    seen: set[str] = set()
    for trial in range(trials):
        port_sock = reserve_port()  # the next attempt's supervisor's reservation
        port = port_sock.getsockname()[1]
        ready = m.ClusterReady("worker", 0, {"worker": [f"127.0.0.1:{port}"]})
        before = Supervisor(_config(keep_spare=True, cluster_id=f"row2-{os.getpid()}-{trial}"), 0, [], b"")
        before.spares.keep(ready, before.done)  # the failed attempt's spare, as its supervisor keeps it
        assert before.spares.keeper is not None
        assert wait_until(lambda b=before: os.path.exists(b.spares.paths()[0]), 30), "the keeper never listened"
        before._release_spare((1, "Traceback: the failure a restart follows"))
        after = Supervisor(_config(attempt=1, cluster_id=before.config.cluster_id), 0, [], _payload(gate))
        ends = socket.socketpair()
        key = os.urandom(32)
        conn, driver = f.Connection(ends[0], key, True), f.Connection(ends[1], key, False)
        outcome: list[object] = []

        def lives(sup=after, sock=port_sock, conn=conn, ready=ready, outcome=outcome) -> None:
            try:
                outcome.append(sup._lives(Relay(conn, 0), ready, "127.0.0.1", sock))
            except BaseException as exc:  # the port was taken: the adoption fails
                outcome.append(exc)

        thread = threading.Thread(target=lives, daemon=True)
        try:
            reports = _through_a_handover(gate, port, thread.start, seen)
            assert after.spares.adopted or reports["started"]["took"], outcome  # the spare, not a new process, serves
        finally:
            if after.proc is not None and process_alive(after.proc.pid):
                os.killpg(after.proc.pid, signal.SIGKILL)
            thread.join(30)
            port_sock.close()
            conn.close()
            driver.close()
        won += [(trial, name, r) for name, r in reports.items() if r.get("took")]
        if won:
            break
        assert _spun(reports), reports
    assert won == []  # 0 wins in 10 adoptions, 8 intruders each
