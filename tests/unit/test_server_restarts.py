"""Restarting a PS worker's server in place (executor/supervisor.py), and what the driver makes of it.

A real supervisor and TF process against a fake driver: the "server" is a Python listener on the
node's port, so no TensorFlow is imported. Killed, it comes back at the same port, announced by a
``ServerRestarted`` event, until ``NodeConfig.server_restarts`` is spent; then the node fails.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import types

import pytest

from tests.waiting import wait_until
from tfonspark.config import InputMode, NodeConfig
from tfonspark.driver.cluster import Reserved, Running
from tfonspark.driver.nodes.node_events import NodeEvents, ServerRestart, how_it_died
from tfonspark.driver.services.ps import PSCluster
from tfonspark.errors import NodeFailed
from tfonspark.executor.supervisor import Supervisor
from tfonspark.host import process_alive
from tfonspark.testing import FakeDriver
from tfonspark.wire import events as ev
from tfonspark.wire import messages as m
from tfonspark.wire.bootstrap import write_bootstrap

SECRET_HEX = "5a" * 32


def _config(**overrides) -> NodeConfig:
    fields = {
        "cluster_id": "server-restart-test",
        "driver_host": "127.0.0.1",
        "driver_port": 1,
        "secret_hex": SECRET_HEX,
        "reservation_timeout": 30.0,
        "heartbeat_secs": 0.2,
    }
    fields.update(overrides)
    return NodeConfig(**fields)


def _serving(args, ctx):
    """A stand-in for ``tfprocess.server.serve``: listen on the node's port as TF's server does."""
    import socket
    import time

    port = int(ctx.cluster_spec["worker"][0].rpartition(":")[2])
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as TF's gRPC server binds
    server.bind(("0.0.0.0", port))
    server.listen()
    while True:
        conn, _ = server.accept()  # a peer connects and stays: the kill leaves its connection behind
        time.sleep(120)


def _payload() -> bytes:
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        return cloudpickle.dumps((_serving, None))
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


@pytest.fixture
def supervised():
    """Start a supervisor subprocess against a fake driver: ``(fake, proc)``; both go after the test."""
    made: list[tuple[FakeDriver, subprocess.Popen]] = []

    def start(**overrides) -> tuple[FakeDriver, subprocess.Popen]:
        fake = FakeDriver(SECRET_HEX, heartbeat_secs=0.2)
        config = _config(driver_port=fake.port, **overrides)
        proc = subprocess.Popen(
            [sys.executable, "-m", "tfonspark.executor.supervisor", "--cluster", config.cluster_id[:12]],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        assert proc.stdin is not None
        write_bootstrap(proc.stdin, {"config": config.to_json(), "executor_id": 0, "gpus": []}, _payload())
        proc.stdin.close()
        made.append((fake, proc))
        return fake, proc

    yield start
    for fake, proc in made:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        fake.close()


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def _standby(label: str) -> int:
    """The pid of the standby TF process of cluster ``label`` (TensorFlow imported, waiting), or 0."""
    import psutil

    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info.get("cmdline") or []
        if "-c" in cmd and label in cmd and any("runpy" in part for part in cmd):
            return proc.pid
    return 0


def test_a_killed_worker_server_comes_back_at_its_port_until_the_limit(supervised):
    fake, proc = supervised(server_restarts=1)
    label = _config().cluster_id[:12]
    first = fake.wait_for(m.NodeUp)
    port = fake.wait_for(m.Register).port
    assert wait_until(lambda: _accepts(port), 20)
    assert wait_until(lambda: _standby(label), 20)  # its successor, started once it serves
    standby = _standby(label)
    peer = _connect(port)  # a live connection when it dies: its remains must not block the restart
    os.kill(first.tf_pid, signal.SIGKILL)
    restarted = fake.wait_for(ev.ServerRestarted, timeout=60)  # once the standby imported TensorFlow
    assert (restarted.restart, restarted.limit, restarted.exit_code, restarted.accepting) == (1, 1, -9, True)
    assert wait_until(lambda: len(fake.of(m.NodeUp)) == 2, 30)
    second = fake.of(m.NodeUp)[-1]
    assert second.tf_pid == standby and _accepts(port) and not process_alive(first.tf_pid)  # the standby took over
    assert fake.of(m.NodeExit) == []  # the driver saw no failure
    peer.close()
    os.kill(second.tf_pid, signal.SIGKILL)  # the limit is spent: now the node fails, saying so
    exit_msg = fake.wait_for(m.NodeExit, timeout=30)
    assert exit_msg.exit_code == -9 and not exit_msg.stopped
    assert "restarted in place 1 time(s)" in exit_msg.traceback
    assert len(fake.of(ev.ServerRestarted)) == 1
    assert proc.wait(15) == 0 and not process_alive(second.tf_pid) and not _accepts(port)
    assert not _standby(label)  # no standby once no restart is left


def test_without_server_restarts_a_killed_server_fails_the_node_as_before(supervised):
    fake, proc = supervised()  # server_restarts=0: MWMS nodes, anything running user code
    up = fake.wait_for(m.NodeUp)
    os.kill(up.tf_pid, signal.SIGKILL)
    exit_msg = fake.wait_for(m.NodeExit, timeout=30)
    assert exit_msg.exit_code == -9 and "restarted" not in exit_msg.traceback
    assert fake.of(ev.ServerRestarted) == [] and proc.wait(15) == 0


def test_with_spare_processes_off_a_killed_server_restarts_in_a_new_process(supervised):
    label = "no-spare-restart"
    fake, proc = supervised(server_restarts=1, spare_processes=False, cluster_id=label)
    first = fake.wait_for(m.NodeUp)
    port = fake.wait_for(m.Register).port
    assert wait_until(lambda: _accepts(port), 20)
    time.sleep(1.0)  # a standby would be starting by now
    assert not _standby(label[:12])
    os.kill(first.tf_pid, signal.SIGKILL)
    restarted = fake.wait_for(ev.ServerRestarted, timeout=60)  # slower: a new TF process starts
    assert (restarted.restart, restarted.exit_code, restarted.accepting) == (1, -9, True)
    assert wait_until(lambda: len(fake.of(m.NodeUp)) == 2, 30)
    second = fake.of(m.NodeUp)[-1]
    assert second.tf_pid != first.tf_pid and _accepts(port) and not _standby(label[:12])
    assert fake.of(m.NodeExit) == []
    os.kill(second.tf_pid, signal.SIGKILL)
    assert fake.wait_for(m.NodeExit, timeout=30).exit_code == -9 and proc.wait(15) == 0


def _accepts(port: int) -> bool:
    try:
        _connect(port).close()
        return True
    except OSError:
        return False


# ---- which deaths restart, and the port's reservation -------------------------------------------------


def _supervisor(job: str, restarts: int = 3) -> Supervisor:
    sup = Supervisor(_config(server_restarts=restarts), 0, [], b"")
    sup.job_name = job
    return sup


@pytest.mark.parametrize(
    ("job", "code", "restarts", "stop"),
    [
        ("ps", -9, 3, False),  # a ps's variables die with it: the coordinator must restore
        ("worker", 1, 3, False),  # an exception is a bug, not a lost machine
        ("worker", -9, 0, False),  # nodes that run user code (server_restarts=0)
        ("worker", -9, 3, True),  # the driver asked it to stop
    ],
)
def test_only_a_serving_worker_killed_by_a_signal_restarts(job, code, restarts, stop):
    sup = _supervisor(job, restarts)
    if stop:
        sup.terminate(0)  # no TF process at that moment (between two): still no next one
    assert not _may_restart(sup, code)


def test_a_serving_worker_killed_by_a_signal_restarts_until_the_limit():
    sup = _supervisor("worker", 3)
    assert _may_restart(sup, -9)
    sup.in_place.restarts = 3
    assert not _may_restart(sup, -9)  # spent


def _may_restart(sup: Supervisor, code: int) -> bool:
    return sup.in_place.may_restart(code, sup.job_name, sup.life.stop_asked)


# ---- the driver's side --------------------------------------------------------------------------


def test_the_driver_logs_a_restart_and_records_it(caplog):
    event = ev.ServerRestarted(restart=2, limit=3, exit_code=-9, down_s=7.25)
    node = types.SimpleNamespace(role=types.SimpleNamespace(name="worker:1", job_name="worker", task_index=1))
    with caplog.at_level(logging.WARNING, logger="tfonspark.driver.nodes.node_events"):
        NodeEvents(reports=None, feeds=None)(node, event)  # type: ignore[arg-type]
    assert "worker:1" in caplog.text and "SIGKILL" in caplog.text and "2 of at most 3" in caplog.text
    record = ServerRestart.of("worker:1", event)
    assert (record.node, record.restart, record.down_s, record.accepting) == ("worker:1", 2, 7.25, True)
    assert how_it_died(-9) == "killed by signal 9 (SIGKILL)" and how_it_died(1) == "exited with code 1"


class _Plane:
    """The control plane of a ps cluster whose check finds ``error`` (a failed node) at the block's end."""

    def __init__(self, error: Exception | None) -> None:
        self.error = error
        self.config = types.SimpleNamespace(cluster_id="c" * 32)

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def nodes(self) -> list:
        return []

    def teardown(self, grace_secs: float, final: bool = False) -> None:
        pass


