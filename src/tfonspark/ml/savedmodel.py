"""What a SavedModel serves, read on the driver without TensorFlow.

``TFModel.transform`` needs the served signature's input and output names, dtypes and shapes on
the driver, before any Spark job runs: they give the result schema and let bad mappings fail
early. They are in ``saved_model.pb`` (``MetaGraphDef.signature_def``), which this module
parses with a private protobuf schema holding only the fields it needs (the graph itself is
skipped by the parser), so the driver never imports TensorFlow.

:func:`model_key` turns the location and the content of a SavedModel into the id under which
executors cache the loaded model: re-exporting into the same directory gives a new id, so a
Python worker never serves a stale model.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from typing import Any

from .. import fs, proto
from ..errors import ConfigError, DataFormatError

__all__ = [
    "MetaGraph",
    "Signature",
    "TensorSpec",
    "model_key",
    "parse_saved_model",
    "read_saved_model",
    "resolve_export_dir",
    "select_signature",
    "strip_port",
]

SAVED_MODEL_FILE = "saved_model.pb"
VARIABLES_INDEX = "variables/variables.index"

#: ``tensorflow.DataType`` enum values -> dtype names (those a DataFrame column can carry).
DTYPES: dict[int, str] = {
    1: "float32",
    2: "float64",
    3: "int32",
    4: "uint8",
    5: "int16",
    6: "int8",
    7: "string",
    8: "complex64",
    9: "int64",
    10: "bool",
    14: "bfloat16",
    17: "uint16",
    18: "complex128",
    19: "float16",
    20: "resource",
    21: "variant",
    22: "uint32",
    23: "uint64",
}

_UUID_NAMESPACE = uuid.UUID("6f0e4c1e-5a3b-4f57-9d1c-7c2a4f1b2e90")


@dataclass(frozen=True)
class TensorSpec:
    """One signature input or output: its name, dtype name, and shape (None: unknown rank)."""

    name: str
    dtype: str
    shape: tuple[int | None, ...] | None

    def describe(self) -> str:
        dims = "?" if self.shape is None else "[" + ", ".join("None" if d is None else str(d) for d in self.shape) + "]"
        return f"{self.name}: {self.dtype}{dims}"


@dataclass(frozen=True)
class Signature:
    """A ``SignatureDef``: inputs and outputs by name, in name order."""

    key: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    def input(self, name: str) -> TensorSpec | None:
        return next((s for s in self.inputs if s.name == name), None)

    def output(self, name: str) -> TensorSpec | None:
        return next((s for s in self.outputs if s.name == name), None)


@dataclass(frozen=True)
class MetaGraph:
    """One MetaGraph of a SavedModel: its tag set and signatures."""

    tags: frozenset[str]
    signatures: dict[str, Signature]


# ---- parsing saved_model.pb -------------------------------------------------------------------


_SAVED_MODEL = proto.Schema(
    "tfonspark.private.savedmodel",
    (
        proto.message(
            "TensorShape",
            proto.field("dim", 2, "TensorShape.Dim", repeated=True),
            proto.field("unknown_rank", 3, "bool"),
            nested=(proto.message("Dim", proto.field("size", 1, "int64")),),
        ),
        proto.message(
            "TensorInfo",
            proto.field("name", 1, "string"),
            proto.field("dtype", 2, "int32"),  # the DataType enum, same wire format
            proto.field("tensor_shape", 3, "TensorShape"),
        ),
        proto.message(
            "SignatureDef",
            proto.map_field("inputs", 1, "string", "TensorInfo"),
            proto.map_field("outputs", 2, "string", "TensorInfo"),
            proto.field("method_name", 3, "string"),
        ),
        proto.message("MetaInfoDef", proto.field("tags", 4, "string", repeated=True)),
        proto.message(
            "MetaGraphDef",
            proto.field("meta_info_def", 1, "MetaInfoDef"),
            proto.map_field("signature_def", 5, "string", "SignatureDef"),
        ),
        proto.message(
            "SavedModel",
            proto.field("saved_model_schema_version", 1, "int64"),
            proto.field("meta_graphs", 2, "MetaGraphDef", repeated=True),
        ),
    ),
)
"""The parts of ``SavedModel`` we read.

