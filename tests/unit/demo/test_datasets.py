"""tfonspark.demo.datasets: idx reading (real and corrupt files), MNIST directories, digits fallback."""

from __future__ import annotations

import gzip
import os
import pickle
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from tfonspark.demo import datasets
from tfonspark.demo.datasets import (
    DATA_ENV_VAR,
    FASHION_CLASS_NAMES,
    MNIST_FILES,
    Dataset,
    find_data_dir,
    load_digits_as_mnist,
    load_for_demo,
    load_mnist,
    read_idx,
)
from tfonspark.errors import ConfigError, DataFormatError

_CODES = {
    "uint8": 0x08,
    "int8": 0x09,
    "int16": 0x0B,
    "int32": 0x0C,
    "float32": 0x0D,
    "float64": 0x0E,
}


def idx_bytes(array: np.ndarray) -> bytes:
    """The idx encoding of ``array``."""
    header = struct.pack(">BBBB", 0, 0, _CODES[array.dtype.name], array.ndim)
    header += struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(array.dtype.newbyteorder(">")).tobytes()


def write_idx(path: Path, array: np.ndarray) -> Path:
    """Write ``array`` as an idx file, gzipped when the name ends in .gz."""
    data = idx_bytes(array)
    path.write_bytes(gzip.compress(data, mtime=0) if path.suffix == ".gz" else data)
    return path


def write_mnist_dir(
    directory: Path, *, n_train: int = 6, n_test: int = 4, gz: bool = True, dotted: bool = False
) -> Path:
    """A tiny MNIST-style directory with random images and labels 0-9."""
    rng = np.random.default_rng(1)
    directory.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("test", n_test)):
        for kind, array in (
            ("images", rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)),
            ("labels", rng.integers(0, 10, n, dtype=np.uint8)),
        ):
            stem = MNIST_FILES[f"{split}_{kind}"]
            if dotted:
                stem = stem.replace("-idx", ".idx")
            write_idx(directory / (stem + (".gz" if gz else "")), array)
    return directory


def check_error(excinfo: pytest.ExceptionInfo[DataFormatError], path: Path, offset: int | None) -> None:
    """The error names the file (attribute and message) and the expected offset."""
    err = excinfo.value
    assert err.path == str(path)
    assert str(path) in str(err)
    if offset is not None:
        assert err.offset == offset
        assert f"at byte {offset}" in str(err)


# --------------------------------------------------------------------------- real data


def test_real_mnist(mnist_dir: Path) -> None:
    ds = load_mnist(mnist_dir)
    assert ds.train_images.shape == (60000, 28, 28) and ds.test_images.shape == (10000, 28, 28)
    for array in (ds.train_images, ds.train_labels, ds.test_images, ds.test_labels):
        assert array.dtype == np.uint8
    assert np.bincount(ds.train_labels).tolist() == [
        5923,
        6742,
        5958,
        6131,
        5842,
        5421,
        5918,
        6265,
        5851,
        5949,
    ]
    assert np.bincount(ds.test_labels).tolist() == [
        980,
        1135,
        1032,
        1010,
        982,
        892,
        958,
        1028,
        974,
        1009,
    ]
    assert ds.train_labels[:5].tolist() == [5, 0, 4, 1, 9]
    assert ds.test_labels[:3].tolist() == [7, 2, 1]
    assert ds.train_images.mean() / 255 == pytest.approx(0.1307, abs=1e-4)
    assert ds.train_images.std() / 255 == pytest.approx(0.3081, abs=1e-4)
    assert ds.num_classes == 10 and ds.image_shape == (28, 28)


def test_real_fashion(fashion_dir: Path) -> None:
    ds = datasets.load_fashion_mnist(fashion_dir)
    assert ds.class_names == FASHION_CLASS_NAMES and ds.name == "Fashion-MNIST"
    assert np.bincount(ds.train_labels).tolist() == [6000] * 10
    assert np.bincount(ds.test_labels).tolist() == [1000] * 10
    assert ds.train_images.mean() / 255 == pytest.approx(0.2860, abs=1e-4)


