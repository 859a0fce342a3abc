"""The Spark jobs: save a DataFrame as TFRecord files, load TFRecord files as a DataFrame.

**Saving** writes one ``part-r-NNNNN`` per partition under ``_temporary/<job>/``; the driver
moves the files into place only when every task has succeeded (Hadoop's job commit), then
writes ``_SUCCESS``. **Loading** lists the input on the driver, infers the schema with one task
per file unless one is given, and reads each file whole in one task of a lazy ``mapInArrow``.

**Errors.** A data error found by a save or inference task fails the same way on every attempt,
so the task returns it (:func:`tfonspark.wire.errors.encode` text in a result row) instead of
raising, Spark does not retry it, and the driver raises the same typed error again. Typed errors
raised anywhere else in a task reach the driver through :func:`~tfonspark.wire.errors.captured`.
"""

from __future__ import annotations

import fnmatch
import functools
import posixpath
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import pyarrow as pa
from pyspark.sql import types as T

from ... import fs
from ...errors import ConfigError, TFoSError
from ...wire import errors as wire_errors
from .example import WriteColumn, encode_batch, plan_read, plan_write, read_file_batches
from .infer import FeatureStats, binary_set, schema_from_stats, summarize_files
from .records import write_records

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "is_loaded_df",
    "list_record_files",
    "load_tfrecords",
    "loaded_dfs",
    "loaded_from",
    "save_tfrecords",
]

R = TypeVar("R")

loaded_dfs: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
"""DataFrames returned by :func:`load_tfrecords` -> the resolved directory they were read from.

Entries disappear when their DataFrame is garbage collected (TFoS kept them forever).
"""

_TEMP_DIR = "_temporary"
_WRITE_RESULT = "partition int, records long, name string, error string"  # error: encode() text
_WRITE_ARROW = pa.schema(
    [("partition", pa.int32()), ("records", pa.int64()), ("name", pa.string()), ("error", pa.string())]
)


# ---- driver helpers ---------------------------------------------------------------------------


def _run(what: str, action: Callable[[], R]) -> R:
    """Run a Spark action; a task's typed error is raised again here, others as TFoSError."""
    try:
        return action()
    except Exception as exc:
        wire_errors.raise_or(exc, lambda line: TFoSError(f"{what} failed on an executor: {line}"))


def _raise_returned(text: str) -> NoReturn:
    """Raise the typed error a task returned as :func:`~tfonspark.wire.errors.encode` text."""
    wire_errors.reraise(text)
    raise TFoSError(f"a TFRecord task reported an error that could not be decoded: {text}")


def _is_data_file(name: str) -> bool:
    """Hadoop's rule: files starting with ``_`` (``_SUCCESS``) or ``.`` are not data."""
    return not name.startswith(("_", "."))


def list_record_files(uri: str) -> list[str]:
    """The data files of a directory, a single file, or a glob in the last path component."""
    import pyarrow.fs as pafs

    filesystem, fs_path = fs.filesystem(uri)
    pattern = None
    base = posixpath.basename(fs_path.rstrip("/"))
    if any(ch in base for ch in "*?["):
        pattern = base
        fs_path = posixpath.dirname(fs_path.rstrip("/"))
        uri = uri.rstrip("/")[: -len(base)].rstrip("/")
    info = filesystem.get_file_info(fs_path)
    if info.type == pafs.FileType.File and pattern is None:
        return [uri]
    if info.type != pafs.FileType.Directory:
        raise ConfigError(f"input path {uri!r} does not exist (or is not a directory)")
    entries = filesystem.get_file_info(pafs.FileSelector(fs_path, recursive=False))
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
    return [fs.join(uri, name) for name in names]


# ---- saving a DataFrame -----------------------------------------------------------------------


def _part_name(partition: int) -> str:
    """Hadoop's output file name for a partition: ``part-r-00042``."""
    return f"part-r-{partition:05d}"


@wire_errors.captured
def _write_task(
    batches: Iterable[pa.RecordBatch], *, uri: str, job: str, plan: tuple[WriteColumn, ...]
) -> Iterator[pa.RecordBatch]:
    """Executor side of saving: write this partition to ``_temporary/<job>/part-r-NNNNN``.

    A data error (:class:`~tfonspark.errors.InputError`) goes into the result's ``error``
    column (see the module docstring), and the partly written file is removed.
    """
    from pyspark import TaskContext

    ctx = TaskContext.get()
    partition = ctx.partitionId() if ctx is not None else 0
    attempt = ctx.attemptNumber() if ctx is not None else 0
    name = _part_name(partition)
    filesystem, root = fs.filesystem(uri)
    job_dir = posixpath.join(root, _TEMP_DIR, job)
    tmp = posixpath.join(job_dir, f".{name}.attempt{attempt}.{uuid.uuid4().hex[:8]}")
    records, error = 0, None
    try:
        filesystem.create_dir(job_dir, recursive=True)
        with fs.open_write(filesystem, tmp) as out:
            for batch in batches:
                encoded = encode_batch(batch, plan, partition=partition, first_row=records)
                records += write_records(out, encoded)
        filesystem.move(tmp, posixpath.join(job_dir, name))
    except TFoSError as err:
        fs.delete_quietly(filesystem, tmp)
        error = wire_errors.encode(err)
    except BaseException:
        fs.delete_quietly(filesystem, tmp)
        raise
    row = {"partition": [partition], "records": [records], "name": [name], "error": [error]}
    yield pa.RecordBatch.from_pydict(row, schema=_WRITE_ARROW)


