"""tfprocess/hints.py: the ``Hint:`` notes that name fixes, among them the one for Keras 3's model.fit
under ParameterServerStrategy (issue 23, item 4).

On TF 2.21 Keras 3's fit hands the strategy a plain dataset, and TF refuses it with
"To use this dataset, you need to pass this dataset to ClusterCoordinator.create_per_worker_dataset".
The coordinator is the driver program, so ``ps_cluster``'s ``__exit__`` adds the note there; a
coordinator running on a node gets the same line through ``hint_for``.
"""

from __future__ import annotations

import sys
import types

import pytest

from tfonspark.tfprocess.hints import add_ps_hint, hint_for, ps_hint_for

TF_MESSAGE = "To use this dataset, you need to pass this dataset to ClusterCoordinator.create_per_worker_dataset."


def test_the_ps_dataset_error_names_the_custom_loop_and_tf_keras_fit():
    hint = ps_hint_for(ValueError(TF_MESSAGE))
    assert "custom loop" in hint and "create_per_worker_dataset" in hint and "docs/ps.md" in hint
    assert "tf_keras" in hint and "DatasetCreator" in hint
    assert hint_for(ValueError(TF_MESSAGE), environ={}) == hint  # a node's traceback gets it too


def test_the_hint_is_found_behind_a_wrapping_error():
    try:
        try:
            raise ValueError(TF_MESSAGE)
        except ValueError as inner:
            raise RuntimeError("training failed") from inner
    except RuntimeError as outer:
        assert ps_hint_for(outer)


@pytest.mark.parametrize(
    "exc",
    [
        ValueError("PerReplica:{0: 1} is not a tensor"),  # an MWMS hint, not for a PS coordinator
        TypeError(TF_MESSAGE),  # another type with the same words
        ValueError("create_per_worker_dataset got a bad dataset_fn"),
    ],
)
def test_other_errors_get_no_ps_hint(exc):
    assert ps_hint_for(exc) == ""
    add_ps_hint(exc)
    assert not getattr(exc, "__notes__", [])


@pytest.mark.skipif(sys.version_info < (3, 11), reason="BaseException.add_note is Python 3.11")
def test_the_note_is_added_once():
    exc = ValueError(TF_MESSAGE)
    add_ps_hint(exc)
    add_ps_hint(exc)  # a second pass (nested blocks) does not repeat it
    assert exc.__notes__ == [f"Hint: {ps_hint_for(exc)}"]


