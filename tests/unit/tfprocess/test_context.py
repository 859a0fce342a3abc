"""tfprocess/context.py: hdfs_path (TFoS semantics) and NodeContext (ctx.report included)."""

from __future__ import annotations

import getpass
import json
import logging
import math
import socket
from types import SimpleNamespace

import numpy as np
import pytest

import tfonspark
from tfonspark.config import NodeConfig
from tfonspark.errors import (
    ConfigError,
    FeedError,
)
from tfonspark.tfprocess.context import NodeContext, hdfs_path
from tfonspark.tfprocess.report import MAX_REPORT_BYTES

USER = getpass.getuser()


def ctx_for(default_fs: str, working_dir: str = "/home/me/job") -> SimpleNamespace:
    return SimpleNamespace(defaultFS=default_fs, working_dir=working_dir)


# ---- hdfs_path ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "hdfs://nn:8020/data/x",
        "viewfs://cluster/data",
        "file:///tmp/x",
        "s3a://bucket/key",
        "gs://b/k",
        "abfss://c@a.dfs.core.windows.net/p",
    ],
)
@pytest.mark.parametrize("default_fs", ["file://", "hdfs://nn:8020", "viewfs://cluster/"])
def test_paths_with_a_scheme_are_kept(path, default_fs):
    assert hdfs_path(ctx_for(default_fs), path) == path


@pytest.mark.parametrize(
    ("default_fs", "expected"),
    [
        ("hdfs://nn:8020", "hdfs://nn:8020/data/mnist"),
        ("hdfs://nn:8020/", "hdfs://nn:8020/data/mnist"),
        ("viewfs://cluster", "viewfs://cluster/data/mnist"),
        ("viewfs://cluster/", "viewfs://cluster/data/mnist"),
        ("file://", "file:///data/mnist"),
        ("file:///", "file:///data/mnist"),  # Hadoop's own default value of fs.defaultFS
    ],
)
def test_absolute_paths_get_the_default_fs(default_fs, expected):
    assert hdfs_path(ctx_for(default_fs), "/data/mnist") == expected


@pytest.mark.parametrize("default_fs", ["file://", "file:///"])
@pytest.mark.parametrize("working_dir", ["/home/me/job", "/home/me/job/"])
def test_relative_paths_go_under_the_working_dir_for_file(default_fs, working_dir):
    assert hdfs_path(ctx_for(default_fs, working_dir), "out/model") == "file:///home/me/job/out/model"


@pytest.mark.parametrize(
    ("default_fs", "base"),
    [
        ("hdfs://nn:8020", "hdfs://nn:8020"),
        ("hdfs://nn:8020/", "hdfs://nn:8020"),
        ("viewfs://cluster", "viewfs://cluster"),
        ("viewfs://cluster/", "viewfs://cluster"),
    ],
)
def test_relative_paths_go_under_the_user_home_for_hdfs_and_viewfs(default_fs, base):
    assert hdfs_path(ctx_for(default_fs), "mnist/csv") == f"{base}/user/{USER}/mnist/csv"


def test_relative_path_with_an_unknown_scheme():
    assert hdfs_path(ctx_for("s3a://bucket"), "models/x") == "s3a://bucket/models/x"


# ---- NodeContext ------------------------------------------------------------------------------------

SPEC = {"ps": ["h:0"], "chief": ["h:1"], "evaluator": ["h:2"], "worker": ["h:3", "h:4", "h:5"]}


def make_ctx(job_name: str = "worker", task_index: int = 0, cluster_spec=None, **kwargs) -> NodeContext:
    return NodeContext(
        executor_id=kwargs.pop("executor_id", 4),
        job_name=job_name,
        task_index=task_index,
        cluster_spec=SPEC if cluster_spec is None else cluster_spec,
        default_fs=kwargs.pop("default_fs", "hdfs://nn:8020"),
        working_dir=kwargs.pop("working_dir", "/home/me"),
        **kwargs,
    )


