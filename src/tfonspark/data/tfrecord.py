"""TFRecord files <-> Spark DataFrames, in Python only (no tensorflow-hadoop jar, no TF import).

**File format.** A TFRecord file is a sequence of records, each framed as
``uint64 length (LE) | uint32 masked CRC-32C of length | data | uint32 masked CRC-32C of data``.
Both CRCs are checked on read; a bad or truncated record raises :class:`DataFormatError` naming
the file and the byte offset where the record starts. Each record holds a serialized
``tf.train.Example``; it is built and parsed with a private copy of the Example protobuf schema,
so neither driver nor executors import TensorFlow (several seconds per Python worker).

**Writing** (:func:`save_tfrecords`): one file per DataFrame partition, named ``part-r-00000``
like Hadoop, plus an empty ``_SUCCESS`` marker. Tasks write under ``_temporary/<job>/`` and the
driver moves the files into place only when every task has succeeded, so a failed save leaves no
partial output. Column types map to ``tf.train.Feature`` lists like this:

======================================================  ================================
Spark column type                                        Feature
======================================================  ================================
boolean, tinyint, smallint, int, bigint (and arrays)     ``int64_list``
float, double (and arrays)                               ``float_list`` (float32: doubles
                                                         lose precision, as in TF itself)
string (UTF-8) and binary (and arrays)                   ``bytes_list``
======================================================  ================================

A scalar is a one-value list; a null value leaves the feature out of that row's Example; an
empty array is an empty list. Other types (decimal, date, timestamp, map, struct, nested arrays)
and null elements inside arrays raise :class:`InputError`.

**Reading** (:func:`load_tfrecords`): files starting with ``_`` or ``.`` are skipped; each file
is read whole by one task (TFRecord files cannot be split). Unless ``schema=`` is given, the
schema is inferred from every record (or the first ``infer_records`` of each file) by a Spark job:

- one column per feature name, sorted by name, all nullable; a feature absent from a record is
  null in that row;
- a feature that has exactly one value in every record that holds it is a scalar column; any
  other length (0, or more than 1) in any record makes it an array column;
- ``int64_list`` -> bigint; ``float_list`` -> double; both kinds for one feature -> double;
- ``bytes_list`` -> string, unless the feature is named in ``binary_features`` or any inferred
  value is not valid UTF-8, then binary;
- a feature holding only empty lists with no kind set -> array<string>;
- ``bytes_list`` in some records and a numeric list in others raises :class:`DataFormatError`.

With an explicit ``schema`` any of bigint/int/smallint/tinyint/boolean, double/float, string and
binary (and arrays of them) may be used; features not in the schema are ignored.
"""

from __future__ import annotations

import fnmatch
import functools
import io
import logging
import os
import pickle
import posixpath
import struct
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as T

from ..errors import ConfigError, DataFormatError, InputError, TFoSError

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "crc32c",
    "infer_schema",
    "isLoadedDF",
    "is_loaded_df",
    "loadTFRecords",
    "load_tfrecords",
    "loaded_dfs",
    "loaded_from",
    "masked_crc32c",
    "read_tfrecord_file",
    "saveAsTFRecords",
    "save_tfrecords",
    "write_tfrecord_file",
]

_log = logging.getLogger(__name__)

loaded_dfs: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
"""DataFrames returned by :func:`load_tfrecords` -> the resolved directory they were read from.

Entries disappear when their DataFrame is garbage collected (TFoS kept them forever).
"""

# ---------------------------------------------------------------------------------------------
# CRC-32C
# ---------------------------------------------------------------------------------------------

_CRC_POLY = 0x82F63B78  # CRC-32C (Castagnoli), bit-reflected
_MASK_DELTA = 0xA282EAD8
_NUMPY_MIN_BYTES = 256 * 1024  # below this the table loop beats numpy's per-call overhead
_NUMPY_LANE = 512