class _Stops:
    """Stands in for the nodes' control plane and the port hand-over: records that the block's end stopped them."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.config = types.SimpleNamespace(cluster_id="c" * 32)

    def check(self) -> None:
        pass  # no node failed

    def nodes(self) -> list:
        return []  # no evaluator to stop first

    def teardown(self, grace_secs: float, final: bool = False) -> None:
        self.calls.append("stop")

    def release(self) -> None:
        self.calls.append("release")


@pytest.mark.skipif(sys.version_info < (3, 11), reason="BaseException.add_note is Python 3.11")
def test_leaving_a_ps_cluster_block_with_the_error_adds_the_hint():
    from tfonspark.config import InputMode
    from tfonspark.driver.cluster import Reserved, Running
    from tfonspark.driver.services.ps import PSCluster

    stops = _Stops()
    no_streams = types.SimpleNamespace(join=lambda timeout: True)
    held = Reserved("chief", stops, "127.0.0.1:1")
    running = Running(None, InputMode.TENSORFLOW, types.SimpleNamespace(gang=stops), None, no_streams, None, held=held)
    with pytest.raises(ValueError) as info, PSCluster(running):
        raise ValueError(TF_MESSAGE)
    assert info.value.__notes__ == [f"Hint: {ps_hint_for(info.value)}"]
    assert stops.calls == ["stop", "release"]  # and the cluster stopped all the same


def test_keras_3_under_multiworker_mirrored_names_the_keras_2_route():
    exc = ValueError("Attempt to convert a value (PerReplica:{ 0: <tf.Tensor ...> }) with an unsupported type")
    assert "tfonspark[tfos]" in hint_for(exc, {})
    assert hint_for(exc, {"TF_USE_LEGACY_KERAS": "1"}) == ""  # raised outside Keras 3: not this case
    assert "Keras 3" in hint_for(ValueError("Invalid reduction dimension 0 for input with 0 dimensions"), {})


def test_hints_for_estimator_numpy_aliases_and_missing_tf_keras():
    missing = ModuleNotFoundError("No module named 'tensorflow_estimator'", name="tensorflow_estimator")
    assert "removed with tf.estimator" in hint_for(missing, {})
    alias = AttributeError("module 'numpy' has no attribute 'int'.\n`np.int` was a deprecated alias")
    assert "np.int64" in hint_for(alias, {})
    no_tf_keras = ImportError("Keras cannot be imported. Check that it is installed.")
    assert "pip install 'tfonspark[tfos]'" in hint_for(no_tf_keras, {"TF_USE_LEGACY_KERAS": "1"})
    assert hint_for(KeyError("x"), {}) == ""


def test_a_hint_is_found_through_the_exception_chain():
    try:
        try:
            raise ModuleNotFoundError("No module named 'tensorflow_estimator'", name="tensorflow_estimator")
        except ImportError as inner:
            raise RuntimeError("loading the model failed") from inner
    except RuntimeError as outer:
        assert "tensorflow_estimator" in hint_for(outer, {})


def test_a_keras_3_model_carried_from_the_driver_into_a_keras_2_node_is_named():
    namespace: dict[str, object] = {}
    code = compile(
        "def fit():\n    raise ValueError('cannot convert PerReplica:{0: x}')\n", "/x/keras/src/trainer.py", "exec"
    )
    exec(code, namespace)  # a frame whose file is Keras 3's own code
    try:
        namespace["fit"]()  # type: ignore[operator]
    except ValueError as exc:
        assert "set TF_USE_LEGACY_KERAS=1 in the driver's environment" in hint_for(exc, {"TF_USE_LEGACY_KERAS": "1"})


def test_a_conv2d_on_an_empty_batch_names_tfonspark_keras_fit():
    """tf_keras' own model.fit under MWMS with uneven input: oneDNN's error on a 0-row batch."""
    tf = pytest.importorskip("tensorflow")
    for message in (
        "input depth must be evenly divisible by filter depth: 1 vs 16\n\t [[{{node conv2d_1/Relu}}]]",
        "Incompatible shapes: [0,14,14,16] vs. [1,1,1,32] [Op:AddV2]",
    ):
        hint = hint_for(tf.errors.InvalidArgumentError(None, None, message), {"TF_USE_LEGACY_KERAS": "1"})
        assert "0 rows" in hint and "tfonspark.keras.fit" in hint and "drop_remainder=True" in hint
    assert hint_for(tf.errors.InvalidArgumentError(None, None, "Incompatible shapes: [3,2] vs. [4,2]"), {}) == ""


def test_a_collective_timeout_names_the_peers_it_waited_on_and_the_setting():
    import json

    import tensorflow as tf

    tf_config = {
        "cluster": {"chief": ["10.0.0.1:2222"], "worker": ["10.0.0.2:2222", "10.0.0.3:2222"]},
        "task": {"type": "worker", "index": 0},
    }
    environ = {"TF_CONFIG": json.dumps(tf_config), "TFONSPARK_COLLECTIVE_TIMEOUT": "20"}
    error = tf.errors.DeadlineExceededError(None, None, "Collective ops is aborted by: ... timed out")
    hint = hint_for(error, environ)
    assert "chief:0 at 10.0.0.1:2222, worker:1 at 10.0.0.3:2222" in hint and "worker:0" not in hint
    assert "20 s" in hint and "collective_timeout" in hint and "unreachable" in hint
    assert hint_for(tf.errors.DeadlineExceededError(None, None, "a file read timed out"), {}) == ""