class _Handover:
    def release(self) -> None:
        pass


def _ps_cluster(error: Exception | None) -> PSCluster:
    gang, streams = _Plane(error), types.SimpleNamespace(join=lambda timeout: True)
    held = Reserved("chief", _Handover(), "127.0.0.1:1")  # type: ignore[arg-type]
    running = Running(None, InputMode.TENSORFLOW, types.SimpleNamespace(gang=gang), None, streams, None, held=held)  # type: ignore[arg-type]
    return PSCluster(running)


def test_leaving_the_block_with_tfs_error_raises_the_node_failure_behind_it():
    failed = NodeFailed("TensorFlow node ps:0 (executor 0) was killed by signal 9 (SIGKILL)", role="ps", index=0)
    with pytest.raises(NodeFailed) as info, _ps_cluster(failed):
        raise RuntimeError("UnavailableError: failed to connect to all addresses")
    assert info.value is failed and isinstance(info.value.__cause__, RuntimeError)
    with pytest.raises(KeyboardInterrupt), _ps_cluster(failed):  # an interrupt stays what it is
        raise KeyboardInterrupt
    with pytest.raises(ValueError), _ps_cluster(RuntimeError("other")):  # the block's own error otherwise
        raise ValueError("the block's own")


# ---- forged ServerRestarted events (issue 43, row 8) ---------------------------------------------

