"""tfprocess/data_worker.py: the tf.data service's dataset guard, data_service's argument checks (no
Spark, no service), and the nodes that serve beside map_fun.

On TF 2.21 a dataset that calls back into Python fails only while iterating, with ``Could not
find callback with key=pyfunc_0 in the registry``; ``distribute`` must say what is wrong before
any job starts (here the target does not even exist).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import tfonspark
from tfonspark.errors import ConfigError
from tfonspark.testing import FakeSparkContext
from tfonspark.tfprocess import data_worker
from tfonspark.tfprocess.data_worker import OnNodes, check_serializable, distribute, python_ops, split_address

tf = pytest.importorskip("tensorflow")
NOWHERE = "grpc://127.0.0.1:1"  # nothing listens: the guard must fail first


def _gen():
    yield from range(3)


def _cases():
    rng = tf.data.Dataset.range(4)
    return {
        "py_function": (rng.map(lambda x: tf.py_function(lambda y: y, [x], tf.int64)), "EagerPyFunc"),
        "numpy_function": (rng.map(lambda x: tf.numpy_function(lambda y: y, [x], tf.int64)), "PyFunc"),
        "from_generator": (
            tf.data.Dataset.from_generator(_gen, output_signature=tf.TensorSpec((), tf.int64)),
            "PyFunc",
        ),
        "nested": (  # inside a function inside a function of the dataset's graph
            rng.interleave(
                lambda x: tf.data.Dataset.range(x).map(lambda y: tf.py_function(lambda z: z, [y], tf.int64))
            ),
            "EagerPyFunc",
        ),
    }


@pytest.mark.parametrize("name", ["py_function", "numpy_function", "from_generator", "nested"])
def test_a_python_callback_is_refused_before_any_job_starts(name):
    dataset, op = _cases()[name]
    assert op in python_ops(dataset)
    with pytest.raises(ConfigError) as info:
        distribute(dataset, NOWHERE)
    message = str(info.value)
    assert "cannot serialize" in message and op in message, message
    assert "Use TensorFlow ops instead" in message and "after distribute()" in message, message


def test_a_dataset_of_tf_ops_passes():
    lines = tf.data.Dataset.from_tensor_slices(["a.txt"]).interleave(tf.data.TextLineDataset)
    ok = tf.data.Dataset.range(10).map(lambda x: x * 2).interleave(lambda x: lines.map(tf.strings.length))
    assert python_ops(ok) == []
    check_serializable(ok)


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_data_service_needs_a_worker(bad):
    with pytest.raises(ConfigError, match="data_service needs num_workers >= 1"):
        tfonspark.data_service(FakeSparkContext(), num_workers=bad)


def test_split_address_takes_ipv6_hosts_out_of_brackets():
    assert split_address("10.0.0.1:5000") == ("10.0.0.1", 5000)
    assert split_address("[fe80::1]:5000") == ("fe80::1", 5000)


def main_fun(args, ctx):
    return ("ran", ctx.executor_id)


def test_the_first_nodes_serve_beside_map_fun_and_stop_after_it(monkeypatch):
    events = []

    class Server:
        def stop(self):
            events.append("stopped")

    monkeypatch.setattr(data_worker, "serve_beside", lambda ctx, wait: events.append(("serve", wait)) or Server())
    program = OnNodes(main_fun, 1, 5.0)
    assert program(None, SimpleNamespace(executor_id=1)) == ("ran", 1) and events == []  # not one of the first
    assert program(None, SimpleNamespace(executor_id=0)) == ("ran", 0)
    assert events == [("serve", 5.0), "stopped"]

    def fails(args, ctx):
        raise ValueError("map_fun failed")

    with pytest.raises(ValueError, match="map_fun failed"):
        OnNodes(fails, 1)(None, SimpleNamespace(executor_id=0))
    assert events[-1] == "stopped"
