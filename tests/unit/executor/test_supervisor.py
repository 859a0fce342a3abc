"""executor/supervisor.py: the supervisor and the TF process entry, without Spark: heartbeats,
deadlines, event relay, no feed socket or scratch directory left behind on any failure path, and a
PS worker's server restarted in place (real subprocesses against a fake driver)."""

from __future__ import annotations

import contextlib
import glob
import io
import json
import operator
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types

import pytest

from tests.waiting import wait_until
from tfonspark.config import InputMode, NodeConfig
from tfonspark.errors import ConfigError
from tfonspark.executor import supervisor as supervisor_module
from tfonspark.executor.relay import Relay
from tfonspark.executor.supervisor import Supervisor
from tfonspark.host import process_alive
from tfonspark.testing import FakeDriver
from tfonspark.tfprocess import entry
from tfonspark.wire import events as ev
from tfonspark.wire import framing as f
from tfonspark.wire import messages as m
from tfonspark.wire.bootstrap import STATUS_PREFIX, write_bootstrap

from .._port_range import free_range

SECRET_HEX = "5a" * 32


def _config(**overrides) -> NodeConfig:
    fields = {
        "cluster_id": "supervisor-unit-test",
        "driver_host": "127.0.0.1",
        "driver_port": 1,
        "secret_hex": SECRET_HEX,
        "reservation_timeout": 30.0,
    }
    fields.update(overrides)
    return NodeConfig(**fields)


def _feed_dirs() -> set[str]:
    """Feed socket dirs and the TF processes' private temp dirs (which hold them under a supervisor)."""
    tmp = tempfile.gettempdir()
    return set(glob.glob(os.path.join(tmp, "tfos-feed-*")) + glob.glob(os.path.join(tmp, "tfos-node-*")))


# ---- relaying the TF process's events -----------------------------------------------------------


def test_relay_forwards_feed_up_events_and_errors(pair, capsys):
    sup_end, drv_end = pair
    relay = Relay(sup_end, 3)
    lines = [
        ev.to_line(ev.FeedSocket("/tmp/tfos-feed-x/feed.sock")),
        "not json at all\n",
        ev.to_line(ev.FeedStalled("f1", 4, timeout=9.0)),
        ev.to_line(ev.ProcessUp("10.0.0.7", 5555, "/tmp/tfos-feed-x/feed.sock", "http://10.0.0.7:6006")),
        'J{"type": "odd", "detail": ["not", "a", "dict"]}\n',  # no such event: skipped
        'J{"type": "feed_stalled", "partition": "4"}\n',  # malformed: skipped
        ev.to_line(m.Heartbeat()),  # not a status line: skipped
        ev.to_line(ev.ProcessError("Traceback: boom")),
    ]
    text = "".join(lines)
    assert relay.data_path == ""
    error = relay.status(io.StringIO(text), 4242, [])
    assert error == "Traceback: boom"
    assert relay.data_path == "/tmp/tfos-feed-x/feed.sock"
    got = [m.recv_message(drv_end) for _ in range(2)]
    assert got[0] == ev.FeedStalled("f1", 4, timeout=9.0)
    assert got[1] == m.NodeUp(3, 4242, "10.0.0.7", 5555, "http://10.0.0.7:6006", "/tmp/tfos-feed-x/feed.sock")
    drv_end.settimeout(0.2)
    with pytest.raises(OSError):  # nothing else was relayed
        m.recv_message(drv_end)
    out = capsys.readouterr().out
    assert STATUS_PREFIX + ev.to_line(ev.TaskUp(4242)) in out


def test_relay_outlives_a_driver_that_is_gone(pair):
    sup_end, drv_end = pair
    drv_end.close()
    lines = [ev.FeedTerminated(), ev.ProcessUp("h", 0), ev.ProcessError("tb")]
    status = io.StringIO("".join(ev.to_line(x) for x in lines))
    assert Relay(sup_end, 0).status(status, 1, []) == "tb"  # no exception: await_stop sees the loss


