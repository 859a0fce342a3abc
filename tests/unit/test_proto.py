"""tfonspark.proto: message classes declared in Python, wire-compatible with TensorFlow's."""

from __future__ import annotations

import pytest

from tfonspark import proto
from tfonspark.data.tfrecord import example as codec
from tfonspark.ml import savedmodel

PAIRS = proto.Schema(
    "tfonspark.test.pairs",
    (
        proto.message(
            "Holder",
            proto.field("count", 1, "int64"),
            proto.field("names", 2, "string", repeated=True),
            proto.field("as_int", 3, "int32", oneof="value"),
            proto.field("as_text", 4, "string", oneof="value"),
            proto.map_field("by_name", 5, "string", "Holder.Inner"),
            nested=(proto.message("Inner", proto.field("flag", 1, "bool")),),
        ),
    ),
)


def test_fields_oneofs_maps_and_nested_messages():
    holder_class = PAIRS.message_class("Holder")
    holder = holder_class(count=3, names=["a", "b"], as_text="t")
    holder.by_name["x"].flag = True
    back = holder_class.FromString(holder.SerializeToString())
    assert (back.count, list(back.names), back.WhichOneof("value")) == (3, ["a", "b"], "as_text")
    assert back.by_name["x"].flag and "y" not in back.by_name
    assert type(back.by_name["x"]) is PAIRS.message_class("Holder.Inner")
    entry = holder_class.DESCRIPTOR.nested_types_by_name["ByNameEntry"]
    assert entry.GetOptions().map_entry


def test_classes_are_built_once_per_schema():
    assert PAIRS.message_class("Holder") is PAIRS.message_class("Holder")
    same = proto.Schema(PAIRS.package, PAIRS.messages)  # equal schemas share one pool
    assert same.message_class("Holder") is PAIRS.message_class("Holder")


def test_entry_names_follow_protoc():
    assert proto.map_field("signature_def", 5, "string", "X").type == "SignatureDefEntry"
    assert proto.map_field("feature", 1, "string", "X").type == "FeatureEntry"


# ---- the same wire format as TensorFlow's own messages ----------------------------------------


@pytest.fixture(scope="module")
def tf():
    return pytest.importorskip("tensorflow")


def _same_fields(ours, theirs, seen=None):
    """Every field we declare exists in TF's descriptor with the same number, type and label."""
    seen = set() if seen is None else seen
    if ours.full_name in seen:
        return
    seen.add(ours.full_name)
    for name, fld in ours.fields_by_name.items():
        other = theirs.fields_by_name[name]
        assert fld.number == other.number, name
        wire_type = fld.type if fld.type != fld.TYPE_INT32 else other.TYPE_ENUM  # DataType: int32 on the wire
        assert other.type in (fld.type, wire_type), name
        assert fld.is_repeated == other.is_repeated, name
        if fld.message_type is not None:
            _same_fields(fld.message_type, other.message_type, seen)


def test_example_matches_tensorflow(tf):
    _same_fields(codec.example_class().DESCRIPTOR, tf.train.Example.DESCRIPTOR)


def test_saved_model_matches_tensorflow(tf):
    from tensorflow.core.protobuf import saved_model_pb2

    _same_fields(savedmodel._saved_model_class().DESCRIPTOR, saved_model_pb2.SavedModel.DESCRIPTOR)
