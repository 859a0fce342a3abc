"""Protobuf message classes declared in Python, so TensorFlow's protos parse without TensorFlow.

``tf.train.Example`` (TFRecord files) and ``SavedModel`` (``saved_model.pb``) are protobuf
messages. Importing TensorFlow for their classes costs seconds per process, so tfonspark
declares the fields it needs here (same numbers and types, hence the same wire format) and
builds the classes at runtime in a private descriptor pool, which cannot clash with
TensorFlow's own messages if both are loaded. Fields left out are skipped by the parser.

A schema is declared with :func:`message`, :func:`field` and :func:`map_field`::

    SCHEMA = Schema("my.pkg", (message("Pair", field("key", 1, "string"), field("value", 2, "int64")),))
    Pair = SCHEMA.message_class("Pair")

Each schema is built into its pool once per process (under 1 ms for the schemas here).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

__all__ = ["Field", "Message", "Schema", "field", "map_field", "message"]

#: Scalar type names a field may use; any other type name is a message of the same schema.
SCALARS = ("bool", "bytes", "double", "float", "int32", "int64", "string", "uint32", "uint64")


@dataclass(frozen=True)
class Field:
    """One field: name, number, scalar type name or message name (relative to the package)."""

    name: str
    number: int
    type: str
    repeated: bool = False
    oneof: str | None = None
    map_of: tuple[str, str] | None = None  # (key type, value type) of a ``map<K, V>`` field


@dataclass(frozen=True)
class Message:
    """One message type: its fields and the message types nested in it."""

    name: str
    fields: tuple[Field, ...]
    nested: tuple[Message, ...] = ()


def field(name: str, number: int, type: str, *, repeated: bool = False, oneof: str | None = None) -> Field:
    """A scalar or message field; ``oneof`` names the oneof group it belongs to."""
    return Field(name, number, type, repeated, oneof)


def map_field(name: str, number: int, key: str, value: str) -> Field:
    """A ``map<key, value>`` field (protobuf's repeated ``<Name>Entry`` message, made for you)."""
    return Field(name, number, _entry_name(name), repeated=True, map_of=(key, value))


def message(name: str, *fields: Field, nested: tuple[Message, ...] = ()) -> Message:
    """A message type with ``fields`` (and nested message types)."""
    return Message(name, tuple(fields), nested)


@dataclass(frozen=True)
class Schema:
    """A proto3 file's worth of message types under one package name."""

    package: str
    messages: tuple[Message, ...]
    _classes: dict[str, Any] = dataclasses.field(default_factory=dict, init=False, repr=False, compare=False)

    def message_class(self, name: str) -> Any:
        """The generated class of message ``name`` (``"Outer.Inner"`` for nested ones).

        Cheap after the first call (a dict lookup): parsers call it once per record.
        """
        cls = self._classes.get(name)
        if cls is None:
            from google.protobuf import message_factory

            descriptor = _pool(self).FindMessageTypeByName(f"{self.package}.{name}")
            cls = self._classes[name] = message_factory.GetMessageClass(descriptor)
        return cls


@functools.cache
def _pool(schema: Schema) -> Any:
    """A private descriptor pool holding ``schema`` (built once per schema and process)."""
    from google.protobuf import descriptor_pb2, descriptor_pool

    fdp = descriptor_pb2.FileDescriptorProto(
        name=schema.package.replace(".", "_") + ".proto", package=schema.package, syntax="proto3"
    )
    for msg in schema.messages:
        _add_message(fdp.message_type.add(), msg, schema.package)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return pool


def _add_message(proto: Any, msg: Message, package: str, scope: str = "") -> None:
    """Fill a ``DescriptorProto`` from ``msg``: fields, oneofs, nested types and map entries.

    ``scope`` is the dotted name of the message ``msg`` is nested in ("" at the top level).
    """
    from google.protobuf import descriptor_pb2

    proto.name = msg.name
    path = f"{scope}.{msg.name}" if scope else msg.name
    oneofs: list[str] = []
    for fld in msg.fields:
        if fld.oneof is not None and fld.oneof not in oneofs:
            oneofs.append(fld.oneof)
            proto.oneof_decl.add(name=fld.oneof)
        type_name = f"{path}.{fld.type}" if fld.map_of is not None else fld.type
        _add_field(proto.field.add(), fld, f".{package}.{type_name}", oneofs)
        if fld.map_of is not None:
            entry = message(fld.type, field("key", 1, fld.map_of[0]), field("value", 2, fld.map_of[1]))
            _add_message(proto.nested_type.add(), entry, package, path)
            proto.nested_type[-1].options.CopyFrom(descriptor_pb2.MessageOptions(map_entry=True))
    for inner in msg.nested:
        _add_message(proto.nested_type.add(), inner, package, path)


def _add_field(proto: Any, fld: Field, type_name: str, oneofs: list[str]) -> None:
    """Fill a ``FieldDescriptorProto`` from ``fld`` (``type_name``: full name if a message)."""
    from google.protobuf import descriptor_pb2

    kinds = descriptor_pb2.FieldDescriptorProto
    proto.name = fld.name
    proto.number = fld.number
    proto.label = kinds.LABEL_REPEATED if fld.repeated else kinds.LABEL_OPTIONAL
    if fld.type in SCALARS:
        proto.type = getattr(kinds, f"TYPE_{fld.type.upper()}")
    else:
        proto.type = kinds.TYPE_MESSAGE
        proto.type_name = type_name
    if fld.oneof is not None:
        proto.oneof_index = oneofs.index(fld.oneof)


def _entry_name(name: str) -> str:
    """protoc's name for a map field's entry type: ``signature_def`` -> ``SignatureDefEntry``."""
    return "".join(part[:1].upper() + part[1:] for part in name.split("_")) + "Entry"