def crc32c(data: bytes) -> int:
    """CRC-32C of ``data``, the checksum of TFRecord framing (hardware-accelerated if available)."""
    return _crc_backend()(bytes(data))


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC-32C: the CRC rotated right by 15 bits plus a constant.

    Masking keeps the CRC of data that itself contains CRCs from being trivially zero.
    """
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


@functools.cache
def _crc_backend() -> Callable[[bytes], int]:
    """``google_crc32c`` when its C extension loads (GB/s); otherwise our slower fallback."""
    try:
        import google_crc32c

        if getattr(google_crc32c, "implementation", "c") == "c":
            return google_crc32c.value  # type: ignore[no-any-return]
    except ImportError:
        pass
    _log.warning(
        "google-crc32c (with its C extension) is not installed: TFRecord CRCs use a pure "
        "Python/numpy fallback (10-150 MB/s). `pip install google-crc32c` for GB/s."
    )
    return _crc32c_fallback


@functools.cache
def _crc_table() -> tuple[int, ...]:
    """The 256-entry table of the byte-at-a-time reflected CRC-32C."""
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ _CRC_POLY if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


def _crc32c_fallback(data: bytes) -> int:
    """CRC-32C without the C library: numpy lanes for big buffers, a table loop for small."""
    if len(data) >= _NUMPY_MIN_BYTES:
        return _crc32c_numpy(data)
    return _crc32c_table(data)


def _crc32c_table(data: bytes) -> int:
    """Byte-at-a-time CRC-32C (about 10 MB/s)."""
    table = _crc_table()
    crc = 0xFFFFFFFF
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _crc32c_numpy(data: bytes, lane: int = _NUMPY_LANE) -> int:
    """CRC-32C of a big buffer, vectorized across lanes (100-170 MB/s).

    The CRC register update is linear over GF(2), so: invert the first 4 bytes (same as starting
    the register at 0xFFFFFFFF), pad zeros in front (no effect on a register that starts at 0),
    cut into ``k`` equal lanes, run all lanes at once, then fold neighbours pairwise: the left
    CRC is shifted over the right lane's length by a 32x32 bit matrix and XORed into the right.
    """
    import numpy as np

    size = len(data)
    if size < 4:
        return _crc32c_table(data)
    lanes = 1
    while lanes * lane < size:
        lanes *= 2
    buf = np.zeros(lanes * lane, dtype=np.uint8)
    start = lanes * lane - size
    buf[start:] = np.frombuffer(data, dtype=np.uint8)
    buf[start : start + 4] ^= 0xFF
    table = np.array(_crc_table(), dtype=np.uint32)
    rows = buf.reshape(lanes, lane)
    regs = np.zeros(lanes, dtype=np.uint32)
    eight = np.uint32(8)
    for j in range(lane):
        regs = table[(regs ^ rows[:, j]) & 0xFF] ^ (regs >> eight)
    shift = _zero_shift_matrix(lane)
    while len(regs) > 1:
        regs = _gf2_apply(shift, regs[0::2]) ^ regs[1::2]
        shift = _gf2_apply(shift, shift)  # shifting over twice the length
    return int(regs[0]) ^ 0xFFFFFFFF


@functools.cache
def _zero_shift_matrix_cached(nbytes: int) -> tuple[int, ...]:
    """Columns of the matrix that advances a CRC register over ``nbytes`` zero bytes."""
    table = _crc_table()
    columns = []
    for bit in range(32):
        reg = 1 << bit
        for _ in range(nbytes):
            reg = table[reg & 0xFF] ^ (reg >> 8)
        columns.append(reg)
    return tuple(columns)


def _zero_shift_matrix(nbytes: int) -> Any:
    """:func:`_zero_shift_matrix_cached` as a numpy uint32 vector of columns."""
    import numpy as np

    return np.array(_zero_shift_matrix_cached(nbytes), dtype=np.uint32)


def _gf2_apply(columns: Any, regs: Any) -> Any:
    """Multiply each uint32 in ``regs`` by the GF(2) matrix given by its 32 ``columns``."""
    import numpy as np

    out = np.zeros_like(regs)
    one = np.uint32(1)
    for bit in range(32):
        out ^= ((regs >> np.uint32(bit)) & one) * columns[bit]
    return out


# ---------------------------------------------------------------------------------------------
# Record framing
# ---------------------------------------------------------------------------------------------

_LENGTH = struct.Struct("<Q")
_HEADER = struct.Struct("<QI")
_U32 = struct.Struct("<I")
_IO_BUFFER = 1 << 20


def _write_records(stream: Any, records: Iterable[bytes]) -> int:
    """Frame and write each record to a binary ``stream``; return how many were written."""
    count = 0
    for data in records:
        length = _LENGTH.pack(len(data))
        stream.write(length + _U32.pack(masked_crc32c(length)))
        stream.write(data)
        stream.write(_U32.pack(masked_crc32c(data)))
        count += 1
    return count


def _read_records(stream: Any, path: str) -> Iterator[tuple[int, bytes]]:
    """Yield ``(byte offset, data)`` per record of a binary ``stream``, checking both CRCs."""
    offset = 0
    while True:
        header = stream.read(_HEADER.size)
        if not header:
            return
        if len(header) < _HEADER.size:
            raise DataFormatError(
                f"truncated TFRecord header ({len(header)} of {_HEADER.size} bytes)",
                path=path,
                offset=offset,
            )
        length, length_crc = _HEADER.unpack(header)
        if masked_crc32c(header[:8]) != length_crc:
            raise DataFormatError(
                "corrupt TFRecord length (CRC mismatch; not a TFRecord file?)",
                path=path,
                offset=offset,
            )
        data = stream.read(length)
        footer = stream.read(_U32.size)
        if len(data) < length or len(footer) < _U32.size:
            raise DataFormatError(
                f"truncated TFRecord (header says {length} data bytes plus a 4-byte CRC, "
                f"file holds {len(data) + len(footer)})",
                path=path,
                offset=offset,
            )
        if masked_crc32c(data) != _U32.unpack(footer)[0]:
            raise DataFormatError("corrupt TFRecord data (CRC mismatch)", path=path, offset=offset)
        yield offset, data
        offset += _HEADER.size + length + _U32.size


def write_tfrecord_file(path: str, records: Iterable[bytes]) -> int:
    """Write ``records`` (bytes) as one TFRecord file at a local path or URI; return the count."""
    uri = _qualify(path)
    fs, fs_path = _filesystem(uri)
    fs.create_dir(posixpath.dirname(fs_path), recursive=True)
    with _open_write(fs, fs_path) as out:
        return _write_records(out, records)


def read_tfrecord_file(path: str) -> Iterator[bytes]:
    """Yield the records of one TFRecord file (local path or URI), checking CRCs."""
    for _, data in _iter_file_records(_qualify(path)):
        yield data


def _iter_file_records(uri: str) -> Iterator[tuple[int, bytes]]:
    """``(offset, data)`` per record of the file at a resolved ``uri``."""
    fs, fs_path = _filesystem(uri)
    with _open_read(fs, fs_path) as stream:
        yield from _read_records(stream, uri)


def _open_read(fs: Any, fs_path: str) -> io.BufferedReader:
    """A buffered binary reader; Python-side buffering makes the many small reads cheap."""
    return io.BufferedReader(fs.open_input_stream(fs_path, compression=None), _IO_BUFFER)


def _open_write(fs: Any, fs_path: str) -> io.BufferedWriter:
    """A buffered binary writer (see :func:`_open_read`)."""
    return io.BufferedWriter(fs.open_output_stream(fs_path, compression=None), _IO_BUFFER)


# ---------------------------------------------------------------------------------------------
# tf.train.Example without TensorFlow
# ---------------------------------------------------------------------------------------------

_BYTES, _FLOAT, _INT64 = "bytes_list", "float_list", "int64_list"


@functools.cache
def _example_class() -> Any:
    """A protobuf class wire-compatible with ``tf.train.Example``, in a private descriptor pool.

    Built at runtime (40 ms) so that no process needs ``import tensorflow``; the private pool
    cannot clash with TensorFlow's own ``tensorflow.Example`` if both are loaded.
    """
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    package = "tfonspark.private.example"
    fdp = descriptor_pb2.FileDescriptorProto(name="tfonspark_private_example.proto", package=package, syntax="proto3")
    fdesc = descriptor_pb2.FieldDescriptorProto
    for name, scalar in (
        ("BytesList", fdesc.TYPE_BYTES),
        ("FloatList", fdesc.TYPE_FLOAT),
        ("Int64List", fdesc.TYPE_INT64),
    ):
        fdp.message_type.add(name=name).field.add(name="value", number=1, label=fdesc.LABEL_REPEATED, type=scalar)
    feature = fdp.message_type.add(name="Feature")
    feature.oneof_decl.add(name="kind")
    for number, (name, type_name) in enumerate(
        ((_BYTES, "BytesList"), (_FLOAT, "FloatList"), (_INT64, "Int64List")), start=1
    ):
        feature.field.add(
            name=name,
            number=number,
            label=fdesc.LABEL_OPTIONAL,
            type=fdesc.TYPE_MESSAGE,
            type_name=f".{package}.{type_name}",
            oneof_index=0,
        )
    features = fdp.message_type.add(name="Features")
    entry = features.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, label=fdesc.LABEL_OPTIONAL, type=fdesc.TYPE_STRING)
    entry.field.add(
        name="value", number=2, label=fdesc.LABEL_OPTIONAL, type=fdesc.TYPE_MESSAGE, type_name=f".{package}.Feature"
    )
    features.field.add(
        name="feature",
        number=1,
        label=fdesc.LABEL_REPEATED,
        type=fdesc.TYPE_MESSAGE,
        type_name=f".{package}.Features.FeatureEntry",
    )
    fdp.message_type.add(name="Example").field.add(
        name="features",
        number=1,
        label=fdesc.LABEL_OPTIONAL,
        type=fdesc.TYPE_MESSAGE,
        type_name=f".{package}.Features",
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.Example"))


def _parse_features(data: bytes, path: str, offset: int | None) -> Any:
    """The ``features.feature`` map of a serialized Example, or a DataFormatError."""
    from google.protobuf.message import DecodeError

    try:
        return _example_class().FromString(data).features.feature
    except DecodeError as err:
        raise DataFormatError(
            f"TFRecord record is not a serialized tf.train.Example ({err})",
            path=path,
            offset=offset,
        ) from err


# ---------------------------------------------------------------------------------------------
# Encoding DataFrame rows (as Arrow batches) into Examples
# ---------------------------------------------------------------------------------------------

_INT_TYPES = (T.BooleanType, T.ByteType, T.ShortType, T.IntegerType, T.LongType)
_FLOAT_TYPES = (T.FloatType, T.DoubleType)
_SUPPORTED = "boolean, tinyint, smallint, int, bigint, float, double, string, binary and arrays of them"


@dataclass(frozen=True)
class _WriteColumn:
    """How one DataFrame column becomes a feature: list kind, array or not, Arrow cast first."""

    name: str
    kind: str
    is_list: bool
    cast: str | None  # "int64" / "binary": normalize before to_pylist (bools, str -> bytes)


def _plan_write(schema: T.StructType) -> tuple[_WriteColumn, ...]:
    """Map every column of ``schema`` to a feature kind, refusing types Example cannot hold."""
    plan = []
    for fld in schema.fields:
        dtype = fld.dataType
        is_list = isinstance(dtype, T.ArrayType)
        leaf = dtype.elementType if isinstance(dtype, T.ArrayType) else dtype
        if isinstance(leaf, _INT_TYPES):
            kind, cast = _INT64, "int64"
        elif isinstance(leaf, _FLOAT_TYPES):
            kind, cast = _FLOAT, None
        elif isinstance(leaf, T.StringType):
            kind, cast = _BYTES, "binary"
        elif isinstance(leaf, T.BinaryType):
            kind, cast = _BYTES, None
        else:
            raise InputError(
                f"column type {dtype.simpleString()} cannot be stored in a tf.train.Example; "
                f"supported: {_SUPPORTED}. Cast or drop the column first",
                column=fld.name,
            )
        plan.append(_WriteColumn(fld.name, kind, is_list, cast))
    return tuple(plan)


def _cast_for_write(array: pa.Array, cast: str | None) -> pa.Array:
    """Cast ints/bools to int64 and strings to binary (keeping list/large-list shape)."""
    if cast is None:
        return array
    typ = array.type
    is_list = pa.types.is_list(typ) or pa.types.is_large_list(typ)
    value_type = typ.value_type if is_list else typ
    if cast == "int64":
        leaf = pa.int64()
    else:
        leaf = pa.large_binary() if pa.types.is_large_string(value_type) else pa.binary()
    if not is_list:
        return array.cast(leaf)
    return array.cast(pa.large_list(leaf) if pa.types.is_large_list(typ) else pa.list_(leaf))


def _check_no_null_elements(array: pa.Array, column: str, partition: int | None, first_row: int) -> None:
    """Refuse arrays with null elements: Example lists cannot represent them."""
    flat = pc.list_flatten(array)
    if flat.null_count == 0:
        return
    parents = pc.filter(pc.list_parent_indices(array), pc.is_null(flat))
    raise InputError(
        "array holds a null element; tf.train.Example lists cannot hold nulls (drop or fill them first)",
        column=column,
        partition=partition,
        row=first_row + int(parents[0].as_py()),
    )


def _encode_batch(
    batch: pa.RecordBatch,
    plan: Sequence[_WriteColumn],
    *,
    partition: int | None = None,
    first_row: int = 0,
) -> list[bytes]:
    """Serialize each row of ``batch`` (columns in ``plan`` order) as a tf.train.Example."""
    columns = []
    for index, col in enumerate(plan):
        array = batch.column(index)
        if col.is_list:
            _check_no_null_elements(array, col.name, partition, first_row)
        values = _cast_for_write(array, col.cast).to_pylist()
        columns.append((col.name, col.kind, col.is_list, values))
    return list(_encode_rows(columns, batch.num_rows))


def _encode_rows(columns: list[tuple[str, str, bool, list[Any]]], num_rows: int) -> Iterator[bytes]:
    """The row loop of :func:`_encode_batch`: nulls are skipped, empty lists keep their kind."""
    example_class = _example_class()
    for row in range(num_rows):
        example = example_class()
        fmap = example.features.feature
        for name, kind, is_list, values in columns:
            value = values[row]
            if value is None:
                continue
            target = getattr(fmap[name], kind)
            if not is_list:
                target.value.append(value)
            elif value:
                target.value.extend(value)
            else:
                target.SetInParent()
        yield example.SerializeToString()


# ---------------------------------------------------------------------------------------------
# Schema inference
# ---------------------------------------------------------------------------------------------


@dataclass
class _FeatureStats:
    """What the records seen so far say about one feature (merged across files on the driver)."""

    kinds: dict[str, tuple[str, int | None]] = field(default_factory=dict)  # kind -> first seen
    scalar: bool = True  # exactly one value wherever present
    utf8: bool = True  # every bytes value decodes as UTF-8

    def merge(self, other: _FeatureStats) -> None:
        """Fold ``other`` (from later files) into this one."""
        for kind, where in other.kinds.items():
            self.kinds.setdefault(kind, where)
        self.scalar = self.scalar and other.scalar
        self.utf8 = self.utf8 and other.utf8


def _summarize_record(
    stats: dict[str, _FeatureStats],
    data: bytes,
    binary: frozenset[str],
    path: str,
    offset: int | None,
) -> None:
    """Update ``stats`` with one serialized Example."""
    for name, feature in _parse_features(data, path, offset).items():
        st = stats.get(name)
        if st is None:
            st = stats[name] = _FeatureStats()
        kind = feature.WhichOneof("kind")
        values = getattr(feature, kind).value if kind else ()
        if kind and kind not in st.kinds:
            st.kinds[kind] = (path, offset)
        if len(values) != 1:
            st.scalar = False
        if kind == _BYTES and st.utf8 and name not in binary:
            st.utf8 = all(_is_utf8(v) for v in values)


def _is_utf8(value: bytes) -> bool:
    """Whether ``value`` decodes as UTF-8."""
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _schema_from_stats(stats: dict[str, _FeatureStats], binary: frozenset[str]) -> T.StructType:
    """The DataFrame schema the inference rules (module docstring) give for ``stats``."""
    fields = []
    for name in sorted(stats):
        st = stats[name]
        numeric = [k for k in (_INT64, _FLOAT) if k in st.kinds]
        if _BYTES in st.kinds and numeric:
            path, offset = st.kinds[numeric[0]]
            raise DataFormatError(
                f"feature {name!r} is a bytes_list in some records and a {numeric[0]} in "
                "others; load it with an explicit schema or fix the data",
                path=path,
                offset=offset,
            )
        leaf: T.DataType
        if name in binary:
            if numeric:
                raise ConfigError(
                    f"binary_features names {name!r}, but that feature holds a {numeric[0]}. "
                    f"Received: binary_features={sorted(binary)}"
                )
            leaf = T.BinaryType()
        elif _FLOAT in st.kinds:
            leaf = T.DoubleType()
        elif _INT64 in st.kinds:
            leaf = T.LongType()
        else:
            leaf = T.StringType() if st.utf8 else T.BinaryType()
        fields.append(T.StructField(name, leaf if st.scalar else T.ArrayType(leaf, True), True))
    return T.StructType(fields)


def infer_schema(records: Iterable[bytes], binary_features: Sequence[str] = ()) -> T.StructType:
    """The DataFrame schema for serialized Examples, by the rules in this module's docstring."""
    binary = _binary_set(binary_features)
    stats: dict[str, _FeatureStats] = {}
    for index, data in enumerate(records):
        _summarize_record(stats, data, binary, f"record {index}", None)
    return _schema_from_stats(stats, binary)


