"""Paths and file systems: one place that turns what a user typed into a file tfonspark can open.

Paths are qualified like Hadoop qualifies them against ``fs.defaultFS`` (:func:`qualify`,
:func:`resolve`), on the driver, because executors share neither its working directory nor,
always, its configuration. Files are opened through ``pyarrow.fs`` (:func:`filesystem`), which
reads local files, ``hdfs://`` and ``viewfs://`` (libhdfs and a JVM), object stores and
``file://`` URIs alike. A path nothing here can open raises :class:`~tfonspark.errors.ConfigError`
naming the path and what is supported.

Users of this module: the TFRecord reader and writer (:mod:`tfonspark.data.tfrecord`), the
SavedModel reader (:mod:`tfonspark.ml.savedmodel`) and ``ctx.absolute_path`` (TFoS
``hdfs_path``, via ``qualify(..., tfos=True)``).
"""

from __future__ import annotations

import getpass
import io
import logging
import os
import posixpath
import re
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from .errors import ConfigError

if TYPE_CHECKING:
    from pyspark import SparkContext

__all__ = [
    "LOCAL_FS",
    "SUPPORTED",
    "default_fs",
    "delete_quietly",
    "filesystem",
    "is_local",
    "join",
    "open_read",
    "open_write",
    "qualify",
    "read_file",
    "resolve",
]

_log = logging.getLogger(__name__)

#: Hadoop's own default ``fs.defaultFS``: the local file system.
LOCAL_FS = "file:///"
#: What :func:`filesystem` opens, for error messages.
SUPPORTED = (
    "local paths, file://, and what pyarrow.fs supports: hdfs:// and viewfs:// (needs libhdfs "
    "and a JVM), s3:// (also s3a://, s3n://), gs://, abfs://"
)
_IO_BUFFER = 1 << 20
_TFOS_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_HOME_DIR_SCHEMES = ("hdfs", "viewfs")  # where TFoS puts relative paths under /user/<user>


# ---- qualifying paths -----------------------------------------------------------------------


def qualify(
    path: str,
    *,
    default_fs: str = LOCAL_FS,
    working_dir: str | None = None,
    user: str | None = None,
    tfos: bool = False,
) -> str:
    """``path`` made absolute against ``default_fs``, the way Hadoop qualifies a ``Path``.

    A path with a scheme is kept; an absolute path lands on ``default_fs``; a relative path goes
    under ``working_dir`` (default: this process's) on a local ``default_fs`` and under
    ``/user/<user>/`` (default: the login name) on other file systems.

    By default the result is canonical, for tfonspark's own readers and writers: normalised,
    without a trailing ``/``, a local path stays a plain absolute path (so results compare equal
    and join cleanly), and an empty path raises ConfigError.

    ``tfos=True`` returns exactly what TFoS ``hdfs_path`` returned (``ctx.absolute_path``), for
    compatibility: only ``scheme://`` counts as a scheme and such a path is kept verbatim,
    nothing is normalised, a local result is a ``file://`` URI, and a relative path on a file
    system other than ``hdfs``/``viewfs``/``file`` goes directly under its root.
    """
    if tfos:
        cwd = os.getcwd() if working_dir is None else working_dir
        return _qualify_tfos(path, default_fs, cwd, user or getpass.getuser())
    if not path:
        raise ConfigError("path is empty; expected a file or directory path or URI")
    if _has_scheme(path):
        stripped = path.rstrip("/")
        return stripped if urlsplit(stripped).path else path  # keep "hdfs://nn/" whole
    if is_local(default_fs):
        return os.path.normpath(os.path.join(working_dir or os.getcwd(), path))
    root = _root(default_fs)
    if path.startswith("/"):
        return root + posixpath.normpath(path)
    return f"{root}/user/{user or getpass.getuser()}/{posixpath.normpath(path)}"


def _qualify_tfos(path: str, default_fs: str, working_dir: str, user: str) -> str:
    """TFoS ``hdfs_path``, byte for byte (see :func:`qualify`)."""
    if _TFOS_SCHEME.match(path):
        return path
    root = _root(default_fs)
    if path.startswith("/"):
        return root + path
    if root.startswith(tuple(f"{scheme}://" for scheme in _HOME_DIR_SCHEMES)):
        return f"{root}/user/{user}/{path}"
    if root.startswith("file://"):
        return f"{root}/{working_dir.strip('/')}/{path}"
    return f"{root}/{path}"


