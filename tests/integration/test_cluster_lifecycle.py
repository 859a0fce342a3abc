"""Cluster lifecycle on real Spark (local-cluster[2,1,1024]): roles, failures, clean-up."""

from __future__ import annotations

import gc
import json
import os
import sys
import time
import urllib.request

import pytest

import tfonspark
from tfonspark.errors import ConfigError, NodeFailed, ReservationTimeout
from tfonspark.testing import free_ports

from .conftest import by_value, listening_ports, node_processes, wait_until

by_value(__name__)


def _describe_node(args, ctx):
    """Write what the node sees (context, TF_CONFIG and its resolution) to args/<job><index>.json."""
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    info = {
        "job_name": ctx.job_name,
        "task_index": ctx.task_index,
        "executor_id": ctx.executor_id,
        "worker_num": ctx.worker_num,
        "num_workers": ctx.num_workers,
        "cluster_spec": ctx.cluster_spec,
        "defaultFS": ctx.defaultFS,
        "working_dir": ctx.working_dir,
        "abs": ctx.absolute_path("model"),
        "tf_config": json.loads(os.environ["TF_CONFIG"]),
        "resolved": resolver.cluster_spec().as_dict(),
        "resolved_task": [resolver.task_type, resolver.task_id],
        "pid": os.getpid(),
        "gc": [gc.isenabled(), gc.get_freeze_count()],
        "deferred": {name: type(sys.modules.get(name)).__name__ for name in ("keras.wrappers", "matplotlib.pyplot")},
        "sklearn": "sklearn" in sys.modules,
    }
    with open(os.path.join(args, f"{ctx.job_name}{ctx.task_index}.json"), "w") as f:
        json.dump(info, f)


def test_roles_context_and_tf_config(sc, tmp_path, no_leftovers):
    cluster = tfonspark.run(sc, _describe_node, str(tmp_path), 2, reservation_timeout=120)
    cluster.shutdown(timeout=120)
    nodes = {p.stem: json.loads(p.read_text()) for p in tmp_path.glob("*.json")}
    assert sorted(nodes) == ["worker0", "worker1"]
    spec = nodes["worker0"]["cluster_spec"]
    assert len(spec["worker"]) == 2 and nodes["worker1"]["cluster_spec"] == spec
    for _name, node in nodes.items():
        assert node["num_workers"] == 2
        assert node["tf_config"]["task"] == {"type": "worker", "index": node["task_index"]}
        assert node["resolved"] == spec, "TFConfigClusterResolver must resolve the same cluster"
        assert node["resolved_task"] == ["worker", node["task_index"]]
        assert node["abs"].startswith("file://") and node["abs"].endswith("/model")
    assert {n["executor_id"] for n in nodes.values()} == {0, 1}
    for node in nodes.values():  # TF was imported with the GC paused, then frozen (tfonspark.tfimport)
        assert node["gc"][0] is True and node["gc"][1] > 100_000, node["gc"]
        # ... and Keras's optional integrations, installed here for the demo, were deferred
        assert node["deferred"] == {"keras.wrappers": "_DeferredModule", "matplotlib.pyplot": "_DeferredModule"}
        assert node["sklearn"] is False


def test_driver_ps_nodes_with_chief(sc, tmp_path, no_leftovers):
    """ps on the driver, chief + worker on the two executors; ps serve until shutdown."""

    def fun(args, ctx):
        from tfonspark import TFNode

        _describe_node(args, ctx)
        cluster_spec, server = TFNode.start_cluster_server(ctx)
        if ctx.job_name == "ps":
            server.join()
        import pathlib
        import time

        deadline = time.monotonic() + 60  # shutdown stops the ps once chief/worker exit: let it describe itself
        while not (pathlib.Path(args) / "ps0.json").exists() and time.monotonic() < deadline:
            time.sleep(0.1)

    cluster = tfonspark.run(
        sc, fun, str(tmp_path), 3, num_ps=1, master_node="chief", driver_ps_nodes=True, reservation_timeout=120
    )
    roles = sorted((i["job_name"], i["task_index"], i["executor_id"]) for i in cluster.cluster_info)
    assert roles == [("chief", 0, 1), ("ps", 0, 0), ("worker", 0, 2)]
    cluster.shutdown(timeout=120)
    nodes = {p.stem: json.loads(p.read_text()) for p in tmp_path.glob("*.json")}
    assert sorted(nodes) == ["chief0", "ps0", "worker0"]
    assert nodes["ps0"]["resolved"] == nodes["chief0"]["cluster_spec"]
    assert nodes["chief0"]["num_workers"] == 2


def _fail_fast(args, ctx):
    import time

    if ctx.task_index == 1:
        with open(os.path.join(args, "failed_at"), "w") as f:
            f.write(repr(time.time()))
        raise ValueError("boom from map_fun")
    time.sleep(600)  # the healthy node must be stopped, not waited for


