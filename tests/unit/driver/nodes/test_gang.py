"""driver/nodes/gang.py: the gang as the control plane (ControlPlane); what its watcher keeps of node events: its memory over a long run
(issue 21, row 4: 1,000,000 node events through the server), and the server restarts a supervisor
could have sent.

The events enter a real :class:`RendezvousServer` where a supervisor's do: its connection
handler (``_follow``: decode, check, record), on its own thread; a :class:`Gang`'s watcher
takes them and hands the reports to a :class:`ReportLog`, as in ``tfonspark.run``. Only the
socket and its HMAC are left out, which keep nothing per event, so that a million events take
well under a minute on two shared cores (over a real socket the same run takes ~1 s per 25,000
events there). The driver's resident memory must not grow with the number of events: it stays
within the documented caps (``EVENT_BACKLOG``/``BACKLOG_BYTES`` for events waiting for the
watcher, ``KEEP_REPORTS``/``KEEP_BYTES`` for the report log, ``MARKED_FEEDS`` for epoch marks).
For the figures: ``python -m pytest tests/unit/driver/nodes/test_gang.py -s``.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import logging
import os
import threading
import time

import pytest

from tests.waiting import wait_until
from tfonspark.config import NodeConfig
from tfonspark.driver.feeds.feeding import Feeds
from tfonspark.driver.nodes import rendezvous, reports
from tfonspark.driver.nodes.gang import Gang
from tfonspark.driver.nodes.launcher import LocalLauncher
from tfonspark.driver.nodes.node_events import NodeEvents
from tfonspark.driver.nodes.rendezvous import RendezvousServer
from tfonspark.driver.nodes.reports import ReportLog
from tfonspark.driver.nodes.roles import plan_roles
from tfonspark.errors import NodeFailed
from tfonspark.testing import FakeSparkContext
from tfonspark.wire import events as ev
from tfonspark.wire import messages as m

SECRET = hashlib.sha256(b"event-memory-test").digest()
CLUSTER = "event-memory"
EVENTS = 1_000_000
WARM_UP = 30_000  # past the report log's 10,000: the "before" figure is taken at its steady state
MARK_EVERY = 100  # one event in 100 is an epoch mark, of a new feed every 1,000 events
MIB = 1024 * 1024


class _Supervisor:
    """One supervisor's connection as the server reads it: ``recv()`` gives the next frame's payload.

    Sends ``warm_up`` events, waits for ``go``, sends the rest of ``total``, then ``NodeExit``.
    Reports carry ``pad`` more bytes. Like a socket read, it lets other threads run (every 64
    small events, every large one), so the watcher keeps up as it would.
    """

    def __init__(self, total: int, warm_up: int, pad: int = 0) -> None:
        self.total, self.warm_up, self.pad = total, warm_up, b"x" * pad
        self.sent = 0
        self.go = threading.Event()
        self.paused = threading.Event()

    def settimeout(self, timeout: float | None) -> None:
        pass

    def recv(self) -> bytes:
        i = self.sent
        if i == self.total:
            return m.encode(m.NodeExit(0, 0, "", "", False))
        if i == self.warm_up and not self.go.is_set():
            self.paused.set()
            self.go.wait()
        if i % 64 == 0 or self.pad:
            time.sleep(0)
        self.sent += 1
        if i % MARK_EVERY == MARK_EVERY - 1:
            detail = b'{"feed_id":"feed-%d","epoch":%d}' % (i // 1000, i % 1000 // MARK_EVERY)
            return b'J{"type":"epoch_read",%s' % detail[1:]
        detail = b'{"step":%d,"loss":0.25,"accuracy":0.875,"pad":"%s"}' % (i, self.pad)
        return b'J{"type":"reported","metrics":%s}' % detail


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reports_sent(events: int) -> int:
    return events - events // MARK_EVERY


def _run(total: int, warm_up: int, pad: int = 0) -> dict[str, float]:
    """Push ``total`` events through a server and a cluster's watcher; RSS and timings."""
    server = RendezvousServer(CLUSTER, plan_roles(1), SECRET, "127.0.0.1")
    config = NodeConfig(cluster_id=CLUSTER, driver_host="127.0.0.1", driver_port=1, secret_hex=SECRET.hex())
    handed: list[int] = [0]

    def on_report(report: reports.Report) -> None:
        handed[0] += 1

    feeds = Feeds(FakeSparkContext(), SECRET.hex(), None)  # type: ignore[arg-type]  # no feed runs
    on_event = NodeEvents(ReportLog(on_report), feeds)
    gang = Gang(server, config, plan_roles(1), LocalLauncher(), on_event, feeds.cancel)
    node = server.nodes[0]
    node.address = "127.0.0.1:1"  # registered
    supervisor = _Supervisor(total, warm_up, pad)
    follow = threading.Thread(target=server._follow, args=(supervisor, node), daemon=True)

    def handed_out(count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while handed[0] + getattr(server, "dropped", 0) < count:
            assert time.monotonic() < deadline, f"{handed[0]} of {count} reports handed out in {timeout}s"
            time.sleep(0.01)

    try:
        gc.collect()
        start = _rss()
        gang._watcher.start()
        follow.start()
        assert supervisor.paused.wait(60)
        handed_out(_reports_sent(warm_up), 60)
        gc.collect()
        before = _rss()
        started, cpu = time.monotonic(), time.process_time()
        supervisor.go.set()
        follow.join(120)
        assert node.exit is not None, f"{supervisor.sent:,} events sent in 120s"
        handed_out(_reports_sent(total), 60)
        took, cpu = time.monotonic() - started, time.process_time() - cpu
        gc.collect()
        after = _rss()
        marks_started = time.perf_counter()
        marks = gang.marks_read(f"feed-{(total - 1) // 1000}")
        marks_ms = (time.perf_counter() - marks_started) * 1e3
        kept = on_event.reports.all()
    finally:
        supervisor.go.set()
        gang.closed = True
        server.close()
        gang._watcher.join(10)
    print(
        f"\n{total:,} events ({total - warm_up:,} after the warm-up; reports of {pad:,} bytes more) in "
        f"{took:.1f}s ({cpu:.1f}s CPU); driver RSS {start / MIB:.1f} MiB at the start, {before / MIB:.1f} "
        f"after {warm_up:,} events, {after / MIB:.1f} after {total:,}; {len(kept):,} reports kept; reports "
        f"dropped by a lagging watcher: {getattr(server, 'dropped', 0)}; marks_read {marks_ms:.3f} ms"
    )
    assert marks == {"worker:0": (total - 1) % 1000 // MARK_EVERY}  # the last feed's last mark
    assert kept[-1].metrics["step"] == total - 1 - (total % MARK_EVERY == 0)  # the latest, in order
    return {"start": start, "before": before, "after": after, "kept": len(kept)}


@pytest.mark.slow  # ~20 s of CPU; a minute on two busy cores
@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads RSS from /proc")
def test_a_million_events_leave_driver_memory_within_the_documented_caps():
    rss = _run(EVENTS, WARM_UP)
    assert rss["after"] - rss["before"] < 8 * MIB, "memory grows with the number of events"
    assert rss["after"] - rss["start"] < reports.KEEP_BYTES, "driver memory beyond the report log's cap"
    assert rss["kept"] == reports.KEEP_REPORTS  # the latest 10,000


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads RSS from /proc")
def test_large_reports_are_kept_within_keep_bytes():
    """Before: 2,000 reports of 64 KiB took 126 MiB (in the server's event list and the report log)."""
    rss = _run(4_000, 1_000, pad=64 * 1024 - 100)
    assert rss["after"] - rss["before"] < 16 * MIB, "memory grows with the number of events"
    assert rss["after"] - rss["start"] < reports.KEEP_BYTES + rendezvous.BACKLOG_BYTES
    assert rss["kept"] < 520  # 32 MiB of 64 KiB reports


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


def test_the_gang_is_the_control_plane_and_answers_from_its_server(gang_of):
    """``ControlPlane`` (nodes/plane.py) is what the cluster, feeds and services ask; each call
    answers what the rendezvous server holds, so nothing above it needs the server itself."""
    from tfonspark.driver.nodes.plane import ControlPlane

    gang, send, sync = gang_of(0)
    plane: ControlPlane = gang  # the type checker's view: Gang implements the protocol
    assert [n.role.name for n in plane.nodes()] == ["ps:0", "worker:0", "worker:1"]
    assert plane.nodes() is not plane.nodes()  # a snapshot of the table, not the server's dict
    spec = plane.cluster_spec()
    assert sorted(spec) == ["ps", "worker"] and len(spec["worker"]) == 2 and spec["ps"][0].endswith(":21000")
    spec["ps"].append("intruder:1")
    assert plane.cluster_spec()["ps"] == spec["ps"][:1]  # a copy: the nodes' spec cannot be changed
    assert plane.data_nodes() == {"worker:0", "worker:1"} and plane.failures() == []
    before = plane.event_count
    sync()
    assert plane.event_count >= before + 3  # one report per node went through the watcher
    assert plane.wait_for(lambda nodes: len(list(nodes)) == 3, timeout=1)
    assert not plane.wait_for(lambda nodes: False, timeout=0.2, until_failure=False)
    plane.request_stop("enough data")
    plane.request_stop("a later reason")
    assert gang.server.stop_reason == "enough data"  # the first reason is kept


_DEADLINE = (
    "tensorflow.python.framework.errors_impl.DeadlineExceededError: Collective ops is aborted by: "
    "Collective ops timed out\nHint: A collective (an all-reduce of the step) waited its timeout_seconds"
)


def _collective_timeout(gang_of, peer_speaks: bool):
    """worker:0's collective times out (its NodeExit); ps:0 has stopped; worker:1 either goes silent
    or keeps reporting until it stops. The NodeFailed that ``check()`` raises, and the seconds it took."""
    gang, send, sync = gang_of(0)
    gang.server.heartbeat_secs = 0.25  # a healthy supervisor speaks at least this often
    ids = {n.role.name: n.role.executor_id for n in gang.server.nodes.values()}
    send("ps:0", m.NodeExit(ids["ps:0"], 0, stopped=True))
    speaking = threading.Event()
    if peer_speaks:

        def speak() -> None:
            with contextlib.suppress(OSError):  # the gang's teardown closes the connection
                for _ in range(30):
                    send("worker:1", ev.Reported({"step": 1}))
                    time.sleep(0.1)
                send("worker:1", m.NodeExit(ids["worker:1"], 0, stopped=True))
            speaking.set()

        threading.Thread(target=speak, daemon=True).start()
    else:
        time.sleep(0.6)  # worker:1 has sent nothing for longer than two heartbeats
    send("worker:0", m.NodeExit(ids["worker:0"], 1, traceback=_DEADLINE))
    assert wait_until(lambda: gang.server.failures(), 30)
    started = time.monotonic()
    with pytest.raises(NodeFailed) as info:
        gang.check()
    seconds = time.monotonic() - started
    assert speaking.wait(30) if peer_speaks else True
    return info.value, seconds


def test_a_collective_timeout_names_the_silent_peer_it_waited_on_first(gang_of):
    error, seconds = _collective_timeout(gang_of, peer_speaks=False)
    assert (error.role, error.index) == ("worker", 1), str(error)
    assert str(error).startswith(
        "TensorFlow node worker:1 (executor 2) was lost: unreachable: the collective of worker:0"
    )
    assert "has sent nothing for" in str(error) and "and 1 more: worker:0 failed with exit code 1" in str(error)
    assert "DeadlineExceededError" in error.failures["worker:0"]
    assert seconds < 10


def test_a_collective_timeout_with_every_peer_speaking_names_the_node_that_timed_out(gang_of):
    error, _ = _collective_timeout(gang_of, peer_speaks=True)
    assert (error.role, error.index) == ("worker", 0), str(error)
    assert set(error.failures) == {"worker:0"} and "unreachable" not in str(error)


_ABORTED = (
    "tensorflow.python.framework.errors_impl.UnavailableError: Collective ops is aborted by: Socket closed\n"
    "Additional GRPC error information from remote target /job:worker/replica:0/task:1 while calling "
    "/tensorflow.WorkerService/RecvBuf:\n:UNKNOWN:Error received from peer"
)


def test_a_node_killed_is_named_before_the_peer_whose_collective_it_aborted_even_heard_later(gang_of):
    gang, send, _ = gang_of(0)
    ids = {n.role.name: n.role.executor_id for n in gang.server.nodes.values()}
    send("ps:0", m.NodeExit(ids["ps:0"], 0, stopped=True))
    send("worker:0", m.NodeExit(ids["worker:0"], 1, traceback=_ABORTED))  # the driver hears of it first
    assert wait_until(lambda: gang.server.failures(), 30)
    time.sleep(0.1)
    send("worker:1", m.NodeExit(ids["worker:1"], -9))
    assert wait_until(lambda: len(gang.server.failures()) == 2, 30)
    with pytest.raises(NodeFailed) as info:
        gang.check()
    assert (info.value.role, info.value.index) == ("worker", 1), str(info.value)
    assert str(info.value).startswith("TensorFlow node worker:1 (executor 2) was killed by signal 9 (SIGKILL)")
    assert "and 1 more: worker:0 failed with exit code 1" in str(info.value)
