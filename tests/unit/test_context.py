"""hdfs_path (TFoS semantics), NodeContext (ctx.report included), and the error tree's picklability."""

from __future__ import annotations

import ast
import getpass
import inspect
import json
import logging
import math
import pickle
import socket
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import tfonspark
import tfonspark.errors as errors_module
from tfonspark.errors import (
    AuthenticationError,
    CheckpointTimeout,
    ClusterError,
    ConfigError,
    DataFormatError,
    FeedError,
    FeedTimeout,
    InputError,
    NodeFailed,
    ProtocolError,
    ReservationTimeout,
    ShutdownTimeout,
    TFoSError,
)
from tfonspark.tfprocess import server as server_module
from tfonspark.tfprocess.context import NodeContext, hdfs_path
from tfonspark.tfprocess.report import MAX_REPORT_BYTES, Reporter, report_payload

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


def test_report_refuses_a_cycle():
    loop: dict = {}
    loop["self"] = loop
    with pytest.raises(ConfigError, match="nest more than"):
        report_payload({"loop": loop})


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


def test_reporter_sends_in_order_off_the_callers_thread():
    sent: list[tuple[dict, str]] = []
    reporter = Reporter(lambda payload: sent.append((payload, threading.current_thread().name)))
    for i in range(50):
        reporter({"i": i})
    assert reporter.flush(5)
    assert [p["i"] for p, _ in sent] == list(range(50))
    assert {name for _, name in sent} == {"tfos-report"}


def test_reporter_never_blocks_and_drops_the_oldest(caplog):
    release = threading.Event()
    sent: list[int] = []

    def stuck(payload: dict) -> None:  # a supervisor that does not read its pipe
        release.wait(10)
        sent.append(payload["i"])

    reporter = Reporter(stuck, max_pending=3)
    with caplog.at_level(logging.WARNING):
        for i in range(10):
            reporter({"i": i})  # returns at once although nothing can be sent
    assert not reporter.flush(0.05)
    release.set()
    assert reporter.flush(5)
    assert sent[-3:] == [7, 8, 9] and reporter.dropped == len(range(10)) - len(sent)
    assert caplog.text.count("dropping the oldest") == 1


def test_reporter_survives_a_sender_that_fails():
    calls: list[int] = []

    def broken(payload: dict) -> None:
        calls.append(payload["i"])
        raise BrokenPipeError("the supervisor is gone")

    reporter = Reporter(broken)
    reporter({"i": 1})
    reporter({"i": 2})
    assert reporter.flush(5) and calls == [1, 2]


def test_the_tf_process_sends_reports_as_node_events_to_its_supervisor():
    """entry.py's reporter writes the status line that the supervisor relays as a Reported event."""
    import io

    from tfonspark.tfprocess import entry

    status = io.StringIO()
    reporter = entry._reporter(status)
    make_ctx(reporter=reporter).report({"step": np.int64(1), "loss": 0.5})
    assert reporter.flush(5)
    line = status.getvalue()
    assert line.endswith("\n") and line.count("\n") == 1
    assert json.loads(line[1:]) == {"type": "reported", "metrics": {"step": 1, "loss": 0.5}}


def test_reporter_needs_room_for_one():
    with pytest.raises(ConfigError, match="max_pending"):
        Reporter(lambda payload: None, max_pending=0)


# ---- TFoS helpers live in the core -------------------------------------------------------------------


def test_start_cluster_server_releases_the_port_and_starts_tf_server(monkeypatch):
    calls = []
    fake_tf = SimpleNamespace(
        train=SimpleNamespace(ClusterSpec=lambda spec: ("spec", spec)),
        distribute=SimpleNamespace(Server=lambda cluster, **kw: calls.append((cluster, kw)) or "server"),
    )
    monkeypatch.setitem(__import__("sys").modules, "tensorflow", fake_tf)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    ctx = make_ctx("worker", 2, tmp_socket=sock)
    assert ctx.start_cluster_server(rdma=True) == (("spec", SPEC), "server")
    assert sock.fileno() == -1
    assert calls == [(("spec", SPEC), {"job_name": "worker", "task_index": 2, "protocol": "grpc+verbs"})]
    assert tfonspark.TFNode.start_cluster_server is server_module.start_cluster_server


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


