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

The package, bottom up: :mod:`.crc` (masked CRC-32C), :mod:`.records` (record framing, files),
:mod:`.example` (the Example message; Arrow <-> Example codec), :mod:`.infer` (schema
inference), :mod:`.jobs` (the Spark jobs). Paths and file systems are :mod:`tfonspark.fs`'s.

This package is the one door to these names; TFoS's spellings (``saveAsTFRecords``,
``loadTFRecords``, ``isLoadedDF``, ``loadedDF``) are aliases in :mod:`tfonspark.dfutil`.
"""

from __future__ import annotations

from .crc import crc32c, masked_crc32c
from .infer import infer_schema
from .jobs import is_loaded_df, load_tfrecords, loaded_dfs, loaded_from, save_tfrecords
from .records import read_tfrecord_file, write_tfrecord_file

__all__ = [
    "crc32c",
    "infer_schema",
    "is_loaded_df",
    "load_tfrecords",
    "loaded_dfs",
    "loaded_from",
    "masked_crc32c",
    "read_tfrecord_file",
    "save_tfrecords",
    "write_tfrecord_file",
]