def _binary_set(binary_features: Sequence[str] | str | None) -> frozenset[str]:
    """``binary_features`` as a set, accepting one name as a plain string."""
    if binary_features is None:
        return frozenset()
    if isinstance(binary_features, str):
        return frozenset([binary_features])
    return frozenset(binary_features)


def _summarize_files(
    uris: Iterable[str], *, binary: frozenset[str], limit: int | None
) -> Iterator[dict[str, _FeatureStats] | TFoSError]:
    """Executor side of inference: stats over (the first ``limit`` records of) each file.

    A data error is returned, not raised, so that Spark does not retry the task and the driver
    re-raises the original :class:`DataFormatError`.
    """
    stats: dict[str, _FeatureStats] = {}
    try:
        for uri in uris:
            for count, (offset, data) in enumerate(_iter_file_records(uri)):
                if limit is not None and count >= limit:
                    break
                _summarize_record(stats, data, binary, uri, offset)
    except TFoSError as err:
        yield err
        return
    yield stats


# ---------------------------------------------------------------------------------------------
# Decoding Examples into Arrow batches of a given schema
# ---------------------------------------------------------------------------------------------

_BATCH_ROWS = 4096
_BATCH_BYTES = 32 << 20


@dataclass(frozen=True)
class _ReadColumn:
    """How one feature becomes a column: accepted kinds, array or not, Arrow types."""

    name: str
    type_name: str
    kinds: frozenset[str]
    is_list: bool
    build: pa.DataType  # type the Python values are first put into
    arrow: pa.DataType  # type Spark expects