def test_real_idx_file_is_writable(mnist_dir: Path) -> None:
    labels = read_idx(mnist_dir / "t10k-labels-idx1-ubyte.gz")
    assert labels.shape == (10000,) and labels.flags.writeable
    labels[0] = 3  # arrays own their buffer: no read-only surprises


# --------------------------------------------------------------------------- idx round trips


@pytest.mark.parametrize("dtype", list(_CODES))
@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_round_trip_every_dtype(tmp_path: Path, dtype: str, suffix: str) -> None:
    values = np.arange(24).reshape(2, 3, 4) * 3
    if np.dtype(dtype).kind != "u":
        values = values - 30
    array = (values + 0.25 if np.dtype(dtype).kind == "f" else values).astype(dtype)
    got = read_idx(write_idx(tmp_path / f"a.idx{suffix}", array))
    assert got.dtype == np.dtype(dtype) and got.dtype.isnative
    np.testing.assert_array_equal(got, array)


def test_gzip_detected_by_content_not_name(tmp_path: Path) -> None:
    array = np.arange(10, dtype=np.uint8)
    gz_named_raw = tmp_path / "labels.gz"
    gz_named_raw.write_bytes(idx_bytes(array))
    raw_named_gz = tmp_path / "labels"
    raw_named_gz.write_bytes(gzip.compress(idx_bytes(array)))
    np.testing.assert_array_equal(read_idx(gz_named_raw), array)
    np.testing.assert_array_equal(read_idx(raw_named_gz), array)


def test_multi_member_gzip_and_zero_padding(tmp_path: Path) -> None:
    data = idx_bytes(np.arange(100, dtype=np.uint8))
    path = tmp_path / "x.gz"
    path.write_bytes(gzip.compress(data[:37]) + gzip.compress(data[37:]) + b"\0" * 8)
    np.testing.assert_array_equal(read_idx(path), np.arange(100))


def test_empty_dimension(tmp_path: Path) -> None:
    assert read_idx(write_idx(tmp_path / "e", np.zeros((0, 28, 28), np.uint8))).shape == (0, 28, 28)


# --------------------------------------------------------------------------- corrupt idx files


def test_bad_magic(tmp_path: Path) -> None:
    path = tmp_path / "bad.idx"
    path.write_bytes(b"\x1f\x00\x08\x01" + bytes(8))
    with pytest.raises(DataFormatError, match="magic number 0x1F000801") as excinfo:
        read_idx(path)
    check_error(excinfo, path, 0)


def test_bad_magic_inside_gzip_says_offsets_are_decompressed(tmp_path: Path) -> None:
    path = tmp_path / "bad.idx.gz"
    path.write_bytes(gzip.compress(b"\x12\x34\x08\x01" + bytes(8)))
    with pytest.raises(DataFormatError, match="decompressed") as excinfo:
        read_idx(path)
    check_error(excinfo, path, 0)


def test_unknown_dtype_code(tmp_path: Path) -> None:
    path = tmp_path / "bad.idx"
    path.write_bytes(b"\x00\x00\x07\x01" + struct.pack(">I", 1) + b"x")
    with pytest.raises(DataFormatError, match="dtype code 0x07") as excinfo:
        read_idx(path)
    check_error(excinfo, path, 2)


def test_zero_dimensions(tmp_path: Path) -> None:
    path = tmp_path / "bad.idx"
    path.write_bytes(b"\x00\x00\x08\x00")
    with pytest.raises(DataFormatError, match="0 dimensions") as excinfo:
        read_idx(path)
    check_error(excinfo, path, 3)


