"""driver/cluster.py: a cluster's lifecycle without Spark, the launcher swapped for
``tfonspark.testing.LocalLauncher``; nothing a node reports at shutdown is lost.

Everything but Spark is real: the rendezvous server, the node supervisors and the TF processes
(which run ``map_fun`` without importing TensorFlow here), so these tests take seconds.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pytest

import tfonspark
from tfonspark.config import NodeConfig
from tfonspark.errors import ConfigError, ExecutorEnvironmentError, NodeFailed, ReservationTimeout
from tfonspark.testing import FakeSparkContext, LocalLauncher
from tfonspark.wire.errors import CapturedError, encode


def write_role(args: dict, ctx) -> None:
    (Path(args["dir"]) / f"{ctx.job_name}-{ctx.task_index}").write_text(str(ctx.num_workers))


def fail_on(args: dict, ctx) -> None:
    """Fail together: each node waits (bounded) until every node has started, then raises."""
    ready = Path(args["dir"])
    (ready / str(ctx.task_index)).touch()
    deadline = time.monotonic() + 60
    while len(list(ready.iterdir())) < ctx.num_workers and time.monotonic() < deadline:
        time.sleep(0.01)
    if f"{ctx.job_name}:{ctx.task_index}" in args["fail"]:
        raise RuntimeError(f"boom on {ctx.job_name}:{ctx.task_index}")


def serve_until_stopped(args: dict, ctx) -> None:
    if ctx.job_name == "ps":
        time.sleep(600)  # a ps node serves until shutdown() stops it


def run(map_fun, args, n: int = 2, **kwargs) -> tfonspark.Cluster:
    return tfonspark.run(
        FakeSparkContext(), map_fun, args, n, reservation_timeout=60, launcher=LocalLauncher(), **kwargs
    )


def test_nodes_start_run_map_fun_and_shut_down(tmp_path):
    cluster = run(write_role, {"dir": str(tmp_path)})
    assert sorted((i["job_name"], i["task_index"]) for i in cluster.cluster_info) == [("worker", 0), ("worker", 1)]
    cluster.shutdown(timeout=60)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["worker-0", "worker-1"]
    assert all(p.read_text() == "2" for p in tmp_path.iterdir())


def test_every_failed_node_is_named_with_its_traceback(tmp_path):
    with pytest.raises(NodeFailed) as info:  # at start-up or at shutdown, depending on timing
        run(fail_on, {"fail": ["worker:0", "worker:1"], "dir": str(tmp_path)}).shutdown(timeout=60)
    err = info.value
    assert set(err.failures) == {"worker:0", "worker:1"}, str(err)
    first, other = (0, 1) if err.index == 0 else (1, 0)  # the first the driver heard from
    assert err.role == "worker" and f"boom on worker:{first}" in err.traceback
    assert "boom on worker:1" in err.failures["worker:1"] and "boom on worker:0" in err.failures["worker:0"]
    assert f"and 1 more: worker:{other} failed with exit code" in str(err)


def test_driver_side_ps_nodes_are_stopped_at_shutdown():
    cluster = run(serve_until_stopped, {}, n=2, num_ps=1, driver_ps_nodes=True)
    roles = [n.role for n in cluster.server.nodes.values()]
    assert [(r.job_name, r.on_driver) for r in roles] == [("ps", True), ("worker", False)]
    start = time.monotonic()
    cluster.shutdown(grace_secs=1, timeout=60)
    assert time.monotonic() - start < 30


class _NoNodes:
    """A launcher whose nodes never come: the reservation must time out, naming the settings."""

    def launch(self, config: NodeConfig, payload: bytes, executor_ids: list[int], on_done):
        return _Handle()


class _Handle:
    def __init__(self, error: BaseException | None = None) -> None:
        self.done = threading.Event()
        self.error = error
        if error is not None:
            self.done.set()

    def cancel(self) -> None:
        self.done.set()

    def join(self, timeout: float | None = None) -> bool:
        return self.done.wait(timeout)


class _Failing:
    def __init__(self, error: BaseException) -> None:
        self.error = error

    def launch(self, config: NodeConfig, payload: bytes, executor_ids: list[int], on_done):
        return _Handle(self.error)


def test_nodes_that_never_register_time_out_the_reservation():
    with pytest.raises(ReservationTimeout) as info:
        tfonspark.run(FakeSparkContext(), write_role, {}, 2, reservation_timeout=1, launcher=_NoNodes())
    assert (info.value.registered, info.value.required) == (0, 2)
    assert "reservation_timeout" in str(info.value)


class _OneWithoutTfonspark:
    """Every node but the last starts (LocalLauncher), ``delay`` seconds late; the last one's task
    returns at once, as a preflight report does on an executor without tfonspark. Like a Spark
    node job, the launch ends, with the job's ExecutorEnvironmentError, only once the other
    nodes' tasks returned."""

    def __init__(self, report: bool, delay: float = 0.0) -> None:
        self.report, self.delay = report, delay

    def launch(self, config: NodeConfig, payload: bytes, executor_ids: list[int], on_done):
        start = lambda: LocalLauncher().launch(config, payload, executor_ids[:-1], lambda: None)  # noqa: E731
        return _PartialHandle(start, self.delay, self.report, on_done)