def _leaf_read_types(leaf: T.DataType) -> tuple[frozenset[str], pa.DataType, pa.DataType] | None:
    """(accepted kinds, build type, final Arrow type) for a scalar Spark type, or None."""
    ints = {
        T.LongType: pa.int64(),
        T.IntegerType: pa.int32(),
        T.ShortType: pa.int16(),
        T.ByteType: pa.int8(),
        T.BooleanType: pa.bool_(),
    }
    for spark_type, arrow in ints.items():
        if isinstance(leaf, spark_type):
            return frozenset([_INT64]), pa.int64(), arrow
    if isinstance(leaf, _FLOAT_TYPES):
        arrow = pa.float64() if isinstance(leaf, T.DoubleType) else pa.float32()
        return frozenset([_FLOAT, _INT64]), pa.float64(), arrow
    if isinstance(leaf, T.StringType):
        return frozenset([_BYTES]), pa.binary(), pa.string()
    if isinstance(leaf, T.BinaryType):
        return frozenset([_BYTES]), pa.binary(), pa.binary()
    return None


def _plan_read(schema: T.StructType) -> tuple[_ReadColumn, ...]:
    """Validate a load schema and say how to fill each of its columns."""
    plan = []
    for fld in schema.fields:
        dtype = fld.dataType
        is_list = isinstance(dtype, T.ArrayType)
        leaf = dtype.elementType if isinstance(dtype, T.ArrayType) else dtype
        types = _leaf_read_types(leaf)
        if types is None:
            raise ConfigError(
                f"schema column {fld.name!r} has type {dtype.simpleString()}, which TFRecords "
                f"cannot fill; supported: {_SUPPORTED}"
            )
        kinds, build, arrow = types
        if is_list:
            build, arrow = pa.list_(build), pa.list_(arrow)
        plan.append(_ReadColumn(fld.name, dtype.simpleString(), kinds, is_list, build, arrow))
    return tuple(plan)