# ---- heartbeats and the driver's deadline ---------------------------------------------------------


def _listening(sup: Supervisor, conn: f.Connection) -> tuple[threading.Thread, list[float]]:
    stopped: list[float] = []
    sup.terminate = lambda grace, force=False, why=None: stopped.append(grace)  # type: ignore[method-assign]
    thread = threading.Thread(target=sup._obey_driver, args=(Relay(conn, 0),), daemon=True)
    thread.start()
    return thread, stopped


def test_listen_ignores_heartbeats_and_obeys_stop(pair):
    sup_end, drv_end = pair
    thread, stopped = _listening(Supervisor(_config(heartbeat_timeout=0.6), 0, [], b""), sup_end)
    for _ in range(8):  # 1.2 s of heartbeats, twice the deadline: still listening
        m.send_message(drv_end, m.Heartbeat())
        time.sleep(0.15)
    assert thread.is_alive() and stopped == []
    m.send_message(drv_end, m.Stop(7.5))
    thread.join(5)
    assert not thread.is_alive() and stopped == [7.5]


def test_listen_takes_silence_past_the_deadline_as_driver_gone(pair):
    sup_end, _drv_end = pair
    start = time.monotonic()
    thread, stopped = _listening(Supervisor(_config(heartbeat_timeout=0.5), 0, [], b""), sup_end)
    thread.join(5)
    assert not thread.is_alive() and stopped == [0.0]
    assert 0.4 < time.monotonic() - start < 3


def test_listen_takes_a_broken_connection_as_driver_gone(pair):
    sup_end, drv_end = pair
    thread, stopped = _listening(Supervisor(_config(), 0, [], b""), sup_end)
    drv_end.close()
    thread.join(5)
    assert not thread.is_alive() and stopped == [0.0]


def test_listen_rejects_unexpected_messages(pair):
    sup_end, drv_end = pair
    thread, stopped = _listening(Supervisor(_config(), 0, [], b""), sup_end)
    m.send_message(drv_end, m.Ack(1))
    thread.join(5)
    assert not thread.is_alive() and stopped == [0.0]


def test_heartbeats_flow_until_the_node_exits(pair):
    sup_end, drv_end = pair
    sup = Supervisor(_config(heartbeat_secs=0.05), 0, [], b"")
    beats = (sup.config.heartbeat_secs, sup.done)
    thread = threading.Thread(target=Relay(sup_end, 0).heartbeats, args=beats, daemon=True)
    thread.start()
    drv_end.settimeout(5)
    for _ in range(3):
        assert isinstance(m.recv_message(drv_end), m.Heartbeat)
    sup.done.set()
    thread.join(2)
    assert not thread.is_alive()


def test_heartbeat_thread_ends_when_the_driver_is_gone(pair):
    sup_end, drv_end = pair
    drv_end.close()
    sup = Supervisor(_config(heartbeat_secs=0.02), 0, [], b"")
    beats = (sup.config.heartbeat_secs, sup.done)
    thread = threading.Thread(target=Relay(sup_end, 0).heartbeats, args=beats, daemon=True)
    thread.start()
    thread.join(5)
    assert not thread.is_alive()


def test_waiting_for_the_cluster_skips_heartbeats_and_is_bounded(pair, monkeypatch):
    from tfonspark.executor import supervisor

    sup_end, drv_end = pair
    sup = Supervisor(_config(), 0, [], b"")
    m.send_message(drv_end, m.Heartbeat())
    m.send_message(drv_end, m.ClusterReady("worker", 0, {"worker": ["h:1"]}))
    assert sup._await_cluster(sup_end) == m.ClusterReady("worker", 0, {"worker": ["h:1"]})
    assert sup_end.sock.gettimeout() is None
    monkeypatch.setattr(supervisor, "CLUSTER_MARGIN_SECS", 0.0)
    sup = Supervisor(_config(reservation_timeout=0.5), 0, [], b"")
    start = time.monotonic()
    with pytest.raises(OSError):  # socket.timeout: no cluster within the deadline
        m.send_message(drv_end, m.Heartbeat())  # heartbeats alone do not extend it
        sup._await_cluster(sup_end)
    assert 0.4 < time.monotonic() - start < 3
    assert sup_end.sock.gettimeout() is None


