"""Datasets for the demo: MNIST-family idx files, or scikit-learn's bundled digits.

The idx format (MNIST, Fashion-MNIST, EMNIST) is a big-endian header followed by one raw array::

    offset   size                  field
    0        2                     0x0000
    2        1                     dtype code: 0x08 uint8, 0x09 int8, 0x0B int16, 0x0C int32,
                                   0x0D float32, 0x0E float64
    3        1                     number of dimensions, d
    4        4*d                   each dimension, big-endian uint32
    4+4*d    prod(dims)*itemsize   the values, row-major, big-endian

A file may be gzipped; that is recognised by its first bytes, not by its name. Every corrupt
file raises :class:`~tfonspark.errors.DataFormatError` naming the file and a byte offset: for a
broken gzip stream the offset counts bytes of the file, for a broken idx structure inside a
gzip file it counts bytes of the decompressed data (the message says so).

Where the demo's data comes from (:func:`load_for_demo`):

1. an explicit ``--data`` directory,
2. else the directory in the ``TFONSPARK_DATA`` environment variable,
3. else scikit-learn's bundled 8x8 digits, upsampled to MNIST's 28x28 layout
   (:func:`load_digits_as_mnist`), so that the same model runs on both.
"""

from __future__ import annotations

import math
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ConfigError, DataFormatError

__all__ = [
    "DATA_ENV_VAR",
    "DIGIT_CLASS_NAMES",
    "Dataset",
    "FASHION_CLASS_NAMES",
    "MNIST_FILES",
    "find_data_dir",
    "load_digits_as_mnist",
    "load_fashion_mnist",
    "load_for_demo",
    "load_mnist",
    "read_idx",
]

DATA_ENV_VAR = "TFONSPARK_DATA"
"""Environment variable naming a directory of MNIST-style idx files, used when ``--data`` is not."""

MNIST_FILES: dict[str, str] = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
"""The four files of an MNIST-style directory, without ``.gz``; each may be gzipped or not."""

DIGIT_CLASS_NAMES: tuple[str, ...] = tuple("0123456789")
FASHION_CLASS_NAMES: tuple[str, ...] = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)

_GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 1 << 16  # gzip input is inflated in chunks so a corrupt byte can be located
_IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype("u1"),
    0x09: np.dtype("i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_IMAGE_SIZE = 28  # MNIST's layout: the digit fills a 20x20 box centred in 28x28
_DIGITS_BOX = 20


@dataclass(frozen=True, eq=False, repr=False)
class Dataset:
    """Train and test images (uint8, N x rows x cols) with their uint8 labels."""

    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    class_names: tuple[str, ...] = DIGIT_CLASS_NAMES
    name: str = "MNIST"

    def __post_init__(self) -> None:
        for split in ("train", "test"):
            images, labels = getattr(self, f"{split}_images"), getattr(self, f"{split}_labels")
            if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
                raise ConfigError(
                    f"{split} images must be N x rows x cols with N labels. "
                    f"Received: images.shape={images.shape}, labels.shape={labels.shape}"
                )

    @property
    def num_classes(self) -> int:
        """How many classes the labels index into."""
        return len(self.class_names)

    @property
    def image_shape(self) -> tuple[int, int]:
        """(rows, cols) of one image."""
        rows, cols = self.train_images.shape[1:]
        return int(rows), int(cols)

    def __repr__(self) -> str:
        return (
            f"Dataset(name={self.name!r}, train={self.train_images.shape} "
            f"{self.train_images.dtype}, test={self.test_images.shape} "
            f"{self.test_images.dtype}, num_classes={self.num_classes})"
        )


# --------------------------------------------------------------------------- idx files


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Read one idx file, gzipped or not, into an array of its dtype and shape (native order)."""
    return _read_idx(Path(path))[0]


def _read_idx(path: Path) -> tuple[np.ndarray, bool]:
    """Read an idx file; also say whether it was gzipped (offsets then count inflated bytes)."""
    raw = _read_bytes(path)
    gzipped = raw[:2] == _GZIP_MAGIC
    data = _gunzip(raw, path) if gzipped else raw
    return _parse_idx(data, path, gzipped), gzipped


def _read_bytes(path: Path) -> bytearray:
    """The file's bytes in a writable buffer (so arrays viewing it are writable, uncopied)."""
    try:
        with open(path, "rb") as f:
            buf = bytearray(os.fstat(f.fileno()).st_size)
            del buf[f.readinto(buf) :]
    except FileNotFoundError as err:
        raise ConfigError(
            f"idx file not found: {path} (expected an MNIST-style idx file, gzipped or not, "
            f"such as {', '.join(f'{n}.gz' for n in MNIST_FILES.values())})"
        ) from err
    except IsADirectoryError as err:
        raise ConfigError(f"expected an idx file, got a directory: {path}") from err
    return buf


def _gunzip(data: bytearray, path: Path) -> bytearray:
    """Inflate every gzip member in ``data``; zero padding after the last one is allowed."""
    view = memoryview(data)
    out = bytearray()
    pos = 0
    while True:
        pos = _inflate_member(view, pos, out, path)
        rest = view[pos:]
        if not rest or bytes(rest).count(0) == len(rest):
            return out
        if rest[:2] != _GZIP_MAGIC:
            raise DataFormatError("unexpected bytes after the end of the gzip stream", path=str(path), offset=pos)


def _inflate_member(view: memoryview, pos: int, out: bytearray, path: Path) -> int:
    """Inflate the gzip member starting at ``pos`` into ``out``; return where it ended."""
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    for start in range(pos, len(view), _CHUNK):
        chunk = view[start : start + _CHUNK]
        before = inflater.copy()
        try:
            out += inflater.decompress(chunk)
        except zlib.error as err:
            offset = start + _locate_zlib_error(before, chunk)
            raise DataFormatError(f"corrupt gzip data ({err})", path=str(path), offset=offset) from err
        if inflater.eof:
            return start + len(chunk) - len(inflater.unused_data)
    raise DataFormatError("gzip stream ends early: the file is truncated", path=str(path), offset=len(view))


def _locate_zlib_error(inflater: zlib._Decompress, chunk: memoryview) -> int:
    """Replay ``chunk`` byte by byte to find the index of the byte zlib rejects."""
    for i in range(len(chunk)):
        try:
            inflater.decompress(chunk[i : i + 1])
        except zlib.error:
            return i
    return 0


def _parse_idx(data: bytearray, path: Path, gzipped: bool) -> np.ndarray:
    """Validate the idx header against the payload and view the payload as an array."""
    where = " (offset in the decompressed data)" if gzipped else ""

    def fail(message: str, offset: int) -> DataFormatError:
        return DataFormatError(message + where, path=str(path), offset=offset)

    size = len(data)
    if size < 4:
        raise fail(f"too short for an idx header: {size} bytes, need at least 4", size)
    if data[0] or data[1]:
        magic = int.from_bytes(data[:4], "big")
        raise fail(
            f"not an idx file: magic number 0x{magic:08X} does not start with 0x0000 "
            "(expected 0x0000, dtype code, number of dimensions)",
            0,
        )
    code, ndim = data[2], data[3]
    dtype = _IDX_DTYPES.get(code)
    if dtype is None:
        known = ", ".join(f"0x{c:02X} {d.name}" for c, d in _IDX_DTYPES.items())
        raise fail(f"unknown idx dtype code 0x{code:02X} (known: {known})", 2)
    if ndim == 0:
        raise fail("idx header declares 0 dimensions", 3)
    header = 4 + 4 * ndim
    if size < header:
        raise fail(f"truncated header: {ndim} dimensions need {header} bytes, found {size}", size)
    dims = struct.unpack_from(f">{ndim}I", data, 4)
    count = math.prod(dims)
    expected = count * dtype.itemsize
    found = size - header
    if found < expected:
        raise fail(
            f"truncated payload: dims {dims} of {dtype.name} need {expected} bytes after the "
            f"{header}-byte header, found {found}",
            size,
        )
    if found > expected:
        raise fail(
            f"{found - expected} unexpected bytes after the payload of dims {dims} of {dtype.name}",
            header + expected,
        )
    native = dtype.newbyteorder("=")
    if count == 0:
        return np.zeros(dims, dtype=native)
    array = np.frombuffer(data, dtype=dtype, count=count, offset=header).reshape(dims)
    return array if dtype.isnative else array.astype(native)


# --------------------------------------------------------------------------- MNIST directories


def load_mnist(
    data_dir: str | os.PathLike[str],
    *,
    class_names: tuple[str, ...] = DIGIT_CLASS_NAMES,
    name: str = "MNIST",
) -> Dataset:
    """Load the four MNIST-style idx files of ``data_dir`` (see :data:`MNIST_FILES`)."""
    directory = Path(data_dir)
    paths = _find_mnist_files(directory)
    arrays = {}
    for split in ("train", "test"):
        images_path, labels_path = paths[f"{split}_images"], paths[f"{split}_labels"]
        images = _read_images(images_path)
        labels = _read_labels(labels_path, len(class_names))
        if len(labels) != len(images):
            raise DataFormatError(
                f"{split} labels file holds {len(labels)} labels but {images_path} holds {len(images)} images",
                path=str(labels_path),
                offset=4,
            )
        arrays[f"{split}_images"], arrays[f"{split}_labels"] = images, labels
    if arrays["train_images"].shape[1:] != arrays["test_images"].shape[1:]:
        raise DataFormatError(
            f"test images are {arrays['test_images'].shape[1:]} but train images are "
            f"{arrays['train_images'].shape[1:]}",
            path=str(paths["test_images"]),
            offset=8,
        )
    return Dataset(**arrays, class_names=tuple(class_names), name=name)


def load_fashion_mnist(data_dir: str | os.PathLike[str]) -> Dataset:
    """Load Fashion-MNIST idx files: :func:`load_mnist` with the ten clothing class names."""
    return load_mnist(data_dir, class_names=FASHION_CLASS_NAMES, name="Fashion-MNIST")


def _find_mnist_files(directory: Path) -> dict[str, Path]:
    """Path of each of the four files; one error listing every missing name."""
    if not directory.is_dir():
        raise ConfigError(f"MNIST data directory does not exist or is not a directory: {directory}")
    found: dict[str, Path] = {}
    missing: list[str] = []
    for key, stem in MNIST_FILES.items():
        path = next((p for p in _candidates(directory, stem) if p.is_file()), None)
        if path is None:
            missing.append(f"{stem}[.gz]")
        else:
            found[key] = path
    if missing:
        raise ConfigError(_missing_files_message(directory, missing))
    return found


def _candidates(directory: Path, stem: str) -> list[Path]:
    """Accepted spellings: ``train-images-idx3-ubyte`` or ``train-images.idx3-ubyte``, ``.gz`` or not."""
    dotted = stem.replace("-idx", ".idx")
    return [directory / name for name in (f"{stem}.gz", stem, f"{dotted}.gz", dotted)]


def _missing_files_message(directory: Path, missing: list[str]) -> str:
    """Say what is missing, what is expected, and which subdirectory may have been meant."""
    expected = ", ".join(f"{stem}.gz" for stem in MNIST_FILES.values())
    message = (
        f"MNIST idx files missing from {directory}: {', '.join(missing)}. "
        f"Expected the four files {expected} (gzipped or not)"
    )
    stem = MNIST_FILES["train_images"]
    subdirs = sorted(
        p.name for p in directory.iterdir() if p.is_dir() and any(c.is_file() for c in _candidates(p, stem))
    )
    if subdirs:
        message += f"; subdirectories that have them: {', '.join(subdirs)}"
    return message


def _read_images(path: Path) -> np.ndarray:
    """An idx file that must hold uint8 images, N x rows x cols."""
    images, _ = _read_idx(path)
    if images.dtype != np.uint8 or images.ndim != 3:
        raise DataFormatError(
            f"expected uint8 images of shape (N, rows, cols), found {images.dtype} {images.shape}",
            path=str(path),
            offset=2,
        )
    return images


def _read_labels(path: Path, num_classes: int) -> np.ndarray:
    """An idx file that must hold N uint8 labels below ``num_classes``."""
    labels, gzipped = _read_idx(path)
    if labels.dtype != np.uint8 or labels.ndim != 1:
        raise DataFormatError(
            f"expected N uint8 labels, found {labels.dtype} {labels.shape}",
            path=str(path),
            offset=2,
        )
    bad = np.flatnonzero(labels >= num_classes)
    if bad.size:
        where = " (offset in the decompressed data)" if gzipped else ""
        raise DataFormatError(
            f"label {labels[bad[0]]} at index {bad[0]} is not below {num_classes}{where}",
            path=str(path),
            offset=8 + int(bad[0]),
        )
    return labels


# --------------------------------------------------------------------------- scikit-learn digits


def load_digits_as_mnist(*, test_fraction: float = 0.2, seed: int = 0) -> Dataset:
    """scikit-learn's bundled digits (1797 images, 8x8, 0-16) in MNIST's layout.

    Each image is scaled to 0-255, resized bilinearly to 20x20 and centred in 28x28 with a
    4-pixel black border, as MNIST centres its digits in a 20x20 box; so the same 28x28 uint8
    model runs on both. The split is stratified by class and depends only on ``seed``.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ConfigError(f"test_fraction must be in (0, 1). Received: test_fraction={test_fraction!r}")
    try:
        from sklearn.datasets import load_digits
    except ImportError as err:
        raise ImportError("load_digits_as_mnist needs scikit-learn: pip install 'tfonspark[demo]'") from err
    digits = load_digits()
    images = _digits_to_mnist_layout(np.asarray(digits.images))
    labels = np.asarray(digits.target).astype(np.uint8)
    train, test = _stratified_split(labels, test_fraction, seed)
    return Dataset(
        train_images=images[train],
        train_labels=labels[train],
        test_images=images[test],
        test_labels=labels[test],
        class_names=DIGIT_CLASS_NAMES,
        name="scikit-learn digits",
    )


def _digits_to_mnist_layout(images: np.ndarray) -> np.ndarray:
    """N x 8 x 8 values in 0-16 -> N x 28 x 28 uint8, digit resized to 20x20 and centred."""
    resize = _linear_resize_matrix(images.shape[1], _DIGITS_BOX)
    boxed = np.einsum("ij,njk,lk->nil", resize, images * (255.0 / 16.0), resize)
    pad = (_IMAGE_SIZE - _DIGITS_BOX) // 2
    out = np.zeros((len(images), _IMAGE_SIZE, _IMAGE_SIZE), dtype=np.uint8)
    out[:, pad : pad + _DIGITS_BOX, pad : pad + _DIGITS_BOX] = np.clip(np.rint(boxed), 0, 255)
    return out


def _linear_resize_matrix(src: int, dst: int) -> np.ndarray:
    """``dst x src`` matrix of linear-interpolation weights between pixel centres."""
    centres = np.clip((np.arange(dst) + 0.5) * (src / dst) - 0.5, 0, src - 1)
    low = np.floor(centres).astype(int)
    high = np.minimum(low + 1, src - 1)
    frac = centres - low
    matrix = np.zeros((dst, src))
    np.add.at(matrix, (np.arange(dst), low), 1.0 - frac)
    np.add.at(matrix, (np.arange(dst), high), frac)
    return matrix


def _stratified_split(labels: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted train and test indices, ``test_fraction`` of each class (at least one) to test."""
    rng = np.random.default_rng(seed)
    test: list[np.ndarray] = []
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        n_test = min(max(1, round(len(members) * test_fraction)), len(members) - 1)
        test.append(members[:n_test])
    test_idx = np.sort(np.concatenate(test))
    train_idx = np.setdiff1d(np.arange(len(labels)), test_idx)
    return train_idx, test_idx


# --------------------------------------------------------------------------- the demo's choice


def find_data_dir(explicit: str | os.PathLike[str] | None = None) -> Path | None:
    """The data directory: ``explicit`` (``--data``), else ``$TFONSPARK_DATA``, else None."""
    resolved = _resolve_data_dir(explicit)
    return None if resolved is None else resolved[0]


def _resolve_data_dir(explicit: str | os.PathLike[str] | None) -> tuple[Path, str] | None:
    """The data directory and the setting it came from."""
    if explicit is not None:
        return _existing_dir(explicit, "--data"), "--data"
    value = os.environ.get(DATA_ENV_VAR, "")
    if value:
        return _existing_dir(value, DATA_ENV_VAR), DATA_ENV_VAR
    return None


def _existing_dir(value: str | os.PathLike[str], setting: str) -> Path:
    """``value`` as a Path, which must be an existing directory."""
    if not os.fspath(value):
        raise ConfigError(f"the data directory must not be empty. Received: {setting}=''")
    path = Path(value).expanduser()
    if not path.is_dir():
        raise ConfigError(
            f"the data directory does not exist or is not a directory. Received: {setting}={os.fspath(value)!r}"
        )
    return path


def load_for_demo(data: str | os.PathLike[str] | None = None) -> tuple[Dataset, str]:
    """The demo's dataset and a line saying what was used and why.

    idx files from :func:`find_data_dir` when it finds a directory (Fashion-MNIST class names
    when the directory's name contains ``fashion``), else :func:`load_digits_as_mnist`.
    """
    resolved = _resolve_data_dir(data)
    if resolved is None:
        dataset = load_digits_as_mnist()
        return dataset, (
            f"scikit-learn digits: {_sizes(dataset)}, 8x8 upsampled to 28x28 (no --data given and {DATA_ENV_VAR} unset)"
        )
    path, setting = resolved
    if "fashion" in path.resolve().name.lower():
        dataset = load_fashion_mnist(path)
    else:
        dataset = load_mnist(path)
    return dataset, f"{dataset.name} idx files from {path} (from {setting}): {_sizes(dataset)}"


def _sizes(dataset: Dataset) -> str:
    """E.g. ``60000 train / 10000 test images``."""
    return f"{len(dataset.train_images)} train / {len(dataset.test_images)} test images"