def _feature_value(fmap: Any, col: _ReadColumn, path: str, offset: int) -> Any:
    """The Python value of ``col`` in one Example's feature map (None when absent)."""
    if col.name not in fmap:  # test first: indexing a missing key would insert it
        return None
    feature = fmap[col.name]
    kind = feature.WhichOneof("kind")
    if kind is None:
        values: Any = ()
    elif kind in col.kinds:
        values = getattr(feature, kind).value
        if kind == _INT64 and _FLOAT in col.kinds:  # int64 into a float column: may exceed 2**53
            values = [float(v) for v in values]
    else:
        raise DataFormatError(
            f"feature {col.name!r} is a {kind}, but its column type is {col.type_name}",
            path=path,
            offset=offset,
        )
    if col.is_list:
        return list(values)
    if len(values) == 1:
        return values[0]
    if not values:
        return None
    raise DataFormatError(
        f"feature {col.name!r} holds {len(values)} values, but its column type is the scalar "
        f"{col.type_name} (inferred from too few records? use an array type in schema=)",
        path=path,
        offset=offset,
    )


def _to_arrow(values: list[Any], col: _ReadColumn, path: str, offsets: list[int]) -> pa.Array:
    """One column of a batch as Arrow; a value that does not fit names its record's offset."""
    try:
        array = pa.array(values, type=col.build)
        return array if array.type == col.arrow else array.cast(col.arrow)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as err:
        bad = _first_unconvertible(values, col)
        hint = " (list it in binary_features)" if "UTF8" in str(err) else ""
        raise DataFormatError(
            f"feature {col.name!r} does not fit column type {col.type_name}: {err}{hint}",
            path=path,
            offset=offsets[bad],
        ) from err