def _prepare_output(filesystem: Any, root: str, uri: str, overwrite: bool) -> None:
    """Create the output directory; refuse (or, with ``overwrite``, empty) a non-empty one."""
    import pyarrow.fs as pafs

    info = filesystem.get_file_info(root)
    if info.type == pafs.FileType.File:
        raise ConfigError(f"output_dir {uri!r} is a file; expected a directory")
    if info.type == pafs.FileType.Directory and filesystem.get_file_info(pafs.FileSelector(root)):
        if not overwrite:
            raise ConfigError(
                f"output_dir {uri!r} already exists and is not empty; pass overwrite=True to replace its contents"
            )
        filesystem.delete_dir_contents(root)
    filesystem.create_dir(root, recursive=True)


def save_tfrecords(df: DataFrame, output_dir: str, *, overwrite: bool = False) -> list[str]:
    """Save ``df`` as TFRecord files of tf.train.Example, one ``part-r-NNNNN`` per partition.

    Returns the written files' paths. ``output_dir`` is a local path (resolved like Hadoop
    against ``fs.defaultFS``), a ``file://`` URI, or any URI ``pyarrow.fs`` opens (``hdfs://``,
    ``s3a://``, ``gs://``, ...); it must be missing or empty unless ``overwrite=True``.
    Raises :class:`~tfonspark.errors.InputError` (on the driver) for column types or values an
    Example cannot hold; a failed save leaves no part files behind.
    """
    plan = plan_write(df.schema)
    uri = fs.resolve(df.sparkSession.sparkContext, output_dir)
    if overwrite and loaded_from(df) == uri:
        raise ConfigError(f"cannot overwrite {uri!r}: the DataFrame being saved is read from it")
    filesystem, root = fs.filesystem(uri)
    _prepare_output(filesystem, root, uri, overwrite)
    job = uuid.uuid4().hex
    job_dir = posixpath.join(root, _TEMP_DIR, job)
    task = functools.partial(_write_task, uri=uri, job=job, plan=plan)
    try:
        written = df.mapInArrow(task, _WRITE_RESULT)
        results = sorted(_run(f"saving TFRecords to {uri!r}", written.collect), key=lambda r: r.partition)
        for row in results:
            if row.error is not None:
                _raise_returned(row.error)
        for row in results:  # job commit: every task succeeded
            filesystem.move(posixpath.join(job_dir, row.name), posixpath.join(root, row.name))
        with filesystem.open_output_stream(posixpath.join(root, "_SUCCESS")):
            pass
    finally:
        fs.delete_quietly(filesystem, posixpath.join(root, _TEMP_DIR))
    return [fs.join(uri, row.name) for row in results]


# ---- loading a DataFrame ----------------------------------------------------------------------


@wire_errors.captured
def _read_task(
    batches: Iterable[pa.RecordBatch], *, files: tuple[str, ...], schema: T.StructType
) -> Iterator[pa.RecordBatch]:
    """Executor side of loading: the input holds file indexes, the output the files' rows."""
    plan = plan_read(schema)
    for batch in batches:
        for index in batch.column(0).to_pylist():
            yield from read_file_batches(files[index], plan)


def _infer_task(
    uris: Iterable[str], *, binary: frozenset[str], limit: int | None
) -> Iterator[dict[str, FeatureStats] | str]:
    """Executor side of inference: the files' stats, or a data error as ``encode`` text."""
    try:
        stats = summarize_files(uris, binary=binary, limit=limit)
    except TFoSError as err:
        yield wire_errors.encode(err)
        return
    yield stats


def _infer_distributed(sc: SparkContext, files: list[str], binary: frozenset[str], limit: int | None) -> T.StructType:
    """Infer the schema with one Spark task per file, merging the stats on the driver."""
    task = functools.partial(_infer_task, binary=binary, limit=limit)
    results = _run("inferring the TFRecord schema", sc.parallelize(files, len(files)).mapPartitions(task).collect)
    merged: dict[str, FeatureStats] = {}
    for result in results:
        if isinstance(result, str):
            _raise_returned(result)
        for name, stats in result.items():
            if name in merged:
                merged[name].merge(stats)
            else:
                merged[name] = stats
    if not merged:
        raise ConfigError(
            f"found no features in {len(files)} TFRecord file(s) (no records?); pass schema= to load them"
        )
    return schema_from_stats(merged, binary)


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
    record, or the first ``infer_records`` of each file (rules in the package docstring);
    ``binary_features`` names bytes features to load as binary rather than string (ignored
    with ``schema``, which decides every column's type). Rows are read lazily, one task per
    file unless ``num_partitions`` is given. A corrupt file found while inferring raises
    :class:`~tfonspark.errors.DataFormatError` here; found later (``schema=`` or
    ``infer_records=`` given), it fails the Spark job with the same message (file and byte
    offset).
    """
    _check_positive("infer_records", infer_records)
    _check_positive("num_partitions", num_partitions)
    spark = _session(sc)
    context = spark.sparkContext
    uri = fs.resolve(context, input_dir)
    files = list_record_files(uri)
    if schema is None:
        schema = _infer_distributed(context, files, binary_set(binary_features), infer_records)
    else:
        plan_read(schema)
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
