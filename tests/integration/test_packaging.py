"""The wheel fits users' clusters: it brings no TensorFlow and no pyspark of its own.

A GPU cluster's user has ``tensorflow`` (or ``tensorflow[and-cuda]``) and the cluster's own
Spark; a hard ``tensorflow-cpu`` or ``pyspark`` requirement would install a second, conflicting
one. These tests build the wheel, read its metadata, and let pip resolve an install into a fresh
virtualenv that already holds a ``tensorflow`` distribution (``--dry-run``: nothing is installed
but the stand-in). They need the package index, as ``make test`` does.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 600

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(REPO)],
        check=True,
        timeout=TIMEOUT,
    )
    (found,) = out.glob("tfonspark-*.whl")
    return found


def _metadata(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        return zf.read(name).decode().splitlines()


def test_tensorflow_and_pyspark_are_extras_and_the_license_is_spdx(wheel):
    lines = _metadata(wheel)
    requires = [line.split(":", 1)[1].strip() for line in lines if line.startswith("Requires-Dist:")]
    hard = [r for r in requires if "extra ==" not in r]
    assert not [r for r in hard if r.split()[0].split(";")[0].lower().startswith(("tensorflow", "pyspark"))], hard
    assert any(r.startswith("pyspark") and 'extra == "spark"' in r for r in requires), requires
    assert any(r.startswith("tensorflow") and 'extra == "tf"' in r for r in requires), requires
    assert "License-Expression: Apache-2.0" in lines


def _fake_tensorflow(directory: Path) -> Path:
    """A ``tensorflow`` 2.21.0 distribution with no files: what pip sees of a user's GPU build."""
    path = directory / "tensorflow-2.21.0-py3-none-any.whl"
    info = "tensorflow-2.21.0.dist-info"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: tensorflow\nVersion: 2.21.0\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")
    return path


def test_pip_adds_no_tensorflow_to_a_venv_that_has_one(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=TIMEOUT)
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    subprocess.run([*pip, "install", "-q", "--no-index", str(_fake_tensorflow(tmp_path))], check=True, timeout=TIMEOUT)
    report = tmp_path / "report.json"
    subprocess.run(
        [*pip, "install", "-q", "--dry-run", "--report", str(report), str(wheel)],
        check=True,
        timeout=TIMEOUT,
    )
    planned = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    assert "tfonspark" in planned
    assert not {name for name in planned if name.startswith(("tensorflow", "pyspark", "tf-keras"))}, planned


def test_the_wheel_carries_the_optional_c_packer_where_a_compiler_is(wheel):
    """``wire/_pack.c`` is built into the (platform) wheel, its source left out; without a C
    compiler the build goes on without it (``optional = true`` in pyproject.toml)."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler here")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    assert [n for n in names if n.startswith("tfonspark/wire/_pack.") and n.endswith(".so")], names
    assert not [n for n in names if n.endswith(".c")]
    assert not wheel.name.endswith("-none-any.whl")  # a platform wheel
