"""tfonspark.fs: Hadoop-style path qualification (canonical and TFoS forms) and file access."""

from __future__ import annotations

import getpass
import os
from types import SimpleNamespace

import pyarrow.fs as pafs
import pytest

from tfonspark import fs
from tfonspark.errors import ConfigError

USER = getpass.getuser()


# ---- qualify: canonical (tfonspark's readers and writers) ---------------------------------------


def test_qualify_follows_hadoop_rules():
    assert fs.qualify("rel/dir", working_dir="/base") == "/base/rel/dir"
    assert fs.qualify("/abs/dir/", working_dir="/base") == "/abs/dir"
    assert fs.qualify("a/../b/./c/") == os.path.join(os.getcwd(), "b", "c")
    assert fs.qualify("file:///tmp/x/") == "file:///tmp/x"
    assert fs.qualify("hdfs://nn:8020/data/x/") == "hdfs://nn:8020/data/x"
    assert fs.qualify("hdfs://nn:8020/") == "hdfs://nn:8020/"  # the root keeps its slash
    hdfs = "hdfs://nn:8020"
    assert fs.qualify("/abs", default_fs=hdfs, user="ann") == "hdfs://nn:8020/abs"
    assert fs.qualify("/a//b/../c", default_fs=hdfs + "/", user="ann") == "hdfs://nn:8020/a/c"
    assert fs.qualify("rel/x", default_fs=hdfs, user="ann") == "hdfs://nn:8020/user/ann/rel/x"
    assert fs.qualify("rel/x", default_fs=hdfs) == f"hdfs://nn:8020/user/{USER}/rel/x"
    assert fs.qualify("rel", default_fs="file://", working_dir="/w") == "/w/rel"
    with pytest.raises(ConfigError, match="path is empty"):
        fs.qualify("")


def test_is_local():
    for local in ("/x", "rel", "file:///x", "file://", "C:/x", "FILE:///x"):
        assert fs.is_local(local), local
    for remote in ("hdfs://nn/x", "s3a://b/k", "viewfs://c/"):
        assert not fs.is_local(remote), remote


# ---- qualify(tfos=True): TFoS hdfs_path, exactly ------------------------------------------------


def hdfs_path(default_fs: str, path: str, working_dir: str = "/home/me/job") -> str:
    return fs.qualify(path, default_fs=default_fs, working_dir=working_dir, tfos=True)


@pytest.mark.parametrize("path", ["hdfs://nn:8020/data/x/", "viewfs://cluster/data", "file:///tmp/x", "s3a://b/k"])
@pytest.mark.parametrize("default_fs", ["file://", "hdfs://nn:8020", "viewfs://cluster/"])
def test_tfos_keeps_paths_with_a_scheme_verbatim(path, default_fs):
    assert hdfs_path(default_fs, path) == path


@pytest.mark.parametrize(
    ("default_fs", "path", "expected"),
    [
        ("hdfs://nn:8020/", "/data/mnist", "hdfs://nn:8020/data/mnist"),
        ("viewfs://cluster", "/data/mnist", "viewfs://cluster/data/mnist"),
        ("file:///", "/data/mnist", "file:///data/mnist"),
        ("file://", "/data/../mnist/", "file:///data/../mnist/"),  # not normalised
        ("file:///", "out/model", "file:///home/me/job/out/model"),
        ("hdfs://nn:8020/", "mnist/csv", f"hdfs://nn:8020/user/{USER}/mnist/csv"),
        ("viewfs://cluster/", "mnist", f"viewfs://cluster/user/{USER}/mnist"),
        ("s3a://bucket", "models/x", "s3a://bucket/models/x"),  # no /user/ outside hdfs/viewfs
        ("hdfs://nn:8020", "hdfs:/x", f"hdfs://nn:8020/user/{USER}/hdfs:/x"),  # only "x://" is a scheme
    ],
)
def test_tfos_form(default_fs, path, expected):
    assert hdfs_path(default_fs, path) == expected


def test_tfos_form_matches_node_context_hdfs_path():
    from tfonspark.tfprocess.context import hdfs_path as context_hdfs_path

    for default_fs in ("file://", "file:///", "hdfs://nn:8020/", "viewfs://c", "s3a://b", ""):
        for path in ("/abs/x/", "rel/x", "", "hdfs://nn/x", "a/../b"):
            for working_dir in ("/home/me/job/", "", "/"):
                ctx = SimpleNamespace(defaultFS=default_fs, working_dir=working_dir)
                assert hdfs_path(default_fs, path, working_dir) == context_hdfs_path(ctx, path)


# ---- the default file system of a SparkContext -------------------------------------------------


def fake_sc(default_fs: str | None, user: str = "ann") -> SimpleNamespace:
    conf = SimpleNamespace(get=lambda key: default_fs if key == "fs.defaultFS" else None)
    jsc = SimpleNamespace(hadoopConfiguration=lambda: conf)
    return SimpleNamespace(_jsc=jsc, sparkUser=lambda: user)


def test_default_fs_and_resolve_read_the_spark_context():
    hdfs = fake_sc("hdfs://nn:8020")
    assert fs.default_fs(hdfs) == "hdfs://nn:8020"
    assert fs.resolve(hdfs, "rel/x") == "hdfs://nn:8020/user/ann/rel/x"
    assert fs.default_fs(fake_sc(None)) == "file://"
    assert fs.default_fs(SimpleNamespace()) == "file://"  # no JVM gateway (Spark Connect)
    assert fs.resolve(SimpleNamespace(), "/a/b/") == "/a/b"
    assert fs.resolve(fake_sc("file:///"), "rel") == os.path.join(os.getcwd(), "rel")


# ---- file systems and files -------------------------------------------------------------------


def test_filesystem_resolution(tmp_path):
    filesystem, path = fs.filesystem((tmp_path / "a b").as_uri())
    assert isinstance(filesystem, pafs.LocalFileSystem) and path == str(tmp_path / "a b")
    filesystem, path = fs.filesystem("rel/x")
    assert isinstance(filesystem, pafs.LocalFileSystem) and path == os.path.join(os.getcwd(), "rel/x")
    with pytest.raises(ConfigError, match="'nosuchfs://bucket/dir'.*supported: local paths, file://"):
        fs.filesystem("nosuchfs://bucket/dir")


def test_read_open_join_and_delete(tmp_path):
    filesystem, root = fs.filesystem(str(tmp_path))
    target = fs.join(root + "/", "f.bin")
    assert target == f"{tmp_path}/f.bin"
    with fs.open_write(filesystem, target) as out:
        out.write(b"payload")
    with fs.open_read(filesystem, target) as stream:
        assert stream.read(3) == b"pay"
    assert fs.read_file(target) == b"payload"
    assert fs.read_file((tmp_path / "f.bin").as_uri()) == b"payload"
    assert fs.read_file(str(tmp_path / "missing")) is None
    assert fs.read_file(str(tmp_path)) is None  # a directory is not a file
    fs.delete_quietly(filesystem, target)
    fs.delete_quietly(filesystem, target)  # already gone: no error
    assert not (tmp_path / "f.bin").exists()
    (tmp_path / "d").mkdir()
    fs.delete_quietly(filesystem, str(tmp_path / "d"))
    assert not (tmp_path / "d").exists()


def test_exported_members():
    assert fs.__all__ == sorted(fs.__all__)
    assert all(hasattr(fs, name) for name in fs.__all__)
