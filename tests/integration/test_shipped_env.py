"""Executors that run a shipped Python, not the driver's (issue 45, item 5).

On the multi-host cluster the multi-host tests share (``hosts_fixture.py``: a driver host, a
master host, three worker hosts) the driver program is submitted as users submit to YARN:
``spark-submit --archives env.tar.gz#env --conf spark.pyspark.python=./env/bin/python``, on two
executors, the archive a virtualenv packed
with ``venv-pack``. Every executor unpacks it into its own work directory, and the nodes' TF
processes must run that interpreter (``sys.prefix`` inside the unpacked archive), never the
driver's virtualenv, which the hosts could reach on the shared filesystem but are not told of.

The environment shipped is tfonspark and its dependencies without TensorFlow (420 MB, 145 MB
packed at gzip level 1 in about 10 s): the checkout's virtualenv holds TensorFlow and the test tools (3.3 GB; its runtime part,
``pip install 'tfonspark[tf]'``, is 1.8 GB, 475 MB packed in 56 s and 40 s to unpack on each
executor), too slow to ship in a test. The nodes' ``map_fun`` here imports no TensorFlow. The
environment's dependencies are installed once into ``build/shipped-env/deps-<hash>`` (the
hash of the driver's versions of them) and kept; each session copies it, installs the working
tree's tfonspark into the copy and packs that (about 30 s; the first build of the dependencies
about 45 s more).

Then the two ways an executor's Python cannot run the nodes, each of which must fail within
seconds with ``ExecutorEnvironmentError`` naming the Python the executor ran and how to ship one:
a tfonspark of another version than the driver's, and one host's Python without tfonspark while
the other executor's node has started and waits for it.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tfonspark.testing import spark_home
from tfonspark.testing.hosts import Hosts

pytestmark = [pytest.mark.hosts, pytest.mark.spark]

REPO = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("shipped_env_driver.py")
ROWS = 4_000
CACHE = REPO / "build" / "shipped-env"


def _requirements() -> list[str]:
    """tfonspark's own dependencies, pinned to the driver's versions of them."""
    requires = importlib.metadata.requires("tfonspark") or []
    names = [re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0] for r in requires if "extra ==" not in r]
    return [f"{name}=={importlib.metadata.version(name)}" for name in names]


def _pip(python: Path, *args: str) -> None:
    """``pip install`` into the environment of ``python``, with this virtualenv's pip."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]