def test_fields():
    ctx = make_ctx("worker", 1, executor_id=4)
    assert ctx.tensorboard_url == "" and ctx.attempt == 0
    ctx.tensorboard_url = "http://tb:6006"  # the TF process sets it once TensorBoard runs
    assert (ctx.executor_id, ctx.worker_num, ctx.job_name, ctx.task_index) == (4, 4, "worker", 1)
    assert ctx.cluster_spec == SPEC and ctx.defaultFS == "hdfs://nn:8020" and ctx.working_dir == "/home/me"
    assert ctx.tensorboard_url == "http://tb:6006" and ctx.mgr is None and ctx.tmp_socket is None
    assert ctx.absolute_path("/x") == "hdfs://nn:8020/x"
    assert "worker" in repr(ctx) and "num_workers=4" in repr(ctx)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (SPEC, 4),  # chief + 3 workers; ps and evaluator do not count
        ({"worker": ["a", "b"]}, 2),
        ({"master": ["a"], "worker": ["b"]}, 2),
        ({"ps": ["a", "b"], "worker": ["c"]}, 1),
        ({"ps": ["a"], "evaluator": ["b"]}, 0),
    ],
)
def test_num_workers_counts_chief_master_and_workers(spec, expected):
    assert make_ctx(cluster_spec=spec).num_workers == expected


@pytest.mark.parametrize(
    ("job", "index", "spec", "chief"),
    [
        ("chief", 0, SPEC, True),
        ("master", 0, {"master": ["a"], "worker": ["b"]}, True),
        ("worker", 0, SPEC, False),  # a chief exists, so worker 0 is not it
        ("worker", 0, {"master": ["a"], "worker": ["b"]}, False),
        ("worker", 0, {"worker": ["a", "b"]}, True),  # no chief: worker 0 leads
        ("worker", 1, {"worker": ["a", "b"]}, False),
        ("ps", 0, {"ps": ["a"], "worker": ["b"]}, False),
        ("evaluator", 0, {"evaluator": ["a"], "worker": ["b"]}, False),
    ],
)
def test_is_chief(job, index, spec, chief):
    assert make_ctx(job, index, spec).is_chief is chief


def test_release_port_closes_the_reserved_socket():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    ctx = make_ctx(tmp_socket=sock)
    ctx.release_port()
    assert sock.fileno() == -1 and ctx.tmp_socket is None
    ctx.release_port()  # twice is harmless
    with socket.socket() as again:  # the port is free again for TF's server
        again.bind(("127.0.0.1", port))


def test_release_port_without_a_socket_is_a_no_op():
    make_ctx().release_port()


def test_get_data_feed_without_a_feed_server_says_why():
    with pytest.raises(FeedError, match="input_mode=InputMode.SPARK"):
        make_ctx().get_data_feed()


# ---- ctx.report ----------------------------------------------------------------------------------


def reporting_ctx() -> tuple[NodeContext, list[dict]]:
    sent: list[dict] = []
    return make_ctx(reporter=sent.append), sent


def test_report_hands_the_metrics_to_the_reporter_as_plain_json():
    ctx, sent = reporting_ctx()
    ctx.report({"step": 3, "loss": 0.5, "done": False, "note": None, "tag": "a"})
    ctx.report(
        {
            "loss": np.float32(0.25),
            "step": np.int64(7),
            "ok": np.bool_(True),
            "hist": np.array([1, 2, 3], np.int32),
            "matrix": np.eye(2),
            "nested": {"a": [np.float64(1.5), (1, 2)], "b": {"c": np.uint8(4)}},
        }
    )
    assert sent[0] == {"step": 3, "loss": 0.5, "done": False, "note": None, "tag": "a"}
    assert sent[1] == {
        "loss": 0.25,
        "step": 7,
        "ok": True,
        "hist": [1, 2, 3],
        "matrix": [[1.0, 0.0], [0.0, 1.0]],
        "nested": {"a": [1.5, [1, 2]], "b": {"c": 4}},
    }
    for payload in sent:  # plain Python values all the way down: the json module takes them as they are
        assert json.loads(json.dumps(payload)) == payload
    assert type(sent[1]["loss"]) is float and type(sent[1]["step"]) is int and type(sent[1]["ok"]) is bool


def test_report_keeps_non_finite_floats():
    ctx, sent = reporting_ctx()
    ctx.report({"loss": float("nan"), "grad": np.float32("inf")})
    assert math.isnan(sent[0]["loss"]) and sent[0]["grad"] == math.inf


def test_report_takes_eager_tensors():
    tf = pytest.importorskip("tensorflow")
    ctx, sent = reporting_ctx()
    ctx.report({"loss": tf.constant(0.5), "counts": tf.constant([1, 2])})
    assert sent == [{"loss": 0.5, "counts": [1, 2]}]