def test_exception_in_map_fun_surfaces_quickly(sc, tmp_path, no_leftovers):
    with pytest.raises(NodeFailed) as info:  # from run() or shutdown(), whichever sees it first
        cluster = tfonspark.run(sc, _fail_fast, str(tmp_path), 2, reservation_timeout=120)
        cluster.shutdown(timeout=300)
    raised_at = time.time()
    failed_at = float((tmp_path / "failed_at").read_text())
    err = info.value
    assert (err.role, err.index) == ("worker", 1)
    assert "ValueError: boom from map_fun" in err.traceback
    assert "worker:1" in str(err) and "boom from map_fun" in str(err)
    print(f"[measured] map_fun exception surfaced on the driver after {raised_at - failed_at:.2f}s")
    assert raised_at - failed_at < 10, f"failure took {raised_at - failed_at:.1f}s to surface"


def _killed(args, ctx):
    import signal
    import time

    if ctx.task_index == 0:
        print("about to be killed", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(600)


def test_sigkilled_tf_process_is_reported(sc, no_leftovers):
    start = time.monotonic()
    with pytest.raises(NodeFailed) as info:
        # SPARK mode: the killed process leaves its feed socket behind for the supervisor to remove
        cluster = tfonspark.run(sc, _killed, None, 2, reservation_timeout=120, input_mode=tfonspark.InputMode.SPARK)
        cluster.shutdown(timeout=300)
    print(f"[measured] SIGKILL reported {time.monotonic() - start:.2f}s after run() was called")
    assert time.monotonic() - start < 30
    assert info.value.exit_code == -9 and (info.value.role, info.value.index) == ("worker", 0)
    assert "SIGKILL" in str(info.value) and "about to be killed" in info.value.traceback


def test_too_few_executors_raise_reservation_timeout(sc, no_leftovers):
    start = time.monotonic()
    with pytest.raises(ReservationTimeout) as info:
        tfonspark.run(sc, _describe_node, None, 3, reservation_timeout=3)
    print(f"[measured] ReservationTimeout(reservation_timeout=3) raised after {time.monotonic() - start:.2f}s")
    assert time.monotonic() - start < 20
    message = str(info.value)
    assert "3" in message and "2" in message and "spark.executor.instances" in message
    assert info.value.required == 3 and info.value.registered == 2


def test_bad_arguments_fail_before_any_work(sc):
    with pytest.raises(ConfigError, match="num_executors"):
        tfonspark.run(sc, _describe_node, None, 0)
    with pytest.raises(ConfigError, match="master_node"):
        tfonspark.run(sc, _describe_node, None, 2, master_node="boss")
    with pytest.raises(ConfigError, match="no executor left"):
        tfonspark.run(sc, _describe_node, None, 2, num_ps=2)


def _noop(args, ctx):
    return None


def test_nothing_left_behind_after_shutdown(sc):
    cluster = tfonspark.run(sc, _noop, None, 2, reservation_timeout=120)
    ours = {cluster.server.address[1]} | {int(i["address"].rsplit(":", 1)[1]) for i in cluster.cluster_info}
    assert cluster.server.address[1] in listening_ports()
    cluster.shutdown(timeout=120)
    assert wait_until(lambda: not node_processes([cluster.cluster_id]), 20)
    assert not ours & listening_ports(), f"ports still listening: {ours & listening_ports()}"
    assert not sc.statusTracker().getActiveJobsIds()


def _hold_port(args, ctx):
    import socket

    host, port = ctx.cluster_spec[ctx.job_name][ctx.task_index].rsplit(":", 1)

    def bindable() -> bool:
        with socket.socket() as s:
            try:
                s.bind(("", int(port)))
                return True
            except OSError:
                return False

    before = bindable()
    ctx.release_port()
    after = bindable()
    with open(os.path.join(args, f"port{ctx.task_index}"), "w") as f:
        json.dump([before, after], f)


def test_release_port_false_keeps_port_until_released(sc, tmp_path, no_leftovers):
    cluster = tfonspark.run(sc, _hold_port, str(tmp_path), 2, release_port=False, reservation_timeout=120)
    cluster.shutdown(timeout=120)
    for i in range(2):
        assert json.loads((tmp_path / f"port{i}").read_text()) == [False, True]


def _sleep_until_released(args, ctx):
    """Run until the test creates the file ``args`` (at most 120 s): the nodes outlive its checks."""
    import os
    import time

    deadline = time.monotonic() + 120
    while not os.path.exists(args) and time.monotonic() < deadline:
        time.sleep(0.1)


def test_tensorboard_serves_until_shutdown(sc, tmp_path, no_leftovers):
    (port,) = free_ports()  # the tensorboard_port setting (keyword, Spark conf or TENSORBOARD_PORT)
    release = tmp_path / "release"
    cluster = tfonspark.run(
        sc,
        _sleep_until_released,
        str(release),
        2,
        tensorboard=True,
        log_dir=str(tmp_path),
        reservation_timeout=120,
        tensorboard_port=port,
    )
    try:
        url = cluster.tensorboard_url()
        assert url and url.endswith(f":{port}")
        local = "http://127.0.0.1:" + url.rsplit(":", 1)[1]
        assert wait_until(lambda: _http_status(local) == 200, 30)
    finally:
        release.touch()  # the nodes end now, not after a fixed sleep
    cluster.shutdown(timeout=120)
    assert wait_until(lambda: _http_status(local) is None, 20)


def _http_status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status
    except OSError:
        return None