GANG_SECRET = bytes.fromhex(SECRET_HEX)
GANG_CLUSTER = "forged-restarts"


@pytest.fixture
def gang_of(caplog):
    """A real rendezvous server and gang (ps:0, worker:0, worker:1) whose watcher hands events to
    the driver's ``NodeEvents``; ``gang_of(restarts)`` gives ``(gang, send, sync)``: ``send(node,
    event)`` writes an event on that node's supervisor connection, ``sync()`` waits until all sent
    so far were handed out. No TF process: the events are what a TF process could forge."""
    from tfonspark.driver.nodes.gang import Gang
    from tfonspark.driver.nodes.launcher import LocalLauncher
    from tfonspark.driver.nodes.rendezvous import RendezvousServer
    from tfonspark.driver.nodes.reports import ReportLog
    from tfonspark.driver.nodes.roles import plan_roles
    from tfonspark.wire import framing as f

    made: list[tuple[RendezvousServer, Gang, list[f.Connection]]] = []

    def start(restarts: int):
        roles = plan_roles(3, num_ps=1)
        server = RendezvousServer(GANG_CLUSTER, roles, GANG_SECRET, "127.0.0.1")
        config = _config(cluster_id=GANG_CLUSTER, server_restarts=restarts)
        seen: list[object] = []
        on_event = NodeEvents(ReportLog(lambda report: seen.append(report.metrics.get("sync"))), None)  # type: ignore[arg-type]
        gang = Gang(server, config, roles, LocalLauncher(), on_event, lambda: None)
        conns = []
        for role in roles:
            conn = f.connect(server.address, GANG_SECRET, timeout=10)
            conn.settimeout(30)
            port = 21000 + role.executor_id
            m.send_message(conn, m.Register(role.executor_id, "127.0.0.1", port, "k", os.getpid(), GANG_CLUSTER))
            conns.append(conn)
        for conn in conns:
            assert isinstance(m.recv_message(conn, m.ClusterReady), m.ClusterReady)
        gang._watcher.start()  # as Gang.start does, without launching supervisors
        made.append((server, gang, conns))
        names = {role.name: conn for role, conn in zip(roles, conns)}

        def send(node: str, event: ev.NodeEvent) -> None:
            m.send_message(names[node], event)

        def sync() -> None:
            marker = time.perf_counter_ns()
            for conn in conns:
                m.send_message(conn, ev.Reported({"sync": marker}))
            assert wait_until(lambda: seen.count(marker) == len(conns), 120)

        return gang, send, sync

    with caplog.at_level(logging.WARNING, logger="tfonspark"):
        yield start
    for server, gang, conns in made:
        for conn in conns:
            conn.close()
        gang.closed = True
        server.close()


def _restart_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and "restart" in r.getMessage()]