class _PartialHandle:
    def __init__(self, start, delay: float, report: bool, on_done) -> None:
        self.started, self.done = None, threading.Event()
        self.error: BaseException | None = None

        def finish() -> None:
            time.sleep(delay)
            self.started = started = start()
            started.join()
            self.error = started.error  # a node task that raised fails the job (a stopped one must not)
            if report and self.error is None:  # what environment.check raises from the job's results
                self.error = ExecutorEnvironmentError("tfonspark cannot be imported on the executors", host="h1")
            self.done.set()
            on_done()

        threading.Thread(target=finish, daemon=True).start()

    def ended_tasks(self) -> int:
        return (self.started.ended_tasks() if self.started is not None else 0) + 1

    def cancel(self) -> None:
        pass

    def join(self, timeout: float | None = None) -> bool:
        return self.done.wait(timeout)


def wait_for_feed(args: dict, ctx) -> None:
    ctx.get_data_feed().next_batch(1)


@pytest.mark.parametrize(
    ("input_mode", "delay"),
    [(tfonspark.InputMode.SPARK, 0.0), (tfonspark.InputMode.TENSORFLOW, 0.0), (tfonspark.InputMode.SPARK, 2.0)],
)
def test_a_node_task_that_returns_during_the_reservation_ends_it_with_the_jobs_error(input_mode, delay):
    """Not after reservation_timeout: the nodes that came are stopped, and the job's own error
    (an executor without tfonspark) is raised within seconds. With ``delay`` the other nodes'
    supervisors start after the early task was seen: registering during the teardown, they are
    told to stop, and do not hold the node job until it is cancelled."""
    fun = wait_for_feed if input_mode == tfonspark.InputMode.SPARK else serve_until_stopped
    started = time.monotonic()
    with pytest.raises(ExecutorEnvironmentError, match="cannot be imported"):
        tfonspark.run(
            FakeSparkContext(),
            fun,
            {},
            3,
            input_mode=input_mode,
            reservation_timeout=120,
            launcher=_OneWithoutTfonspark(report=True, delay=delay),
        )
    assert time.monotonic() - started < 10  # not reservation_timeout, nor a 15 s wait for stopped nodes


def test_a_node_task_that_returns_during_the_reservation_without_a_report_is_named():
    started = time.monotonic()
    with pytest.raises(
        NodeFailed,
        match=r"reservation: 1 Spark node task returned before its node registered \([0-2] of 3 registered\)",
    ):
        tfonspark.run(
            FakeSparkContext(), wait_for_feed, {}, 3, reservation_timeout=120, launcher=_OneWithoutTfonspark(False)
        )
    assert time.monotonic() - started < 10  # not reservation_timeout, nor a 15 s wait for stopped nodes


def test_a_typed_error_in_the_node_job_arrives_as_itself():
    typed = ConfigError("bad GPU setting on executor 1")
    launcher = _Failing(CapturedError(f"Traceback...\n{encode(typed)}\n\tat org.apache.spark"))
    with pytest.raises(ConfigError, match="bad GPU setting on executor 1"):
        tfonspark.run(FakeSparkContext(), write_role, {}, 2, reservation_timeout=30, launcher=launcher)


def test_an_untyped_error_in_the_node_job_is_summarised_in_one_line():
    launcher = _Failing(RuntimeError("Job aborted.\n  File x\nOSError: [Errno 28] No space left on device\n"))
    with pytest.raises(NodeFailed, match=r"failed before reservation: OSError: \[Errno 28\] No space left"):
        tfonspark.run(FakeSparkContext(), write_role, {}, 2, reservation_timeout=30, launcher=launcher)


