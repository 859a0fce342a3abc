"""SparkClusterResolver: its methods, its errors, and that it resolves as TF's TFConfigClusterResolver."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys

import pytest

tf = pytest.importorskip("tensorflow")

from tfonspark.distribute import SparkClusterResolver  # noqa: E402
from tfonspark.errors import ConfigError  # noqa: E402
from tfonspark.tfprocess.context import NodeContext  # noqa: E402

PS_SPEC = {"chief": ["h0:2000"], "worker": ["h1:2001", "h2:2002"], "ps": ["h3:2003", "h4:2004"]}

#: the clusters compared with TFConfigClusterResolver, task by task
SPECS = {
    "workers": {"worker": ["h1:2001", "h2:2002", "h3:2003"]},
    "chief+workers": {"chief": ["h0:2000"], "worker": ["h1:2001", "h2:2002"]},
    "ps+workers+chief": PS_SPEC,
    "evaluator": {"chief": ["h0:2000"], "worker": ["h1:2001"], "evaluator": ["h9:2009"]},
    "tfos master+ps": {"master": ["h0:2000"], "worker": ["h1:2001"], "ps": ["h3:2003"]},
    "one task": {"chief": ["h0:2000"]},
}


def _tasks(spec):
    return [(job, i) for job, addresses in spec.items() for i in range(len(addresses))]


# -- the class ---------------------------------------------------------------------------------


def test_it_is_a_real_tf_cluster_resolver_and_pickles():
    resolver = SparkClusterResolver(PS_SPEC, "worker", 1)
    assert isinstance(resolver, tf.distribute.cluster_resolver.ClusterResolver)
    assert issubclass(SparkClusterResolver, tf.distribute.cluster_resolver.ClusterResolver)
    assert SparkClusterResolver.__module__ == "tfonspark.distribute.resolver"
    again = pickle.loads(pickle.dumps(resolver))
    assert isinstance(again, SparkClusterResolver)
    assert (again.task_type, again.task_id, again.master()) == ("worker", 1, "grpc://h2:2002")


def test_importing_the_module_does_not_import_tensorflow():
    code = "import sys, tfonspark.distribute.resolver, tfonspark.distribute; print('tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_methods():
    resolver = SparkClusterResolver(PS_SPEC, "ps", 1, num_gpus=2)
    assert resolver.cluster_spec().as_dict() == PS_SPEC
    assert resolver.cluster_spec() is not resolver.cluster_spec()  # fresh, as TF asks of implementors
    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer, resolver.environment) == ("ps", 1, "grpc", "")
    assert resolver.master() == "grpc://h4:2004"
    assert resolver.master("chief", 0) == "grpc://h0:2000"
    assert resolver.master("worker", 1, rpc_layer="grpc+verbs") == "grpc+verbs://h2:2002"
    assert resolver.master(rpc_layer="") == "h4:2004"
    assert resolver.num_accelerators() == {"GPU": 2}
    assert resolver.num_accelerators("worker", 0, config_proto=None) == {"GPU": 2}
    assert SparkClusterResolver(PS_SPEC, "ps", 1).num_accelerators() == {}


def test_one_task_cluster_has_no_master_as_in_tf():
    resolver = SparkClusterResolver({"worker": ["h1:2001"]}, "worker", 0)
    assert resolver.master() == resolver.master("worker", 0) == ""


def test_task_and_rpc_layer_are_settable():
    resolver = SparkClusterResolver(PS_SPEC, "worker", 1, rpc_layer="", environment="google")
    assert resolver.master() == "h2:2002" and resolver.environment == "google"
    resolver.task_type = "chief"
    resolver.task_id = 0
    resolver.rpc_layer = "grpc"
    assert (resolver.task_type, resolver.task_id, resolver.master()) == ("chief", 0, "grpc://h0:2000")
    with pytest.raises(ConfigError, match=r"task_type 'evaluator' is not a job.*valid: chief, worker, ps"):
        resolver.task_type = "evaluator"
    with pytest.raises(ConfigError, match=r"task_id must be an integer in 0\.\.0 .*Received: task_id=1"):
        resolver.task_id = 1


def test_accepts_a_tf_cluster_spec():
    resolver = SparkClusterResolver(tf.train.ClusterSpec(PS_SPEC), "chief", 0)
    assert resolver.cluster_spec() == tf.train.ClusterSpec(PS_SPEC)


@pytest.mark.parametrize(
    "spec, task_type, task_id, fragment",
    [
        ({}, "worker", 0, r"non-empty mapping.*Received: \{\}"),
        (None, "worker", 0, r"non-empty mapping.*Received: None"),
        ({"workers": ["h:1"]}, "workers", 0, r"job 'workers' is not a TensorFlow task type \(valid: chief, master"),
        ({"worker": "h:1"}, "worker", 0, r"cluster_spec\['worker'\] must be a non-empty list.*Received: 'h:1'"),
        ({"worker": []}, "worker", 0, r"non-empty list"),
        ({"worker": ["h1"]}, "worker", 0, r"holds 'h1', which is not a 'host:port'"),
        ({"worker": ["h1:x"]}, "worker", 0, r"holds 'h1:x'"),
        ({"worker": [7]}, "worker", 0, r"holds 7"),
        (PS_SPEC, "evaluator", 0, r"task_type 'evaluator' is not a job.*valid: chief, worker, ps\)"),
        (PS_SPEC, "worker", 2, r"0\.\.1 \('worker' has 2 task\(s\)\).*Received: task_id=2"),
        (PS_SPEC, "worker", -1, r"Received: task_id=-1"),
        (PS_SPEC, "worker", True, r"Received: task_id=True"),
        (PS_SPEC, "worker", "0", r"Received: task_id='0'"),
    ],
)
def test_bad_input_names_what_was_received_and_what_is_valid(spec, task_type, task_id, fragment):
    with pytest.raises(ConfigError, match=fragment):
        SparkClusterResolver(spec, task_type, task_id)


@pytest.mark.parametrize(
    "kwargs, fragment", [({"num_gpus": -1}, "num_gpus=-1"), ({"num_gpus": 1.5}, "1.5"), ({"rpc_layer": None}, "None")]
)
def test_bad_num_gpus_or_rpc_layer(kwargs, fragment):
    with pytest.raises(ConfigError, match=fragment):
        SparkClusterResolver(PS_SPEC, "worker", 0, **kwargs)


def test_master_and_num_accelerators_check_the_task_they_are_asked_about():
    resolver = SparkClusterResolver(PS_SPEC, "worker", 0)
    with pytest.raises(ConfigError, match="task_type 'evaluator'"):
        resolver.master("evaluator", 0)
    with pytest.raises(ConfigError, match=r"0\.\.1 \('ps' has 2"):
        resolver.master("ps", 5)
    with pytest.raises(ConfigError, match="task_type 'evaluator'"):
        resolver.num_accelerators("evaluator")


# -- from TF_CONFIG ----------------------------------------------------------------------------


def test_from_tf_config_text_mapping_and_variable(monkeypatch):
    doc = {"cluster": PS_SPEC, "task": {"type": "ps", "index": "1"}}
    for source in (json.dumps(doc), doc):
        resolver = SparkClusterResolver.from_tf_config(source, num_gpus=1)
        assert (resolver.task_type, resolver.task_id, resolver.num_accelerators()) == ("ps", 1, {"GPU": 1})
    monkeypatch.setenv("TF_CONFIG", json.dumps({**doc, "rpc_layer": "grpc+loas"}))
    resolver = SparkClusterResolver.from_tf_config()
    assert (resolver.rpc_layer, resolver.master()) == ("grpc+loas", "grpc+loas://h4:2004")
    assert SparkClusterResolver.from_tf_config(rpc_layer="").master() == "h4:2004"


@pytest.mark.parametrize(
    "doc, fragment",
    [
        ("", "names no cluster and task"),
        ('{"task": {"type": "worker", "index": 0}}', "names no cluster and task"),
        ('{"cluster": {"worker": ["h:1"]}, "task": {"type": "worker", "index": 1}}', "not in the cluster"),
        ('{"cluster": {"trainer": ["h:1"]}, "task": {"type": "trainer"}}', r"'trainer' is not supported \(valid"),
        ("{nope", "not valid JSON"),
    ],
)
def test_from_tf_config_rejects(doc, fragment, monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ConfigError, match=fragment):
        SparkClusterResolver.from_tf_config(doc)


# -- the node's own ----------------------------------------------------------------------------


def test_node_context_gives_its_own_resolver():
    ctx = NodeContext(
        executor_id=3,
        job_name="ps",
        task_index=1,
        cluster_spec=PS_SPEC,
        default_fs="file://",
        working_dir="/tmp",
        gpus=["0", "1"],
    )
    resolver = ctx.cluster_resolver()
    assert isinstance(resolver, SparkClusterResolver)
    assert resolver.cluster_spec().as_dict() == PS_SPEC
    assert (resolver.task_type, resolver.task_id, resolver.master()) == ("ps", 1, "grpc://h4:2004")
    assert resolver.num_accelerators() == {"GPU": 2}
    bare = NodeContext(
        executor_id=0,
        job_name="worker",
        task_index=0,
        cluster_spec={},
        default_fs="file://",
        working_dir="/tmp",
        gpus=[],
    )
    with pytest.raises(ConfigError, match="non-empty mapping"):
        bare.cluster_resolver()


# -- the same as TFConfigClusterResolver -------------------------------------------------------


@pytest.mark.parametrize("spec", list(SPECS.values()), ids=list(SPECS))
def test_resolves_as_tf_config_cluster_resolver(spec, monkeypatch):
    """For every task of each cluster: the same spec, task, masters and accelerators as TF's.

    TF's resolver has no rpc_layer of its own (None: bare ``host:port`` masters), so its masters
    are compared with ours without a scheme, and with ``rpc_layer="grpc"`` given to both.
    """
    for job, index in _tasks(spec):
        monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": spec, "task": {"type": job, "index": index}}))
        ours = SparkClusterResolver.from_tf_config()
        theirs = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        grpc = tf.distribute.cluster_resolver.TFConfigClusterResolver(rpc_layer="grpc")
        assert ours.cluster_spec() == theirs.cluster_spec()
        assert ours.cluster_spec().as_dict() == theirs.cluster_spec().as_dict()
        assert (ours.task_type, ours.task_id) == (theirs.task_type, theirs.task_id)
        assert ours.master() == grpc.master()
        assert ours.master(rpc_layer="") == theirs.master()
        for other_job, other_index in _tasks(spec):
            assert ours.master(other_job, other_index) == grpc.master(other_job, other_index)
        assert ours.num_accelerators() == dict(theirs.num_accelerators()) == {}  # CPU here
        direct = SparkClusterResolver(spec, job, index)
        assert (direct.cluster_spec(), direct.master()) == (ours.cluster_spec(), ours.master())