def test_a_flood_of_forged_restarts_keeps_only_what_a_supervisor_could_have_sent(gang_of, caplog):
    """Before: every event was kept and logged: 20,100 records and 20,100 WARNING lines (200,000: +42 MiB)."""
    gang, send, sync = gang_of(3)
    for i in range(20_000):  # a TF process counting up past the limit
        send("worker:0", ev.ServerRestarted(restart=i + 1, limit=3, exit_code=-9, down_s=0.1))
    for _ in range(100):  # a ps never restarts in place
        send("ps:0", ev.ServerRestarted(restart=1, limit=3, exit_code=-9, down_s=0.1))
    sync()
    kept = list(gang.server_restarts)
    assert [(r.node, r.restart) for r in kept] == [("worker:0", 1), ("worker:0", 2), ("worker:0", 3)]
    assert gang.server_restarts.refused == 20_000 - 3 + 100
    lines = _restart_lines(caplog)
    assert len(lines) <= 3 + 2 * 10 + 20, f"{len(lines)} WARNING lines"
    assert any("refused" in line and "ps:0" in line for line in lines)


@pytest.mark.parametrize(
    ("node", "fields", "restarts", "said"),
    [
        ("worker:0", {"restart": 4}, 3, "restart 4 of a limit of 3"),
        ("worker:0", {"restart": 0}, 3, "restart 0"),
        ("worker:0", {"limit": 99}, 3, "limit 99"),
        ("worker:0", {"exit_code": 1}, 3, "exit code 1"),
        ("ps:0", {}, 3, "only a worker restarts in place"),
        ("worker:1", {}, 0, "server_restarts=0"),
    ],
)
def test_a_restart_no_supervisor_could_have_made_is_refused_and_said_so(gang_of, caplog, node, fields, restarts, said):
    gang, send, sync = gang_of(restarts)
    event = {"restart": 1, "limit": restarts, "exit_code": -9, "down_s": 0.2, **fields}
    send(node, ev.ServerRestarted(**event))
    sync()
    assert list(gang.server_restarts) == [] and gang.server_restarts.refused == 1
    lines = _restart_lines(caplog)
    assert len(lines) == 1 and node in lines[0] and said in lines[0], lines
    assert "restarted in place (" not in lines[0]  # not the genuine restart's WARNING


def test_a_restart_number_seen_before_is_refused(gang_of, caplog):
    gang, send, sync = gang_of(3)
    for restart in (1, 1, 2, 1):
        send("worker:1", ev.ServerRestarted(restart=restart, limit=3, exit_code=-9, down_s=0.2))
    sync()
    assert [r.restart for r in gang.server_restarts] == [1, 2] and gang.server_restarts.refused == 2


def test_genuine_restarts_of_each_worker_are_kept_and_logged_once_each(gang_of, caplog):
    gang, send, sync = gang_of(3)
    for node, restart in [("worker:0", 1), ("worker:1", 1), ("worker:0", 2), ("worker:0", 3), ("worker:1", 2)]:
        send(node, ev.ServerRestarted(restart=restart, limit=3, exit_code=-9, down_s=0.2))
    sync()
    kept = [(r.node, r.restart) for r in gang.server_restarts]  # two connections: interleaved as they came
    assert [r for r in kept if r[0] == "worker:0"] == [("worker:0", 1), ("worker:0", 2), ("worker:0", 3)]
    assert [r for r in kept if r[0] == "worker:1"] == [("worker:1", 1), ("worker:1", 2)]
    assert len(gang.server_restarts) == 5 and gang.server_restarts.refused == 0
    lines = _restart_lines(caplog)
    assert len(lines) == 5 and all("restarted in place (" in line for line in lines)


def test_with_a_huge_limit_the_records_and_the_log_stay_bounded(gang_of, caplog):
    from tfonspark.driver.nodes.gang import KEEP_SERVER_RESTARTS

    gang, send, sync = gang_of(10**6)  # max_restarts=1_000_000
    total = KEEP_SERVER_RESTARTS + 2_000
    for i in range(total):
        send("worker:0", ev.ServerRestarted(restart=i + 1, limit=10**6, exit_code=-9, down_s=0.1))
    sync()
    kept = list(gang.server_restarts)
    assert len(kept) == KEEP_SERVER_RESTARTS and gang.server_restarts.dropped == 2_000
    assert kept[0].restart == 2_001 and kept[-1].restart == total  # the latest, oldest first
    assert len(_restart_lines(caplog)) <= 100 + 5