# ---- the TF process entry: status lines, and the feed socket on every failure path ----------------


class _Unpicklable:
    """Pickles fine on the driver; unpickling it in the TF process raises ZeroDivisionError."""

    def __reduce__(self):
        return operator.truediv, (1, 0)


def _payload(map_fun, tf_args) -> bytes:
    from pyspark import cloudpickle

    return cloudpickle.dumps((map_fun, tf_args))


@pytest.fixture
def reset_entry_state():
    yield
    entry._State.feed_path = ""
    entry._State.own_group = False


def _header(config: NodeConfig, port_sock: socket.socket) -> dict:
    return {
        "config": config.to_json(),
        "executor_id": 0,
        "job_name": "worker",
        "task_index": 0,
        "cluster_spec": {"worker": ["127.0.0.1:1"]},
        "host": "127.0.0.1",
        "port_fd": os.dup(port_sock.fileno()),
        "working_dir": os.getcwd(),
    }


def _events(text: str) -> list[m.Message]:
    return [ev.from_line(line) for line in text.splitlines()]


def test_entry_closes_the_feed_server_when_the_payload_cannot_be_unpickled(reset_entry_state):
    before = _feed_dirs()
    status = io.StringIO()
    with socket.socket() as port_sock:
        port_sock.bind(("127.0.0.1", 0))
        header = _header(_config(input_mode=InputMode.SPARK), port_sock)
        with pytest.raises(ZeroDivisionError):
            entry.run(header, _payload(lambda args, ctx: None, _Unpicklable()), status)
    events = _events(status.getvalue())
    assert [type(e) for e in events] == [ev.FeedSocket]  # told before anything could fail
    assert isinstance(events[0], ev.FeedSocket)
    path = events[0].data_path
    assert path.endswith("feed.sock") and not os.path.exists(os.path.dirname(path))
    assert _feed_dirs() == before and entry._State.feed_path == ""


@pytest.mark.parametrize(("bind_host", "bound_to"), [("", "127.0.0.1"), ("0.0.0.0", "0.0.0.0")])
def test_entry_binds_the_feed_server_to_the_bind_host(reset_entry_state, tmp_path, bind_host, bound_to):
    def map_fun(args, ctx):
        with open(args, "w") as out:
            json.dump(list(ctx.mgr.address), out)

    status = io.StringIO()
    with socket.socket() as port_sock:
        port_sock.bind(("127.0.0.1", 0))
        header = _header(_config(input_mode=InputMode.SPARK, bind_host=bind_host), port_sock)
        assert entry.run(header, _payload(map_fun, str(tmp_path / "bound")), status) == 0
    up = next(e for e in _events(status.getvalue()) if isinstance(e, ev.ProcessUp))
    bound = json.loads((tmp_path / "bound").read_text())
    assert bound[0] == bound_to
    assert up.host == "127.0.0.1" and up.data_port == bound[1]  # never the wildcard
    assert not os.path.exists(os.path.dirname(up.data_path))