def _has_scheme(path: str) -> bool:
    """Whether ``path`` is a URI (a one-letter "scheme" is a Windows drive)."""
    return len(urlsplit(path).scheme) > 1


def _root(default_fs: str) -> str:
    """``default_fs`` without trailing slashes, keeping ``scheme://``: ``file:///`` -> ``file://``."""
    while default_fs.endswith("/") and not default_fs.endswith("://"):
        default_fs = default_fs[:-1]
    return default_fs


def is_local(uri: str) -> bool:
    """Whether ``uri`` (a path, a URI, or an ``fs.defaultFS`` value) is on the local file system."""
    scheme = urlsplit(uri).scheme.lower()
    return len(scheme) <= 1 or scheme == "file"


def default_fs(sc: SparkContext) -> str:
    """The Hadoop ``fs.defaultFS`` of a live SparkContext; ``file://`` if unset or unreadable.

    Unreadable means no JVM gateway (Spark Connect) or a stopped context: paths are then local.
    """
    try:
        return str(sc._jsc.hadoopConfiguration().get("fs.defaultFS") or "file://")
    except Exception:
        return "file://"


def resolve(sc: SparkContext, path: str) -> str:
    """:func:`qualify` ``path`` with the default file system and user of a live SparkContext."""
    fs = default_fs(sc)
    try:
        user = None if is_local(fs) else str(sc.sparkUser())
    except Exception:
        user = None
    return qualify(path, default_fs=fs, user=user)


def join(uri: str, name: str) -> str:
    """``uri`` + ``/`` + ``name`` (for local paths and URIs alike)."""
    return uri.rstrip("/") + "/" + name


# ---- opening files --------------------------------------------------------------------------


def filesystem(uri: str) -> tuple[Any, str]:
    """A ``pyarrow.fs`` file system and the path inside it, for a qualified path or URI.

    ``s3a://`` and ``s3n://`` (Hadoop's names) are read as ``s3://``. Raises ConfigError when
    no file system handles the scheme or its client cannot start.
    """
    import pyarrow as pa
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
        raise ConfigError(f"unsupported file system for {uri!r} ({err}); supported: {SUPPORTED}") from err
    except (OSError, pa.ArrowException) as err:
        raise ConfigError(
            f"cannot open the file system of {uri!r}: {err}. Supported: {SUPPORTED}; check the "
            "client setup (HADOOP_HOME/ARROW_LIBHDFS_DIR for HDFS, credentials for object stores)"
        ) from err
    return fs, fs_path


def open_read(fs: Any, fs_path: str) -> io.BufferedReader:
    """A buffered binary reader; Python-side buffering makes many small reads cheap."""
    return io.BufferedReader(fs.open_input_stream(fs_path, compression=None), _IO_BUFFER)


def open_write(fs: Any, fs_path: str) -> io.BufferedWriter:
    """A buffered binary writer (see :func:`open_read`)."""
    return io.BufferedWriter(fs.open_output_stream(fs_path, compression=None), _IO_BUFFER)


def read_file(uri: str) -> bytes | None:
    """The whole content of the file at a qualified path or URI; None if there is no such file."""
    import pyarrow.fs as pafs

    fs, fs_path = filesystem(uri)
    if fs.get_file_info(fs_path).type != pafs.FileType.File:
        return None
    with open_read(fs, fs_path) as stream:
        return stream.read()


def delete_quietly(fs: Any, fs_path: str) -> None:
    """Best-effort removal of a file or directory (a temporary one, typically)."""
    import pyarrow.fs as pafs

    try:
        info = fs.get_file_info(fs_path)
        if info.type == pafs.FileType.Directory:
            fs.delete_dir(fs_path)
        elif info.type == pafs.FileType.File:
            fs.delete_file(fs_path)
    except OSError:
        _log.debug("could not remove %s", fs_path, exc_info=True)