Field numbers follow tensorflow/core/protobuf/{saved_model,meta_graph}.proto and
tensorflow/core/framework/tensor_shape.proto; every other field is skipped as unknown.
"""


def _saved_model_class() -> Any:
    """The protobuf class of ``SavedModel`` (only the fields in :data:`_SAVED_MODEL`)."""
    return _SAVED_MODEL.message_class("SavedModel")


def _spec(name: str, info: Any) -> TensorSpec:
    """A TensorSpec from a ``TensorInfo`` message (``-1`` dimensions become None)."""
    dtype = DTYPES.get(info.dtype, f"DataType({info.dtype})")
    shape_msg = info.tensor_shape
    if shape_msg.unknown_rank or not info.HasField("tensor_shape"):
        return TensorSpec(name, dtype, None)
    return TensorSpec(name, dtype, tuple(None if d.size < 0 else int(d.size) for d in shape_msg.dim))


def parse_saved_model(data: bytes, path: str = SAVED_MODEL_FILE) -> list[MetaGraph]:
    """The MetaGraphs (tags and signatures) of a serialized ``SavedModel`` proto."""
    from google.protobuf.message import DecodeError

    try:
        saved_model = _saved_model_class().FromString(data)
    except DecodeError as err:
        raise DataFormatError(f"not a SavedModel protobuf ({err})", path=path) from err
    graphs = []
    for mg in saved_model.meta_graphs:
        signatures = {
            key: Signature(
                key,
                tuple(_spec(n, sd.inputs[n]) for n in sorted(sd.inputs)),
                tuple(_spec(n, sd.outputs[n]) for n in sorted(sd.outputs)),
            )
            for key, sd in mg.signature_def.items()
        }
        graphs.append(MetaGraph(frozenset(mg.meta_info_def.tags), signatures))
    if not graphs:
        raise DataFormatError("the SavedModel holds no MetaGraph", path=path)
    return graphs


# ---- locating and reading the files -----------------------------------------------------------


def resolve_export_dir(export_dir: str) -> str:
    """A location every executor reads the same way: URIs kept, local paths made absolute.

    Executors do not share the driver's working directory, so a relative path is resolved
    here, on the driver (:func:`tfonspark.fs.qualify` against the local file system).
    """
    return fs.qualify(export_dir)


def read_saved_model(export_dir: str) -> tuple[list[MetaGraph], str]:
    """The MetaGraphs of the SavedModel in ``export_dir`` and a digest of its content.

    The digest covers ``saved_model.pb`` and ``variables/variables.index`` (which holds a
    checksum of every variable), so it changes whenever the model is exported again with
    different weights.
    """
    data = fs.read_file(fs.join(export_dir, SAVED_MODEL_FILE))
    if data is None:
        raise ConfigError(
            f"export_dir holds no SavedModel ({SAVED_MODEL_FILE} not found); set "
            f"export_dir to a directory written by tf.saved_model.save or "
            f"tfonspark.TFNode.export_saved_model. Received: export_dir={export_dir!r}"
        )
    digest = hashlib.sha256(data)
    digest.update(fs.read_file(fs.join(export_dir, VARIABLES_INDEX)) or b"")
    return parse_saved_model(data, fs.join(export_dir, SAVED_MODEL_FILE)), digest.hexdigest()


def select_signature(graphs: list[MetaGraph], tag_set: str | None, key: str, export_dir: str = "") -> Signature:
    """The signature ``key`` of the MetaGraph with exactly the tags in ``tag_set``.

    ``tag_set`` is comma-separated; None picks the only MetaGraph (as ``tf.saved_model.load``
    does without ``tags``).
    """
    available = [",".join(sorted(g.tags)) for g in graphs]
    if tag_set is None:
        if len(graphs) != 1:
            raise ConfigError(
                f"the SavedModel in {export_dir!r} has {len(graphs)} MetaGraphs; pick "
                f"one with tag_set. Available tag sets: {available}"
            )
        graph = graphs[0]
    else:
        wanted = frozenset(t.strip() for t in tag_set.split(",") if t.strip())
        match = [g for g in graphs if g.tags == wanted]
        if not match:
            raise ConfigError(
                f"no MetaGraph with tag_set={tag_set!r} in the SavedModel in "
                f"{export_dir!r}. Available tag sets: {available}"
            )
        graph = match[0]
    if key not in graph.signatures:
        raise ConfigError(
            f"signature_def_key={key!r} is not a signature of the SavedModel in "
            f"{export_dir!r}. Available: {sorted(k for k in graph.signatures if not k.startswith('__'))}"
        )
    return graph.signatures[key]


def strip_port(name: str) -> str:
    """TFoS-style tensor names ``'x:0'`` name the signature input/output ``'x'``."""
    return name[:-2] if name.endswith(":0") else name


def model_key(export_dir: str, tag_set: str | None, signature_def_key: str, digest: str) -> str:
    """The driver-made id executors cache the loaded signature under (same content, same id)."""
    return str(uuid.uuid5(_UUID_NAMESPACE, "\0".join((export_dir, tag_set or "", signature_def_key, digest))))