@pytest.mark.parametrize(
    ("metrics", "message"),
    [
        ([("loss", 0.5)], "mapping of metric name -> value. Received: list"),
        ({1: 0.5}, "keys must be str. Received: key 1 (int)"),
        ({"epoch": {2: 0.5}}, "keys must be str. Received: key 2 (int) in 'epoch'"),
        ({"model": object()}, "Received: model=object"),
        ({"when": np.datetime64("2024-01-01")}, "Received: when=datetime64"),
        ({"z": np.array([1j])}, "Received: z=ndarray of dtype complex128"),
        ({"h": {"loss": [0.5, {1, 2}]}}, "Received: h.loss[1]=set"),
        ({"b": b"bytes"}, "Received: b=bytes"),
    ],
)
def test_report_refuses_what_json_cannot_carry_naming_the_key(metrics, message):
    ctx, sent = reporting_ctx()
    with pytest.raises(ConfigError, match="JSON|mapping|keys must be str") as err:
        ctx.report(metrics)
    assert message in str(err.value)
    assert sent == []


def test_report_size_is_capped():
    ctx, sent = reporting_ctx()
    ctx.report({"predictions": list(range(10_000))})  # ~49 KB: fine
    with pytest.raises(ConfigError, match=f"at most {MAX_REPORT_BYTES} bytes") as err:
        ctx.report({"loss": 0.5, "predictions": list(range(20_000))})
    assert "largest key: 'predictions'" in str(err.value)
    assert len(sent) == 1


def test_report_outside_a_cluster_is_logged(caplog):
    ctx = make_ctx()
    with caplog.at_level(logging.INFO, logger="tfonspark.report"):
        ctx.report({"loss": np.float32(0.5)})
    assert "worker:0 reports {'loss': 0.5}" in caplog.text


# ---- TFoS helpers live in the core -------------------------------------------------------------------


def test_ctx_and_tfnode_export_through_the_one_implementation(monkeypatch):
    from tfonspark.distribute import checkpoint

    calls = []
    monkeypatch.setattr(checkpoint, "export_saved_model", lambda *a, **kw: calls.append((a, kw)) or "dir")
    assert make_ctx().export_saved_model("model", "/x", signatures="sigs") == "dir"
    assert tfonspark.TFNode.export_saved_model("model", "/y", is_chief=False) == "dir"
    assert calls == [
        (("model", "/x"), {"signatures": "sigs", "is_chief": True}),
        (("model", "/y"), {"signatures": None, "is_chief": False}),
    ]


# ---- errors --------------------------------------------------------------------------------------------


def test_in_cluster_builds_the_context_from_the_node_config():
    from tfonspark.config import NodeConfig

    config = NodeConfig("c1", "127.0.0.1", 1, "ab" * 32, default_fs="hdfs://nn:8020", attempt=3)
    place = {"executor_id": 2, "job_name": "worker", "task_index": 1, "cluster_spec": SPEC, "working_dir": "/w"}
    ctx = NodeContext.in_cluster(config, place, mgr="feed")
    assert (ctx.executor_id, ctx.job_name, ctx.task_index, ctx.working_dir) == (2, "worker", 1, "/w")
    assert (ctx.defaultFS, ctx.attempt, ctx.mgr) == ("hdfs://nn:8020", 3, "feed")


def _ctx(target):
    config = NodeConfig("c1", "127.0.0.1", 1, "ab" * 32, attempt=1, data_service=target)
    config = NodeConfig.from_json(config.to_json())  # it travels to the node as JSON
    place = {"executor_id": 0, "job_name": "worker", "task_index": 0, "cluster_spec": {"worker": ["a:1"]}}
    return NodeContext.in_cluster(config, {**place, "working_dir": "/tmp"})


def test_ctx_names_one_job_per_call_the_same_on_every_node(monkeypatch):
    from tfonspark.tfprocess import context

    seen = []
    monkeypatch.setattr(context, "distribute", lambda ds, target, mode, job_name: seen.append((target, mode, job_name)))
    for _node in range(2):
        ctx = _ctx("grpc://d:1")
        assert ctx.data_service == "grpc://d:1"
        ctx.distribute_dataset("train")
        ctx.distribute_dataset("val", "parallel_epochs")
        ctx.distribute_dataset("more", job_name="mine")
    first = [
        ("grpc://d:1", "distributed_epoch", "tfonspark-a1-1"),
        ("grpc://d:1", "parallel_epochs", "tfonspark-a1-2"),
        ("grpc://d:1", "distributed_epoch", "mine"),
    ]
    assert seen == first * 2


def test_ctx_without_a_service_says_how_to_start_one():
    ctx = _ctx(None)
    assert ctx.data_service is None
    with pytest.raises(ConfigError, match=r"run\(\.\.\., data_service=N\)"):
        ctx.distribute_dataset(object())