def test_the_core_never_imports_the_tfos_face():
    """tfprocess/ and distribute/ implement; TFNode.py only re-exports them (no import circle)."""
    package = Path(tfonspark.__file__).parent
    offenders = []
    for path in [*package.glob("tfprocess/*.py"), *package.glob("distribute/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [f"{node.module or ''}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            if any(n.split(".")[-1] == "TFNode" or n.endswith(".TFNode") for n in names):
                offenders.append(f"{path.name}:{node.lineno}")
    assert offenders == []


# ---- errors --------------------------------------------------------------------------------------------

EXAMPLES = [
    TFoSError("base"),
    ConfigError("bad setting. Received: 3"),
    InputError("ragged", column="features", partition=3, row=17),
    InputError("plain"),
    ClusterError("cluster broke"),
    ReservationTimeout("too few", registered=2, required=5),
    NodeFailed("node failed", role="worker", index=1, exit_code=-9, traceback="Traceback: boom"),
    NodeFailed("plain"),
    ShutdownTimeout("slow"),
    FeedError("feed failed"),
    FeedTimeout("no data"),
    ProtocolError("bad bytes"),
    AuthenticationError("no secret"),
    DataFormatError("corrupt record", path="/data/x.tfrecord", offset=1024),
    DataFormatError("corrupt"),
    CheckpointTimeout("no checkpoint within timeout=60s"),
]


def test_examples_cover_the_whole_error_tree():
    classes = {obj for _, obj in inspect.getmembers(errors_module, inspect.isclass) if issubclass(obj, TFoSError)}
    assert {type(e) for e in EXAMPLES} == classes
    assert set(errors_module.__all__) == {c.__name__ for c in classes}


@pytest.mark.parametrize("err", EXAMPLES, ids=lambda e: f"{type(e).__name__}:{e.args[0][:12]}")
def test_errors_survive_pickling(err):
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        back = pickle.loads(pickle.dumps(err, protocol=protocol))
        assert type(back) is type(err)
        assert back.args == err.args and str(back) == str(err)
        assert back.__dict__ == err.__dict__


def test_error_attributes_and_messages():
    err = InputError("ragged", column="features", partition=3, row=17)
    assert (err.column, err.partition, err.row) == ("features", 3, 17)
    assert str(err) == "ragged (column='features', partition=3, row=17)"
    nf = NodeFailed("node failed", role="worker", index=1, exit_code=-9, traceback="Traceback: boom")
    assert (nf.role, nf.index, nf.exit_code, nf.traceback) == ("worker", 1, -9, "Traceback: boom")
    assert "worker:1" in str(nf) and "Traceback: boom" in str(nf)
    rt = ReservationTimeout("too few", registered=2, required=5)
    assert (rt.registered, rt.required) == (2, 5)
    dfe = DataFormatError("corrupt record", path="/data/x.tfrecord", offset=1024)
    assert str(dfe) == "corrupt record: /data/x.tfrecord at byte 1024" and dfe.offset == 1024


@pytest.mark.parametrize(
    ("cls", "bases"),
    [
        (ConfigError, (ValueError,)),
        (InputError, (ValueError,)),
        (DataFormatError, (ValueError,)),
        (ReservationTimeout, (ClusterError, TimeoutError)),
        (ShutdownTimeout, (ClusterError, TimeoutError)),
        (NodeFailed, (ClusterError,)),
        (FeedTimeout, (FeedError, TimeoutError)),
        (AuthenticationError, (ProtocolError,)),
    ],
)
def test_error_tree(cls, bases):
    assert issubclass(cls, TFoSError)
    for base in bases:
        assert issubclass(cls, base)


def test_pickled_errors_keep_their_attributes_after_being_raised():
    try:
        raise NodeFailed("boom", role="chief", index=0, exit_code=1, traceback="tb")
    except NodeFailed as exc:
        back = pickle.loads(pickle.dumps(exc))
    assert (back.role, back.index, back.exit_code, back.traceback) == ("chief", 0, 1, "tb")
    with pytest.raises(NodeFailed, match="boom"):
        raise back


def test_in_cluster_builds_the_context_from_the_node_config():
    from tfonspark.config import NodeConfig

    config = NodeConfig("c1", "127.0.0.1", 1, "ab" * 32, default_fs="hdfs://nn:8020", attempt=3)
    place = {"executor_id": 2, "job_name": "worker", "task_index": 1, "cluster_spec": SPEC, "working_dir": "/w"}
    ctx = NodeContext.in_cluster(config, place, mgr="feed")
    assert (ctx.executor_id, ctx.job_name, ctx.task_index, ctx.working_dir) == (2, "worker", 1, "/w")
    assert (ctx.defaultFS, ctx.attempt, ctx.mgr) == ("hdfs://nn:8020", 3, "feed")
