"""hdfs_path (TFoS semantics), NodeContext, and the error tree's picklability."""

from __future__ import annotations

import getpass
import inspect
import pickle
import socket
from types import SimpleNamespace

import pytest

import tfonspark.errors as errors_module
from tfonspark.errors import (
    AuthenticationError,
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
from tfonspark.tfprocess.context import NodeContext, hdfs_path

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
    ctx = make_ctx("worker", 1, executor_id=4, tensorboard_url="http://tb:6006")
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