def _first_unconvertible(values: list[Any], col: _ReadColumn) -> int:
    """Index of the first value Arrow cannot convert to the column's type (error path only)."""
    for index, value in enumerate(values):
        try:
            pa.array([value], type=col.build).cast(col.arrow)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            return index
    return 0


def _decode_batch(records: Sequence[tuple[int, bytes]], plan: Sequence[_ReadColumn], path: str) -> pa.RecordBatch:
    """Parse ``(offset, data)`` records into one Arrow batch with the columns of ``plan``."""
    columns: list[list[Any]] = [[] for _ in plan]
    for offset, data in records:
        fmap = _parse_features(data, path, offset)
        for col, out in zip(plan, columns, strict=True):
            out.append(_feature_value(fmap, col, path, offset))
    offsets = [offset for offset, _ in records]
    arrays = [_to_arrow(values, col, path, offsets) for values, col in zip(columns, plan, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, schema=_arrow_schema(plan))


def _arrow_schema(plan: Sequence[_ReadColumn]) -> pa.Schema:
    """The Arrow schema of batches decoded with ``plan``."""
    return pa.schema([pa.field(col.name, col.arrow, nullable=True) for col in plan])


def _read_file_batches(
    uri: str,
    plan: Sequence[_ReadColumn],
    *,
    max_rows: int = _BATCH_ROWS,
    max_bytes: int = _BATCH_BYTES,
) -> Iterator[pa.RecordBatch]:
    """Arrow batches of at most ``max_rows`` rows (or about ``max_bytes``) from one file."""
    pending: list[tuple[int, bytes]] = []
    size = 0
    for offset, data in _iter_file_records(uri):
        pending.append((offset, data))
        size += len(data)
        if len(pending) >= max_rows or size >= max_bytes:
            yield _decode_batch(pending, plan, uri)
            pending, size = [], 0
    if pending:
        yield _decode_batch(pending, plan, uri)


def _read_task(
    batches: Iterable[pa.RecordBatch], *, files: tuple[str, ...], schema: T.StructType
) -> Iterator[pa.RecordBatch]:
    """Executor side of loading: the input holds file indexes, the output the files' rows."""
    plan = _plan_read(schema)
    for batch in batches:
        for index in batch.column(0).to_pylist():
            yield from _read_file_batches(files[index], plan)


# ---------------------------------------------------------------------------------------------
# Paths and file systems
# ---------------------------------------------------------------------------------------------

_SCHEMES = (
    "local paths, file://, and what pyarrow.fs supports: hdfs:// and viewfs:// (needs libhdfs "
    "and a JVM), s3:// (also s3a://, s3n://), gs://, abfs://"
)


def _qualify(path: str, *, default_fs: str = "file:///", cwd: str = "", user: str = "") -> str:
    """Resolve ``path`` like Hadoop: a URI stays, a bare path lands on ``fs.defaultFS``.

    On a local default FS a bare path becomes absolute (resolved on the driver, whose working
    directory executors do not share); on e.g. HDFS a relative path is under ``/user/<user>``.
    """
    if not path:
        raise ConfigError("path is empty; expected a directory path or URI")
    if len(urlsplit(path).scheme) > 1:  # one letter is a Windows drive
        stripped = path.rstrip("/")
        return stripped if urlsplit(stripped).path else path
    if len(urlsplit(default_fs).scheme) <= 1 or urlsplit(default_fs).scheme == "file":
        return os.path.normpath(os.path.join(cwd or os.getcwd(), path))
    base = default_fs.rstrip("/")
    if path.startswith("/"):
        return base + posixpath.normpath(path)
    return f"{base}/user/{user}/{posixpath.normpath(path)}"


def _resolve(sc: Any, path: str) -> str:
    """:func:`_qualify` with the Hadoop default FS and user of a live SparkContext."""
    try:
        default_fs = sc._jsc.hadoopConfiguration().get("fs.defaultFS") or "file:///"
        user = sc.sparkUser()
    except AttributeError:  # no JVM gateway (e.g. Spark Connect): assume local paths
        default_fs, user = "file:///", ""
    return _qualify(path, default_fs=default_fs, user=user)


def _filesystem(uri: str) -> tuple[Any, str]:
    """A ``pyarrow.fs`` file system and the path inside it for a resolved ``uri``."""
    import pyarrow.fs as pafs

    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if len(scheme) <= 1:
        return pafs.LocalFileSystem(), os.path.abspath(uri)
    if scheme == "file":
        return pafs.LocalFileSystem(), unquote(parts.path) or "/"
    if scheme in ("s3a", "s3n"):
        uri = "s3" + uri[len(scheme) :]
    try:
        fs, fs_path = pafs.FileSystem.from_uri(uri)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
        raise ConfigError(f"unsupported file system for {uri!r} ({err}); supported: {_SCHEMES}") from err
    except OSError as err:
        raise ConfigError(
            f"cannot open the file system of {uri!r}: {err}. Supported: {_SCHEMES}; check the "
            "client setup (HADOOP_HOME/ARROW_LIBHDFS_DIR for HDFS, credentials for object stores)"
        ) from err
    return fs, fs_path


def _join(uri: str, name: str) -> str:
    """``uri`` + ``/`` + ``name`` (works for local paths and URIs alike)."""
    return uri.rstrip("/") + "/" + name


def _is_data_file(name: str) -> bool:
    """Hadoop's rule: files starting with ``_`` (``_SUCCESS``) or ``.`` are not data."""
    return not name.startswith(("_", "."))


def _list_record_files(uri: str) -> list[str]:
    """The data files of a directory, a single file, or a glob in the last path component."""
    import pyarrow.fs as pafs

    fs, fs_path = _filesystem(uri)
    pattern = None
    base = posixpath.basename(fs_path.rstrip("/"))
    if any(ch in base for ch in "*?["):
        pattern = base
        fs_path = posixpath.dirname(fs_path.rstrip("/"))
        uri = uri.rstrip("/")[: -len(base)].rstrip("/")
    info = fs.get_file_info(fs_path)
    if info.type == pafs.FileType.File and pattern is None:
        return [uri]
    if info.type != pafs.FileType.Directory:
        raise ConfigError(f"input path {uri!r} does not exist (or is not a directory)")
    entries = fs.get_file_info(pafs.FileSelector(fs_path, recursive=False))
    names = sorted(
        e.base_name
        for e in entries
        if e.type == pafs.FileType.File
        and _is_data_file(e.base_name)
        and (pattern is None or fnmatch.fnmatchcase(e.base_name, pattern))
    )
    if not names:
        what = f"matching {pattern!r} " if pattern else ""
        raise ConfigError(f"no TFRecord files {what}in {uri!r} (names starting with '_' or '.' are skipped)")
    return [_join(uri, name) for name in names]


# ---------------------------------------------------------------------------------------------
# Saving a DataFrame
# ---------------------------------------------------------------------------------------------

_TEMP_DIR = "_temporary"
_WRITE_RESULT = "partition int, records long, name string, error binary"


def _part_name(partition: int) -> str:
    """Hadoop's output file name for a partition: ``part-r-00042``."""
    return f"part-r-{partition:05d}"


def _write_task(
    batches: Iterable[pa.RecordBatch], *, uri: str, job: str, plan: tuple[_WriteColumn, ...]
) -> Iterator[pa.RecordBatch]:
    """Executor side of saving: write this partition to ``_temporary/<job>/part-r-NNNNN``.

    A data error (:class:`InputError`) is returned pickled, not raised, so Spark does not retry
    a task that would fail again and the driver can re-raise the original error.
    """
    from pyspark import TaskContext

    ctx = TaskContext.get()
    partition = ctx.partitionId() if ctx is not None else 0
    attempt = ctx.attemptNumber() if ctx is not None else 0
    name = _part_name(partition)
    fs, root = _filesystem(uri)
    job_dir = posixpath.join(root, _TEMP_DIR, job)
    tmp = posixpath.join(job_dir, f".{name}.attempt{attempt}.{uuid.uuid4().hex[:8]}")
    records, error = 0, None
    try:
        fs.create_dir(job_dir, recursive=True)
        with _open_write(fs, tmp) as out:
            for batch in batches:
                encoded = _encode_batch(batch, plan, partition=partition, first_row=records)
                records += _write_records(out, encoded)
        fs.move(tmp, posixpath.join(job_dir, name))
    except TFoSError as err:
        _delete_quietly(fs, tmp)
        error = pickle.dumps(err)
    except BaseException:
        _delete_quietly(fs, tmp)
        raise
    yield pa.RecordBatch.from_pydict(
        {"partition": [partition], "records": [records], "name": [name], "error": [error]},
        schema=pa.schema(
            [("partition", pa.int32()), ("records", pa.int64()), ("name", pa.string()), ("error", pa.binary())]
        ),
    )


def _delete_quietly(fs: Any, path: str) -> None:
    """Best-effort removal of a temporary file or directory."""
    import pyarrow.fs as pafs

    try:
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.Directory:
            fs.delete_dir(path)
        elif info.type == pafs.FileType.File:
            fs.delete_file(path)
    except OSError:
        _log.debug("could not remove %s", path, exc_info=True)


def _prepare_output(fs: Any, root: str, uri: str, overwrite: bool) -> None:
    """Create the output directory; refuse (or, with ``overwrite``, empty) a non-empty one."""
    import pyarrow.fs as pafs

    info = fs.get_file_info(root)
    if info.type == pafs.FileType.File:
        raise ConfigError(f"output_dir {uri!r} is a file; expected a directory")
    if info.type == pafs.FileType.Directory and fs.get_file_info(pafs.FileSelector(root)):
        if not overwrite:
            raise ConfigError(
                f"output_dir {uri!r} already exists and is not empty; pass overwrite=True to replace its contents"
            )
        fs.delete_dir_contents(root)
    fs.create_dir(root, recursive=True)


def save_tfrecords(df: DataFrame, output_dir: str, *, overwrite: bool = False) -> list[str]:
    """Save ``df`` as TFRecord files of tf.train.Example, one ``part-r-NNNNN`` per partition.

    Returns the written files' paths. ``output_dir`` is a local path (resolved like Hadoop
    against ``fs.defaultFS``), a ``file://`` URI, or any URI ``pyarrow.fs`` opens (``hdfs://``,
    ``s3a://``, ``gs://``, ...); it must be missing or empty unless ``overwrite=True``.
    Raises :class:`InputError` (on the driver) for column types or values an Example cannot
    hold; a failed save leaves no part files behind.
    """
    plan = _plan_write(df.schema)
    uri = _resolve(df.sparkSession.sparkContext, output_dir)
    if overwrite and loaded_from(df) == uri:
        raise ConfigError(f"cannot overwrite {uri!r}: the DataFrame being saved is read from it")
    fs, root = _filesystem(uri)
    _prepare_output(fs, root, uri, overwrite)
    job = uuid.uuid4().hex
    job_dir = posixpath.join(root, _TEMP_DIR, job)
    task = functools.partial(_write_task, uri=uri, job=job, plan=plan)
    try:
        results = sorted(df.mapInArrow(task, _WRITE_RESULT).collect(), key=lambda r: r.partition)
        for row in results:
            if row.error is not None:
                raise pickle.loads(bytes(row.error))
        for row in results:  # job commit: every task succeeded
            fs.move(posixpath.join(job_dir, row.name), posixpath.join(root, row.name))
        with fs.open_output_stream(posixpath.join(root, "_SUCCESS")):
            pass
    finally:
        _delete_quietly(fs, posixpath.join(root, _TEMP_DIR))
    return [_join(uri, row.name) for row in results]


# ---------------------------------------------------------------------------------------------
# Loading a DataFrame
# ---------------------------------------------------------------------------------------------


def _session(sc: SparkContext | SparkSession) -> SparkSession:
    """The SparkSession for a SparkContext (or the session itself)."""
    from pyspark.sql import SparkSession

    if isinstance(sc, SparkSession):
        return sc
    return SparkSession.builder.getOrCreate()


def _check_positive(name: str, value: int | None) -> None:
    """ConfigError unless ``value`` is None or a positive int."""
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ConfigError(f"{name} must be a positive int or None. Received: {name}={value!r}")


def _infer_distributed(sc: SparkContext, files: list[str], binary: frozenset[str], limit: int | None) -> T.StructType:
    """Infer the schema with one Spark task per file, merging the stats on the driver."""
    task = functools.partial(_summarize_files, binary=binary, limit=limit)
    merged: dict[str, _FeatureStats] = {}
    for result in sc.parallelize(files, len(files)).mapPartitions(task).collect():
        if isinstance(result, TFoSError):
            raise result
        for name, stats in result.items():
            if name in merged:
                merged[name].merge(stats)
            else:
                merged[name] = stats
    if not merged:
        raise ConfigError(
            f"found no features in {len(files)} TFRecord file(s) (no records?); pass schema= to load them"
        )
    return _schema_from_stats(merged, binary)


def load_tfrecords(
    sc: SparkContext | SparkSession,
    input_dir: str,
    binary_features: Sequence[str] = (),
    *,
    schema: T.StructType | None = None,
    infer_records: int | None = None,
    num_partitions: int | None = None,
) -> DataFrame:
    """Load TFRecord files of tf.train.Example as a DataFrame (one column per feature).

    ``input_dir`` is a directory (``_SUCCESS`` and hidden files skipped), one file, or a glob
    such as ``dir/part-*``. Without ``schema`` the schema is inferred by a Spark job over every
    record, or the first ``infer_records`` of each file (rules in the module docstring);
    ``binary_features`` names bytes features to load as binary rather than string (ignored
    with ``schema``, which decides every column's type). Rows are read lazily, one task per
    file unless ``num_partitions`` is given. A corrupt file found while inferring raises
    :class:`DataFormatError` here; found later (``schema=`` or ``infer_records=`` given), it
    fails the Spark job with the same message (file and byte offset).
    """
    _check_positive("infer_records", infer_records)
    _check_positive("num_partitions", num_partitions)
    spark = _session(sc)
    context = spark.sparkContext
    uri = _resolve(context, input_dir)
    files = _list_record_files(uri)
    if schema is None:
        schema = _infer_distributed(context, files, _binary_set(binary_features), infer_records)
    else:
        _plan_read(schema)
    task = functools.partial(_read_task, files=tuple(files), schema=schema)
    parts = min(num_partitions or len(files), len(files))
    df = spark.range(0, len(files), 1, parts).mapInArrow(task, schema)
    loaded_dfs[df] = uri
    return df


def is_loaded_df(df: Any) -> bool:
    """Whether ``df`` was returned by :func:`load_tfrecords` (TFoS ``isLoadedDF``)."""
    try:
        return df in loaded_dfs
    except TypeError:  # not weak-referenceable, so never registered
        return False


def loaded_from(df: Any) -> str | None:
    """The resolved directory ``df`` was loaded from by :func:`load_tfrecords`, else None."""
    try:
        return loaded_dfs.get(df)
    except TypeError:
        return None


saveAsTFRecords = save_tfrecords
"""TFoS name of :func:`save_tfrecords`: ``saveAsTFRecords(df, output_dir)``."""

loadTFRecords = load_tfrecords
"""TFoS name of :func:`load_tfrecords`: ``loadTFRecords(sc, input_dir, binary_features=[])``."""

isLoadedDF = is_loaded_df
"""TFoS name of :func:`is_loaded_df`."""