@pytest.mark.parametrize("content", [b"", b"\x00\x00"])
def test_too_short_for_a_header(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "short.idx"
    path.write_bytes(content)
    with pytest.raises(DataFormatError, match="too short") as excinfo:
        read_idx(path)
    check_error(excinfo, path, len(content))


def test_truncated_header(tmp_path: Path) -> None:
    path = tmp_path / "bad.idx"
    path.write_bytes(b"\x00\x00\x08\x03" + struct.pack(">I", 10) + b"\x00\x00")
    with pytest.raises(DataFormatError, match="truncated header") as excinfo:
        read_idx(path)
    check_error(excinfo, path, 10)


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_truncated_payload(tmp_path: Path, suffix: str) -> None:
    data = idx_bytes(np.zeros((5, 28, 28), np.uint8))[:-100]
    path = tmp_path / f"images{suffix}"
    path.write_bytes(gzip.compress(data) if suffix else data)
    with pytest.raises(DataFormatError, match=r"truncated payload.*need 3920 bytes.*found 3820") as excinfo:
        read_idx(path)
    check_error(excinfo, path, len(data))


def test_trailing_bytes_after_payload(tmp_path: Path) -> None:
    path = tmp_path / "labels"
    path.write_bytes(idx_bytes(np.zeros(10, np.uint8)) + b"junk")
    with pytest.raises(DataFormatError, match="4 unexpected bytes") as excinfo:
        read_idx(path)
    check_error(excinfo, path, 18)


# --------------------------------------------------------------------------- corrupt gzip streams


def test_truncated_gzip(tmp_path: Path) -> None:
    compressed = gzip.compress(idx_bytes(np.arange(5000, dtype=np.int32)))
    path = tmp_path / "labels.gz"
    path.write_bytes(compressed[: len(compressed) // 2])
    with pytest.raises(DataFormatError, match="truncated") as excinfo:
        read_idx(path)
    check_error(excinfo, path, len(compressed) // 2)


def test_truncated_real_gzip(tmp_path: Path, mnist_dir: Path) -> None:
    data = (mnist_dir / "t10k-images-idx3-ubyte.gz").read_bytes()
    path = tmp_path / "t10k-images-idx3-ubyte.gz"
    path.write_bytes(data[:-1000])
    with pytest.raises(DataFormatError, match="gzip stream ends early") as excinfo:
        read_idx(path)
    check_error(excinfo, path, len(data) - 1000)


def test_gzip_missing_only_its_trailer(tmp_path: Path) -> None:
    compressed = gzip.compress(idx_bytes(np.arange(10, dtype=np.uint8)))
    path = tmp_path / "x.gz"
    path.write_bytes(compressed[:-4])
    with pytest.raises(DataFormatError, match="truncated"):
        read_idx(path)


def test_gzip_checksum_mismatch_is_located(tmp_path: Path) -> None:
    compressed = bytearray(gzip.compress(idx_bytes(np.arange(200, dtype=np.uint8))))
    compressed[-8] ^= 0xFF  # first byte of the CRC32 in the trailer
    path = tmp_path / "x.gz"
    path.write_bytes(bytes(compressed))
    with pytest.raises(DataFormatError, match="corrupt gzip data") as excinfo:
        read_idx(path)
    check_error(excinfo, path, None)
    assert len(compressed) - 8 <= excinfo.value.offset < len(compressed)  # type: ignore[operator]


def test_gzip_corrupt_block_is_located_exactly(tmp_path: Path) -> None:
    data = idx_bytes(np.random.default_rng(0).integers(0, 256, 300_000, dtype=np.uint8))
    deflate = zlib.compressobj(wbits=31)  # gzip container
    first = deflate.compress(data[:150_000]) + deflate.flush(zlib.Z_FULL_FLUSH)
    stream = bytearray(first + deflate.compress(data[150_000:]) + deflate.flush())
    bad = len(first)  # a byte-aligned block header, beyond the first inflate chunk
    assert bad > 2 * datasets._CHUNK
    stream[bad] = 0b110  # BTYPE=11: an invalid deflate block type
    path = tmp_path / "x.gz"
    path.write_bytes(bytes(stream))
    with pytest.raises(DataFormatError, match="invalid block type") as excinfo:
        read_idx(path)
    check_error(excinfo, path, bad)


def test_garbage_after_gzip_stream(tmp_path: Path) -> None:
    compressed = gzip.compress(idx_bytes(np.arange(10, dtype=np.uint8)))
    path = tmp_path / "x.gz"
    path.write_bytes(compressed + b"garbage")
    with pytest.raises(DataFormatError, match="after the end of the gzip stream") as excinfo:
        read_idx(path)
    check_error(excinfo, path, len(compressed))


def test_error_survives_pickling(tmp_path: Path) -> None:
    path = tmp_path / "bad"
    path.write_bytes(b"\x01\x02\x03\x04")
    with pytest.raises(DataFormatError) as excinfo:
        read_idx(path)
    copy = pickle.loads(pickle.dumps(excinfo.value))
    assert (copy.path, copy.offset, str(copy)) == (str(path), 0, str(excinfo.value))


# --------------------------------------------------------------------------- missing files


def test_missing_file_names_path_and_expected_names(tmp_path: Path) -> None:
    path = tmp_path / "nope.gz"
    with pytest.raises(ConfigError, match="not found") as excinfo:
        read_idx(path)
    assert str(path) in str(excinfo.value)
    assert "train-images-idx3-ubyte.gz" in str(excinfo.value)
    assert isinstance(excinfo.value.__cause__, FileNotFoundError)


def test_directory_instead_of_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="directory"):
        read_idx(tmp_path)


# --------------------------------------------------------------------------- MNIST directories


@pytest.mark.parametrize("gz", [True, False])
@pytest.mark.parametrize("dotted", [False, True])
def test_load_mnist_synthetic(tmp_path: Path, gz: bool, dotted: bool) -> None:
    ds = load_mnist(write_mnist_dir(tmp_path / "d", gz=gz, dotted=dotted))
    assert ds.train_images.shape == (6, 28, 28) and ds.test_images.shape == (4, 28, 28)
    assert ds.train_labels.shape == (6,) and ds.test_labels.dtype == np.uint8
    assert "train=(6, 28, 28)" in repr(ds)


def test_load_mnist_missing_files_lists_them(tmp_path: Path) -> None:
    directory = write_mnist_dir(tmp_path / "d")
    (directory / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(ConfigError) as excinfo:
        load_mnist(directory)
    message = str(excinfo.value)
    assert str(directory) in message
    assert "missing" in message and "t10k-labels-idx1-ubyte" in message
    assert "train-images-idx3-ubyte.gz" in message  # the expected names are all listed


def test_load_mnist_points_at_subdirectory(tmp_path: Path) -> None:
    write_mnist_dir(tmp_path / "mnist")
    with pytest.raises(ConfigError, match="subdirectories that have them: mnist"):
        load_mnist(tmp_path)


def test_load_mnist_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_mnist(tmp_path / "absent")


def test_wrong_label_count(tmp_path: Path) -> None:
    directory = write_mnist_dir(tmp_path / "d")
    labels = directory / "train-labels-idx1-ubyte.gz"
    write_idx(labels, np.zeros(5, np.uint8))
    with pytest.raises(DataFormatError, match="holds 5 labels but .* holds 6 images") as excinfo:
        load_mnist(directory)
    check_error(excinfo, labels, 4)


def test_label_out_of_range(tmp_path: Path) -> None:
    directory = write_mnist_dir(tmp_path / "d", gz=False)
    labels = directory / "t10k-labels-idx1-ubyte"
    write_idx(labels, np.array([1, 2, 12, 3], np.uint8))
    with pytest.raises(DataFormatError, match="label 12 at index 2") as excinfo:
        load_mnist(directory)
    check_error(excinfo, labels, 10)


def test_images_must_be_uint8_3d(tmp_path: Path) -> None:
    directory = write_mnist_dir(tmp_path / "d")
    images = directory / "train-images-idx3-ubyte.gz"
    write_idx(images, np.zeros((6, 784), np.uint8))
    with pytest.raises(DataFormatError, match=r"expected uint8 images") as excinfo:
        load_mnist(directory)
    check_error(excinfo, images, 2)


def test_dataset_rejects_mismatched_arrays() -> None:
    images = np.zeros((3, 28, 28), np.uint8)
    with pytest.raises(ConfigError, match="train images"):
        Dataset(images, np.zeros(2, np.uint8), images, np.zeros(3, np.uint8))


# --------------------------------------------------------------------------- scikit-learn digits


def test_digits_as_mnist_shapes() -> None:
    ds = load_digits_as_mnist()
    assert len(ds.train_images) + len(ds.test_images) == 1797
    assert len(ds.test_images) == pytest.approx(0.2 * 1797, abs=10)
    assert ds.train_images.shape[1:] == ds.test_images.shape[1:] == (28, 28)
    for array in (ds.train_images, ds.train_labels, ds.test_images, ds.test_labels):
        assert array.dtype == np.uint8
    assert len(ds.train_labels) == len(ds.train_images)
    assert set(np.unique(ds.test_labels)) == set(range(10))  # stratified: every class tested
    assert ds.train_images.max() == 255
    border = np.ones((28, 28), bool)
    border[4:24, 4:24] = False
    assert not ds.train_images[:, border].any()  # 20x20 digit centred, as in MNIST


def test_digits_split_is_deterministic() -> None:
    a, b = load_digits_as_mnist(), load_digits_as_mnist()
    np.testing.assert_array_equal(a.test_labels, b.test_labels)
    np.testing.assert_array_equal(a.train_images, b.train_images)
    c = load_digits_as_mnist(seed=1)
    assert not np.array_equal(a.test_images, c.test_images)


def test_digits_upsampling_keeps_the_digit() -> None:
    from sklearn.datasets import load_digits

    full = datasets._digits_to_mnist_layout(np.full((1, 8, 8), 16.0))
    assert (full[0, 4:24, 4:24] == 255).all()  # interpolation weights sum to one
    images = load_digits().images[:50]
    big = datasets._digits_to_mnist_layout(images).astype(float)
    pooled = big[:, 4:24, 4:24].reshape(50, 4, 5, 4, 5).mean(axis=(2, 4))
    source = images.reshape(50, 4, 2, 4, 2).mean(axis=(2, 4))
    assert np.corrcoef(pooled.ravel(), source.ravel())[0, 1] > 0.95


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 1.5])
def test_digits_bad_test_fraction(fraction: float) -> None:
    with pytest.raises(ConfigError, match="test_fraction"):
        load_digits_as_mnist(test_fraction=fraction)


# --------------------------------------------------------------------------- choosing the data


def test_find_data_dir_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    explicit, env = tmp_path / "explicit", tmp_path / "env"
    explicit.mkdir()
    env.mkdir()
    monkeypatch.delenv(DATA_ENV_VAR, raising=False)
    assert find_data_dir() is None
    monkeypatch.setenv(DATA_ENV_VAR, "")
    assert find_data_dir() is None
    monkeypatch.setenv(DATA_ENV_VAR, str(env))
    assert find_data_dir() == env
    assert find_data_dir(str(explicit)) == explicit
    assert find_data_dir(explicit) == explicit


def test_find_data_dir_errors_name_the_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r"--data=.*absent"):
        find_data_dir(tmp_path / "absent")
    with pytest.raises(ConfigError, match="empty"):
        find_data_dir("")
    monkeypatch.setenv(DATA_ENV_VAR, str(tmp_path / "gone"))
    with pytest.raises(ConfigError, match=f"{DATA_ENV_VAR}=.*gone"):
        find_data_dir()


def test_load_for_demo_falls_back_to_digits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DATA_ENV_VAR, raising=False)
    ds, description = load_for_demo()
    assert ds.name == "scikit-learn digits"
    assert "scikit-learn digits" in description and "no --data" in description


def test_load_for_demo_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = write_mnist_dir(tmp_path / "fashion-mnist")
    monkeypatch.setenv(DATA_ENV_VAR, str(directory))
    ds, description = load_for_demo()
    assert ds.class_names == FASHION_CLASS_NAMES
    assert str(directory) in description and DATA_ENV_VAR in description


def test_load_for_demo_real_mnist(mnist_dir: Path) -> None:
    ds, description = load_for_demo(str(mnist_dir))
    assert len(ds.train_images) == 60000
    assert description.startswith(f"MNIST idx files from {mnist_dir}")


# --------------------------------------------------------------------------- module hygiene


def test_exported_members() -> None:
    public = {n for n in vars(datasets) if not n.startswith("_")}
    exported = set(datasets.__all__)
    assert exported <= public
    assert datasets.__all__ == sorted(datasets.__all__)
    missing = {n for n in public - exported if getattr(getattr(datasets, n), "__module__", None) == datasets.__name__}
    assert not missing


def test_import_is_light() -> None:
    code = "import sys, tfonspark.demo.datasets; print('sklearn' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": str(Path(datasets.__file__).parents[2])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "False"