def _deps_env() -> Path:
    """A virtualenv (no pip) with tfonspark's dependencies and not tfonspark: built once, kept."""
    pins = _requirements()
    key = hashlib.sha256(json.dumps([sys.version, pins]).encode()).hexdigest()[:12]
    env = CACHE / f"deps-{key}"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session may be building it
        if not (env / ".complete").exists():
            shutil.rmtree(env, ignore_errors=True)
            subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(env)], check=True)
            _pip(env / "bin" / "python", *pins)
            (env / ".complete").touch()
    return env


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The packed environment (tfonspark from the working tree) and a Python without tfonspark."""
    pytest.importorskip("venv_pack")
    started = time.monotonic()
    base = _deps_env()
    built = time.monotonic()
    work = tmp_path_factory.mktemp("shipped-env")
    env, source = work / "env", work / "source"
    shutil.copytree(base, env, symlinks=True)
    (env / ".complete").unlink()
    shutil.copytree(REPO / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    _pip(env / "bin" / "python", "--no-deps", str(source))
    installed = time.monotonic()
    archive = work / "env.tar.gz"
    venv_pack = Path(sys.executable).with_name("venv-pack")
    subprocess.run(
        [str(venv_pack), "-q", "--compress-level", "1", "-p", str(env), "-o", str(archive)], check=True, timeout=600
    )
    packed = time.monotonic()
    print(
        f"shipped env: deps {built - started:.1f}s, tfonspark {installed - built:.1f}s, packed "
        f"{archive.stat().st_size / 2**20:.0f} MiB in {packed - installed:.1f}s"
    )
    return {"archive": archive, "without_tfonspark": base / "bin" / "python", "env": env}


def _submit(
    hosts: Hosts, python: str, args: list[str], archives: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """``spark-submit`` of the driver program on the driver host, the executors running ``python``."""
    argv = [
        os.path.join(spark_home(), "bin", "spark-submit"),
        "--master",
        f"spark://{hosts.master.address}:7077",
        "--total-executor-cores",
        "2",
        "--executor-cores",
        "1",
        "--executor-memory",
        "768m",
        "--conf",
        f"spark.pyspark.driver.python={sys.executable}",
        "--conf",
        f"spark.pyspark.python={python}",
        "--conf",
        "spark.ui.enabled=false",
        *(["--archives", ",".join(archives)] if archives else []),
        str(DRIVER),
        *args,
    ]
    # nothing of the driver's Python reaches the executors but what spark-submit is told
    env = {"PYSPARK_PYTHON": python, "PYTHONPATH": "", "TF_CPP_MIN_LOG_LEVEL": "2"}
    return hosts.run(hosts.driver, argv, timeout=300, env=env)


def _outcome(done: subprocess.CompletedProcess[str], out: Path) -> dict:
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads((out / "driver.json").read_text())


def test_the_nodes_run_the_shipped_python_and_refuse_another_tfonspark_version(hosts, shipped, tmp_path):
    started = time.monotonic()
    done = _submit(hosts, "./env/bin/python", ["train", str(tmp_path), str(ROWS)], (f"{shipped['archive']}#env",))
    driver = _outcome(done, tmp_path)
    nodes = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("node-*.json"))]
    mismatch = driver["mismatch"]
    print(
        f"spark-submit with the shipped env: {time.monotonic() - started:.1f}s in all, run+train+shutdown "
        f"{driver['train_s']:.1f}s; another version refused after {mismatch['seconds']:.1f}s"
    )

    assert driver["python_exec"] == "./env/bin/python" and driver["driver_python"] == sys.executable
    # the examples' spark_context took the submitted master, and the driver host's own address
    assert driver["master"] == f"spark://{hosts.master.address}:7077", driver
    assert driver["driver_host"] in (hosts.driver.address, hosts.driver.name), driver
    assert driver["fed"] == ROWS
    seen = Counter(i for node in nodes for i in node["ids"])
    assert len(nodes) == 2 and sorted(seen) == list(range(ROWS)) and set(seen.values()) == {1}
    driver_prefix = os.path.realpath(sys.prefix)
    for node in nodes:
        unpacked = os.path.join(node["cwd"], "env")  # the executor's work dir: the archive's link
        assert node["executable"] == os.path.join(unpacked, "bin", "python"), node
        assert os.path.realpath(node["prefix"]) != driver_prefix, node
        assert node["prefix"] in (unpacked, os.path.realpath(unpacked)), node
        for module in ("tfonspark", "numpy"):
            assert os.path.realpath(node[module]).startswith(os.path.realpath(unpacked) + os.sep), node
        assert node["supervisor"] == node["executable"], node  # the supervisor runs it too
        assert not node["tensorflow_installed"], node
    on = {n["host"] for n in nodes}  # two executors (--total-executor-cores 2) of the three worker hosts
    assert len(on) == 2 and on <= {h.name for h in hosts.workers}, on

    assert mismatch["type"] == "ExecutorEnvironmentError" and "ConfigError" in mismatch["classes"], mismatch
    assert mismatch["seconds"] < 20, mismatch
    text = mismatch["error"]
    assert f"'{driver['driver_version']}'" in text and "'0.0.1+other'" in text, text  # both versions named
    assert mismatch["attrs"]["executor_version"] == driver["driver_version"], mismatch
    assert "/env/bin/python" in mismatch["attrs"]["python"], mismatch
    assert "--archives env.tar.gz#env --conf spark.pyspark.python=./env/bin/python" in text, text


_ONE_HOST_WITHOUT = """#!/bin/sh
# spark.pyspark.python of the executors: the first host to start a Python has no tfonspark, the others the driver's
if mkdir "{marker}.lock" 2>/dev/null; then hostname > "{marker}.tmp" && mv "{marker}.tmp" "{marker}"; fi
while [ ! -s "{marker}" ]; do sleep 0.05; done
if [ "$(hostname)" = "$(cat "{marker}")" ]; then exec "{without}" "$@"; fi
exec "{driver}" "$@"
"""


def test_one_host_whose_python_lacks_tfonspark_fails_at_once_naming_it(hosts, shipped, tmp_path):
    """One executor without tfonspark, the other with it: the node that came must not hold the
    reservation for reservation_timeout (120 s here); the error names the executor that lacks it."""
    without = str(shipped["without_tfonspark"])  # as if installed on that host, without tfonspark
    wrapper = tmp_path / "mixed-python"
    wrapper.write_text(_ONE_HOST_WITHOUT.format(marker=tmp_path / "bad-host", without=without, driver=sys.executable))
    wrapper.chmod(0o755)
    done = _submit(hosts, str(wrapper), ["missing", str(tmp_path)])
    missing = _outcome(done, tmp_path)["missing"]
    bad_host = (tmp_path / "bad-host").read_text().strip()
    print(f"one executor Python without tfonspark (on {bad_host}): {missing['type']} after {missing['seconds']:.1f}s")
    assert missing["type"] == "ExecutorEnvironmentError", missing
    assert missing["seconds"] < 20, missing
    text = missing["error"]
    assert "ModuleNotFoundError: No module named 'tfonspark'" in text and "(1 node task)" in text, text
    assert f"ran '{without}'" in text and f"spark.pyspark.python='{wrapper}'" in text, text
    assert "--archives env.tar.gz#env" in text and "install tfonspark" in text, text
    assert missing["attrs"]["python"] == without and missing["attrs"]["executor_version"] == "", missing
    assert missing["attrs"]["host"] == bad_host and bad_host in {h.name for h in hosts.workers}, missing
    # TFParallel's instances, in a barrier stage: the one that cannot start still takes part in the
    # barrier (the other is not left in it), and the job's error is the same
    parallel = _outcome(done, tmp_path)["parallel"]
    print(f"TFParallel there: {parallel['type']} after {parallel['seconds']:.1f}s")
    assert parallel["type"] == "ExecutorEnvironmentError" and parallel["seconds"] < 30, parallel
    assert f"ran '{without}'" in parallel["error"] and parallel["attrs"]["host"] == bad_host, parallel
