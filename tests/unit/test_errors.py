"""errors.py: the error tree, its messages and attributes, and that every error survives pickling."""

from __future__ import annotations

import inspect
import pickle

import pytest

import tfonspark.errors as errors_module
from tfonspark.errors import (
    AuthenticationError,
    CheckpointTimeout,
    ClusterError,
    ConfigError,
    DataFormatError,
    ExecutorEnvironmentError,
    FeedError,
    FeedTimeout,
    InputError,
    NodeFailed,
    ProtocolError,
    ReservationTimeout,
    ShutdownTimeout,
    TFoSError,
)

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
    ExecutorEnvironmentError(
        "no tfonspark in the executors' Python", python="/usr/bin/python3", host="h1", driver_version="0.9.0"
    ),
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


def test_node_failed_says_a_lost_nodes_reason_once_and_shows_real_output():
    """A lost node has no output: how it ended (its ``failures`` entry) is in the message already
    and is not repeated under "last output" (issue 45: the text said it twice)."""
    from tfonspark.errors import NodeFailed

    why = "was lost: unreachable: no heartbeat from its supervisor on 10.0.0.7 for 10s"
    lost = NodeFailed(
        f"TensorFlow node worker:0 (executor 0) {why}", role="worker", index=0, failures={"worker:0": why}
    )
    assert str(lost).count("unreachable") == 1 and "last output" not in str(lost)
    assert lost.failures == {"worker:0": why}  # still there for code that reads it
    crashed = NodeFailed("worker:1 failed with exit code 1", failures={"worker:1": "ValueError: bad shape"})
    assert "--- last output of worker:1 ---\nValueError: bad shape" in str(crashed)