def test_feed_server_events_become_status_lines_from_any_thread():
    status = io.StringIO()
    sink = entry._event_sink(status)
    threads = [
        threading.Thread(target=lambda i=i: [sink(ev.FeedStalled("y" * 200, i, received=k)) for k in range(200)])
        for i in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sink(ev.Reported({"obj": object()}))  # not JSON (ctx.report refuses it first): dropped, never raises
    events = _events(status.getvalue())
    assert len(events) == 8 * 200
    assert all(isinstance(e, ev.FeedStalled) for e in events)
    assert sorted((e.partition, e.received) for e in events) == [(i, k) for i in range(8) for k in range(200)]


def test_a_dead_supervisor_makes_the_tf_process_remove_its_socket(monkeypatch, reset_entry_state):
    class Exited(Exception):
        pass

    def fake_exit(code):
        raise Exited(code)

    listener = f.listen_unix("tfos-feed-")
    assert listener is not None
    path = listener.getsockname()
    entry._State.feed_path = path
    monkeypatch.setattr(entry.os, "_exit", fake_exit)
    with pytest.raises(Exited):
        entry._watch_parent(io.BytesIO(b"anything before EOF"))
    listener.close()
    assert not os.path.exists(os.path.dirname(path))


# ---- supervisor + TF process against a fake driver -------------------------------------------------


@pytest.fixture
def driver():
    made: list[FakeDriver] = []

    def make(**kwargs) -> FakeDriver:
        made.append(FakeDriver(SECRET_HEX, **kwargs))
        return made[-1]

    yield make
    for d in made:
        d.close()


def _spawn_supervisor(config: NodeConfig, payload: bytes) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tfonspark.executor.supervisor", "--cluster", config.cluster_id[:12], "--executor", "0"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stdin is not None
    write_bootstrap(proc.stdin, {"config": config.to_json(), "executor_id": 0, "gpus": []}, payload)
    proc.stdin.close()
    return proc


def test_tf_process_failing_before_map_fun_leaves_no_socket(driver, capsys):
    before = _feed_dirs()
    fake = driver(heartbeat_secs=0.2)
    config = _config(driver_port=fake.port, input_mode=InputMode.SPARK, heartbeat_secs=0.2)
    sup = Supervisor(config, 0, [], _payload(lambda args, ctx: None, _Unpicklable()))
    assert sup.run() == 0
    exit_msg = fake.wait_for(m.NodeExit)
    assert isinstance(exit_msg, m.NodeExit)
    assert exit_msg.exit_code == 1 and "ZeroDivisionError" in exit_msg.traceback
    assert fake.of(m.NodeUp) == []
    assert sup.relay is not None and sup.relay.data_path.endswith("feed.sock")  # the early FeedSocket reached it
    assert not os.path.exists(os.path.dirname(sup.relay.data_path))
    assert _feed_dirs() == before
    assert '"type":"task_exit"' in capsys.readouterr().out


def _sleeper(args, ctx):
    import subprocess
    import time

    child = subprocess.Popen(["sleep", "120"])  # in the TF process's group, like TensorBoard
    with open(args, "w") as out:
        out.write(str(child.pid))
    time.sleep(120)


def test_sigkilled_supervisor_takes_its_tf_process_children_and_socket_along(driver, tmp_path):
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        payload = _payload(_sleeper, str(tmp_path / "child.pid"))
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    fake = driver(heartbeat_secs=0.2)
    config = _config(driver_port=fake.port, input_mode=InputMode.SPARK, heartbeat_secs=0.1)
    proc = _spawn_supervisor(config, payload)
    try:
        up = fake.wait_for(m.NodeUp)
        assert isinstance(up, m.NodeUp) and os.path.exists(up.data_path)
        assert up.data_host == "127.0.0.1" or not up.data_host.startswith("0.")
        assert wait_until(lambda: (tmp_path / "child.pid").exists() and (tmp_path / "child.pid").read_text(), 30)
        child = int((tmp_path / "child.pid").read_text())
        assert wait_until(lambda: len(fake.of(m.Heartbeat)) >= 2, 10), "the supervisor sends heartbeats"
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        assert wait_until(lambda: not process_alive(up.tf_pid), 15), "the TF process outlived its supervisor"
        assert wait_until(lambda: not process_alive(child), 15), "the TF process's children outlived it"
        assert not os.path.exists(os.path.dirname(up.data_path))
        assert fake.closed.wait(10) and fake.of(m.NodeExit) == []
    finally:
        with contextlib.suppress(OSError):
            proc.kill()
        proc.wait(10)


def test_a_silent_driver_gets_the_tf_process_stopped(driver, tmp_path):
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        payload = _payload(_sleeper, str(tmp_path / "child.pid"))
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    fake = driver()  # never sends a heartbeat
    config = _config(driver_port=fake.port, input_mode=InputMode.SPARK, heartbeat_timeout=2.0)
    proc = _spawn_supervisor(config, payload)
    try:
        up = fake.wait_for(m.NodeUp)
        exit_msg = fake.wait_for(m.NodeExit, timeout=30)
        assert isinstance(exit_msg, m.NodeExit) and exit_msg.stopped
        assert exit_msg.exit_code == -signal.SIGTERM
        assert proc.wait(10) == 0
        assert not process_alive(up.tf_pid)
        assert not os.path.exists(os.path.dirname(up.data_path))
        assert proc.stdout is not None
        assert '"stopped":true' in proc.stdout.read().decode()
    finally:
        with contextlib.suppress(OSError):
            proc.kill()
        proc.wait(10)


# ---- the node task's waits (executor/node.py) -------------------------------------------------------


def _printer(script: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)


def test_status_reader_sees_lines_that_arrive_together_across_waits():
    from tfonspark.executor.node import _StatusReader

    proc = _printer(
        "import time\n"
        'print(\'noise\'); print(\'TFOS-STATUS J{"type": "task_up", "tf_pid": 7}\'); '
        'print(\'TFOS-STATUS J{"type": "task_exit", "exit_code": 0}\', flush=True)\n'
        "time.sleep(30)"
    )
    try:
        reader = _StatusReader(proc)
        first = next(iter(reader.events(time.monotonic() + 20)))
        assert first == ev.TaskUp(7)
        # the second line came in the same read; a new wait must not block on the descriptor
        start = time.monotonic()
        second = next(iter(reader.events(time.monotonic() + 20)))
        assert second == ev.TaskExit(0) and time.monotonic() - start < 1
        start = time.monotonic()
        assert list(reader.events(time.monotonic() + 0.5)) == []  # bounded by its deadline
        assert time.monotonic() - start < 2
    finally:
        proc.kill()
        proc.wait()


def test_start_node_runs_a_node_to_its_exit(driver):
    from tfonspark.executor.node import start_node

    fake = driver(heartbeat_secs=0.2)
    config = _config(driver_port=fake.port, heartbeat_secs=0.2)
    result = start_node(config, 0, _payload(lambda args, ctx: None, None), [], wait_for_exit=True)
    assert result == ev.TaskExit(0, stopped=False, traceback="")
    assert isinstance(fake.wait_for(m.NodeExit), m.NodeExit)


def test_start_node_raises_when_the_supervisor_cannot_reach_the_driver():
    from tfonspark.errors import ClusterError
    from tfonspark.executor.node import start_node

    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    with pytest.raises(ClusterError, match="could not start"):
        start_node(_config(driver_port=port), 0, b"", [], wait_for_exit=False)


def test_the_tf_process_temp_files_go_with_it(driver, tmp_path):
    """Its TMPDIR is a private directory the supervisor removes however the TF process ends."""
    fake = driver(heartbeat_secs=0.2)
    config = _config(driver_port=fake.port, heartbeat_secs=0.2)

    def map_fun(args, ctx):
        import json
        import tempfile

        _, path = tempfile.mkstemp()  # e.g. checkpoint scratch, or TensorFlow's own
        with open(args, "w") as out:
            json.dump({"tmp": tempfile.gettempdir(), "file": path}, out)

    sup = Supervisor(config, 0, [], _payload(map_fun, str(tmp_path / "out")))
    assert sup.run() == 0
    seen = json.loads((tmp_path / "out").read_text())
    assert os.path.basename(seen["tmp"]).startswith("tfos-node-")
    assert seen["file"].startswith(seen["tmp"] + os.sep)
    assert not os.path.exists(seen["tmp"])


def test_the_tf_process_gets_its_tf_config_and_collective(driver, tmp_path):
    """TF_CONFIG is written beside its reader (distribute/tf_config.py); the resolved collective
    reaches tfonspark.distribute.strategy() through TFONSPARK_COLLECTIVE."""
    fake = driver(heartbeat_secs=0.2)
    config = _config(driver_port=fake.port, heartbeat_secs=0.2, collective="ring")

    def map_fun(args, ctx):
        import json
        import os

        with open(args, "w") as out:
            json.dump({name: os.environ.get(name) for name in ("TF_CONFIG", "TFONSPARK_COLLECTIVE")}, out)

    sup = Supervisor(config, 0, [], _payload(map_fun, str(tmp_path / "env")))
    assert sup.run() == 0
    seen = json.loads((tmp_path / "env").read_text())
    assert seen["TFONSPARK_COLLECTIVE"] == "ring"
    from tfonspark.distribute.tf_config import task_info

    info = task_info(seen["TF_CONFIG"])
    assert (info.task_type, info.task_id) == ("worker", 0) and info.num_workers == 1


def test_a_bad_node_setting_fails_the_node_before_it_registers(driver, monkeypatch):
    fake = driver()
    monkeypatch.setenv("TENSORBOARD_PORT", "http")  # the node's own variable: read where the driver had the default
    proc = _spawn_supervisor(_config(driver_port=fake.port), b"")
    assert proc.stdout is not None
    out = proc.stdout.read()
    proc.wait(timeout=60)
    status = [ev.from_line(line[len(STATUS_PREFIX) :]) for line in out.decode().splitlines()]
    assert proc.returncode == 1 and isinstance(status[-1], ev.TaskFailed)
    assert "TENSORBOARD_PORT must be an integer port" in status[-1].reason
    assert "(from the node's environment)" in status[-1].reason
    assert fake.of(m.Register) == []


def test_a_tf_process_that_cannot_be_spawned_leaves_no_scratch_dir(monkeypatch, tmp_path):
    """EAGAIN from Popen (too many processes): the node fails with the reason, its TMPDIR is gone."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # only this test's scratch dirs are seen
    spawned: list[list[str]] = []

    def no_more_processes(args, *rest, **kwargs):
        spawned.append(args)
        assert glob.glob(str(tmp_path / "tfos-node-*")), "the scratch dir is made before the spawn"
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(supervisor_module.subprocess, "Popen", no_more_processes)
    fake = FakeDriver(SECRET_HEX, heartbeat_secs=0.2)
    try:
        sup = Supervisor(_config(driver_port=fake.port, heartbeat_secs=0.2), 0, [], b"")
        assert sup.run() == 0
        assert spawned, "Popen was called"
        assert glob.glob(str(tmp_path / "tfos-node-*")) == []
        exit_msg = fake.wait_for(m.NodeExit, timeout=10)
        assert exit_msg.exit_code == 1 and not exit_msg.stopped
        assert "BlockingIOError" in exit_msg.traceback and "Resource temporarily unavailable" in exit_msg.traceback
        assert sup.scratch == ""
    finally:
        fake.close()


def test_a_tf_process_spawn_interrupted_by_anything_else_leaves_no_scratch_dir(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(supervisor_module.subprocess, "Popen", interrupted)
    sup = Supervisor(_config(), 0, [], b"")
    ready = m.ClusterReady("worker", 0, {"worker": ["127.0.0.1:1"]})
    with socket.socket() as port_sock, pytest.raises(KeyboardInterrupt):
        port_sock.bind(("127.0.0.1", 0))
        sup.spawner.cold(ready, "127.0.0.1", port_sock, 1)
    assert glob.glob(str(tmp_path / "tfos-node-*")) == [] and sup.scratch == ""


def test_a_real_spawn_still_gets_its_scratch_dir(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    made: list[dict[str, str]] = []

    def fake_popen(args, **kwargs):
        made.append(kwargs["env"])
        return types.SimpleNamespace(stdin=io.BytesIO(), pid=1)

    monkeypatch.setattr(supervisor_module.subprocess, "Popen", fake_popen)
    sup = Supervisor(_config(), 0, [], b"")
    with socket.socket() as port_sock:
        port_sock.bind(("127.0.0.1", 0))
        _, scratch = sup.spawner.cold(
            m.ClusterReady("worker", 0, {"worker": ["127.0.0.1:1"]}), "127.0.0.1", port_sock, 1
        )
    assert made[0]["TMPDIR"] == scratch and os.path.isdir(scratch)


# ---- from test_server_restarts.py -------------------------------------------------------------------
# Restarting a PS worker's server in place (executor/supervisor.py), and what the driver makes of it.
#
# A real supervisor and TF process against a fake driver: the "server" is a Python listener on the
# node's port, so no TensorFlow is imported. Killed, it comes back at the same port, announced by a
# ``ServerRestarted`` event, until ``NodeConfig.server_restarts`` is spent; then the node fails.


def _serving_config(**overrides) -> NodeConfig:
    """:func:`_config` of a serving node's cluster, with heartbeats every 0.2 s."""
    return _config(**{"cluster_id": "server-restart-test", "heartbeat_secs": 0.2, **overrides})


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


def _serving_payload() -> bytes:
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
        config = _serving_config(driver_port=fake.port, **overrides)
        proc = subprocess.Popen(
            [sys.executable, "-m", "tfonspark.executor.supervisor", "--cluster", config.cluster_id[:12]],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        assert proc.stdin is not None
        write_bootstrap(proc.stdin, {"config": config.to_json(), "executor_id": 0, "gpus": []}, _serving_payload())
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
        if "-c" in cmd and label in cmd and any("await_bootstrap" in part for part in cmd):
            return proc.pid
    return 0


def test_a_killed_worker_server_comes_back_at_its_port_until_the_limit(supervised):
    fake, proc = supervised(server_restarts=1)
    label = _serving_config().cluster_id[:12]
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


def _supervisor(job: str, restarts: int = 3) -> Supervisor:
    sup = Supervisor(_serving_config(server_restarts=restarts), 0, [], b"")
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


# ---- the node's TF port: port_range, and TENSORFLOW_PORT on the TFoS face (issue 45, item 4) --------


def test_the_nodes_tf_port_is_the_first_free_port_of_the_port_range():
    spec = free_range(3)
    low = int(spec.split("-")[0])
    other = supervisor_module.reserve_port(low)  # another node of this host has the first one
    with other, supervisor_module.node_port(_config(port_range=spec), environ={}) as sock:
        assert sock.getsockname()[1] == low + 1


def test_tensorflow_port_pins_the_tf_port_on_the_tfos_face_only():
    spec, pinned = free_range(2), free_range(1).split("-")[0]
    environ = {"TENSORFLOW_PORT": pinned}
    with supervisor_module.node_port(_config(port_range=spec, tfos_face=True), environ) as sock:
        assert sock.getsockname()[1] == int(pinned)  # TFoS's meaning: the TF server's port of the node
        with pytest.raises(ConfigError, match=rf"^TENSORFLOW_PORT={pinned} .* is taken on host .*port_range"):
            supervisor_module.node_port(_config(tfos_face=True), environ)  # a second node on this host
    with supervisor_module.node_port(_config(port_range=spec), environ) as sock:
        assert sock.getsockname()[1] == int(spec.split("-")[0])  # tfonspark.run: not read
    with pytest.raises(ConfigError, match=r"^TENSORFLOW_PORT must be a port 1-65535 .*Received: 'x'"):
        supervisor_module.node_port(_config(tfos_face=True), {"TENSORFLOW_PORT": "x"})


def test_a_node_whose_host_has_no_port_of_the_range_left_fails_with_a_config_error(driver):
    """The range held large enough for one node, but another holds its ports here: the node task
    (and so the driver, through Spark) gets a ConfigError naming port_range and the TF port."""
    from tfonspark.executor.node import start_node

    fake = driver(heartbeat_secs=0.2)
    spec = free_range(1).split("-")[0]
    with supervisor_module.reserve_port(int(spec)), pytest.raises(ConfigError) as info:
        start_node(_config(driver_port=fake.port, port_range=spec), 0, b"", [], wait_for_exit=False)
    said = str(info.value)
    assert said.startswith(
        f"executor 0: node could not start: port_range '{spec}' has no free port left for the node's TF port"
    )