def terminate_then_work(args: dict, ctx) -> None:
    ctx.get_data_feed().terminate()
    time.sleep(args["sleep"])  # e.g. exporting: the node runs on, but takes no more data


def test_terminated_feeds_count_as_done_while_the_nodes_still_run():
    from tfonspark import InputMode

    cluster = run(terminate_then_work, {"sleep": 8}, input_mode=InputMode.SPARK)
    try:
        deadline = time.monotonic() + 6
        while not cluster._attempts.gang.all_done() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert cluster._attempts.gang.all_done(), "both nodes terminated their feed"
        assert not any(n.finished for n in cluster.server.nodes.values()), "the nodes still run"
    finally:
        cluster.shutdown(timeout=60)


@pytest.mark.parametrize("value", [1e10, float("inf"), 0, -1])
def test_a_reservation_or_feed_timeout_past_the_range_is_a_config_error(tmp_path, value):
    """Both would overflow a socket or an epoll wait (1e10 s) or never end: refused up front."""
    with pytest.raises(ConfigError, match=r"reservation_timeout must be a number of seconds > 0 and <= 604800"):
        tfonspark.run(FakeSparkContext(), write_role, {}, 2, reservation_timeout=value, launcher=LocalLauncher())
    cluster = run(write_role, {"dir": str(tmp_path)}, input_mode=tfonspark.InputMode.SPARK)
    try:
        with pytest.raises(ConfigError, match=r"feed_timeout must be a number of seconds > 0 and <= 604800"):
            cluster.train([(1.0, 2)], feed_timeout=value)
    finally:
        cluster.shutdown(timeout=60)


# ---- from test_shutdown_reports.py ------------------------------------------------------------------
# Nothing is lost at shutdown: a report a node sends while it is being stopped reaches the driver.
#
# The driver keeps collecting node events until its rendezvous server closes, which teardown does
# only once every node has exited (or its bounded wait ran out). Spark is swapped for
# ``tfonspark.testing.LocalLauncher``; the rest is real.


def report_when_stopped(args: dict, ctx) -> None:
    """ps:0 serves until SIGTERM, then reports once more (a little later) and returns; ps:1 dies
    of SIGTERM at once, so the driver hears of an exit before that report."""
    if ctx.job_name != "ps":
        return
    if ctx.task_index != 0:
        time.sleep(120)
        return
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    ctx.report({"ready": True})  # the test stops the cluster only now: a SIGTERM before would kill it
    deadline = time.monotonic() + 120
    while not stopping and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.3)  # the driver is well into its teardown by now
    ctx.report({"last": True, "signal": stopping[0] if stopping else 0})


def _last_reports(cluster: tfonspark.Cluster) -> list[dict]:
    return [r.metrics for r in cluster.reports if r.node == "ps:0" and "last" in r.metrics]


def _wait_until_ps0_ready(cluster: tfonspark.Cluster) -> None:
    """ps:0's SIGTERM handler is installed (its TF process may take seconds to get there under load)."""
    deadline = time.monotonic() + 60
    while not any(r.node == "ps:0" and r.metrics.get("ready") for r in cluster.reports):
        assert time.monotonic() < deadline, "ps:0 never reported that it was ready"
        time.sleep(0.02)


def test_a_report_sent_while_shutdown_stops_the_node_reaches_cluster_reports():
    cluster = tfonspark.run(
        FakeSparkContext(), report_when_stopped, {}, 3, num_ps=2, reservation_timeout=60, launcher=LocalLauncher()
    )
    _wait_until_ps0_ready(cluster)
    cluster.shutdown(grace_secs=10, timeout=60)
    assert _last_reports(cluster) == [{"last": True, "signal": int(signal.SIGTERM)}]


def test_a_report_sent_while_stop_stops_the_node_reaches_cluster_reports():
    seen: list[dict] = []
    cluster = tfonspark.run(
        FakeSparkContext(),
        report_when_stopped,
        {},
        3,
        num_ps=2,
        reservation_timeout=60,
        launcher=LocalLauncher(),
        on_report=lambda r: seen.append(r.metrics),
    )
    _wait_until_ps0_ready(cluster)
    cluster.stop(grace_secs=10)
    assert _last_reports(cluster) == [{"last": True, "signal": int(signal.SIGTERM)}]
    assert [m for m in seen if "last" in m] == [{"last": True, "signal": int(signal.SIGTERM)}]
