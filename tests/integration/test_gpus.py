"""GPU assignment on real Spark, without GPUs: fake discovery scripts and a fake nvidia-smi.

As Spark's own TorchDistributor tests do, a discovery script prints ``{"name": "gpu",
"addresses": [...]}``. Spark's workers on one host each run it and, if it printed the same list
every time, would hand both executors the same addresses; ours claims a fresh pair per call
(``mkdir`` is atomic), so the two executors get disjoint GPUs, as on two real hosts. The
standalone scenario is one real host: one worker JVM with four GPUs (``SPARK_WORKER_OPTS``)
running both executors, which Spark must give disjoint pairs.

GPU resources are fixed when a SparkContext starts, so those scenarios run in a subprocess (this
file is its script, with a deadline), one SparkContext after another. The nvidia-smi fallback runs
on the shared ``sc``: the fake is put on the executors' PATH through ``sc.environment``, which
PySpark ships with every task (as ``spark.executorEnv.PATH`` would). The TF processes'
``map_fun`` does not import TensorFlow: the wiring is what is under test.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tfonspark.testing import fake_nvidia_smi

if __name__ != "__main__":  # pytest imports us; as the subprocess's script we are __main__, pickled by value
    from .conftest import by_value

    by_value(__name__)

pytestmark = [pytest.mark.gpu, pytest.mark.spark]

SCRIPT_TIMEOUT_SECS = 280  # under pytest-timeout's 300 s for the first test (setup included)
PAIR_SCRIPT = """#!/bin/sh
# a Spark GPU discovery script handing out a fresh pair of addresses per call, as two hosts would
claims="$(dirname "$0")/claims"
mkdir -p "$claims"
i=0
while ! mkdir "$claims/$i" 2>/dev/null; do i=$((i + 1)); done
echo "{\\"name\\": \\"gpu\\", \\"addresses\\": [\\"$((2 * i))\\", \\"$((2 * i + 1))\\"]}"
"""
FOUR_GPUS_SCRIPT = """#!/bin/sh
echo '{"name": "gpu", "addresses": ["0", "1", "2", "3"]}'
"""
FAKE_GPUS, FAKE_BUSY = 5, (1,)  # the fake nvidia-smi's host: 5 GPUs, GPU 1 runs something


def _executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


# ---- what runs in the subprocess ---------------------------------------------------------------
def write_gpus(args: dict, ctx: Any) -> None:
    """map_fun: what this TF process was given, and on which executor (its working directory)."""
    seen = {"cuda": os.environ.get("CUDA_VISIBLE_DEVICES"), "ctx": ctx.gpus, "executor_dir": ctx.working_dir}
    (Path(args["dir"]) / f"{ctx.job_name}-{ctx.task_index}.json").write_text(json.dumps(seen))


def _task_gpus(_: Any) -> Any:
    from pyspark import TaskContext

    task = TaskContext.get()
    assert task is not None
    yield os.getcwd(), list(task.resources()["gpu"].addresses)


def _run_nodes(sc: Any, out: Path, **tf_args: Any) -> dict[str, Any]:
    """Start and stop a 2-node cluster; what each node saw, or the error ``run`` raised."""
    import tfonspark

    out.mkdir(parents=True)
    print(f"{time.strftime('%X')} scenario {out.name}", file=sys.stderr, flush=True)
    try:
        cluster = tfonspark.run(sc, write_gpus, {"dir": str(out), **tf_args}, 2, reservation_timeout=90)
        cluster.shutdown(timeout=60)
    except Exception as exc:
        return {"error": type(exc).__name__, "message": str(exc)}
    found = {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*.json"))}
    for info in cluster.cluster_info:  # the driver knows what each node got
        found[f"{info['job_name']}-{info['task_index']}"]["driver"] = info["gpus"]
    return found


def _gpu_conf(script: Path | None) -> dict[str, str]:
    conf = {"spark__executor__resource__gpu__amount": "2", "spark__task__resource__gpu__amount": "2"}
    if script is not None:  # local-cluster's workers live in the driver JVM and take the app's conf
        conf.update(
            {"spark__worker__resource__gpu__amount": "2", "spark__worker__resource__gpu__discoveryScript": str(script)}
        )
    return conf


def _local_cluster(manager: Any, work: Path) -> Any:
    """Two workers in the driver JVM, one executor each; each worker's discovery claims a fresh pair."""
    return manager.get("local-cluster[2,1,1024]", **_gpu_conf(_executable(work / "pairs.sh", PAIR_SCRIPT)))


def _standalone(manager: Any, work: Path) -> Any:
    """One worker JVM with 4 GPUs (SPARK_WORKER_OPTS, as on a real host) running both executors:
    Spark itself must give them disjoint pairs."""
    from pyspark import SparkContext

    from tfonspark.testing.spark import StandaloneCluster, spark_conf

    script = _executable(work / "four.sh", FOUR_GPUS_SCRIPT)
    os.environ["SPARK_WORKER_OPTS"] = (
        f"-Dspark.worker.resource.gpu.amount=4 -Dspark.worker.resource.gpu.discoveryScript={script}"
    )
    manager._standalone = StandaloneCluster(workers=1, cores=2, memory="2g").start()  # stopped with the manager
    extra = {"spark__cores__max": "2", "spark__executor__cores": "1", "spark__executor__memory": "512m"}
    manager.sc = SparkContext(conf=spark_conf(manager._standalone.url, "tfonspark-gpus", **extra, **_gpu_conf(None)))
    deadline = time.monotonic() + 120
    while manager.sc._jsc.sc().getExecutorMemoryStatus().size() < 3:  # the driver + 2 executors
        if time.monotonic() > deadline:
            raise TimeoutError(f"the standalone worker started fewer than 2 GPU executors in 120 s: {work}")
        time.sleep(0.2)
    return manager.sc


def _spark_gpu_scenarios(manager: Any, kind: str, work: Path) -> dict[str, Any]:
    work.mkdir(parents=True)
    print(f"{time.strftime('%X')} starting {kind}", file=sys.stderr, flush=True)
    sc = _local_cluster(manager, work) if kind == "local-cluster" else _standalone(manager, work)
    found = {"task_gpus": dict(sc.parallelize(range(2), 2).barrier().mapPartitions(_task_gpus).collect())}
    found["all"] = _run_nodes(sc, work / "all")
    if kind == "local-cluster":
        found["one"] = _run_nodes(sc, work / "one", num_gpus=1)
        found["too_many"] = _run_nodes(sc, work / "too_many", num_gpus=3)
        found["handed"] = [f"{2 * int(c)},{2 * int(c) + 1}" for c in sorted(os.listdir(work / "claims"))]
    else:
        found["handed"] = ["0,1", "2,3", "0,2", "0,3", "1,2", "1,3"]  # any pair of the worker's four
    manager.stop()
    return found


def _main(kinds: list[str], work: Path) -> None:
    from tfonspark.testing import SparkManager

    manager = SparkManager.instance()
    results: dict[str, Any] = {}
    try:
        for kind in kinds:
            results[kind] = _spark_gpu_scenarios(manager, kind, work / kind)
    finally:
        manager.stop()
    (work / "results.json").write_text(json.dumps(results))


# ---- the tests --------------------------------------------------------------------------------
def _scenarios(kinds: list[str], tmp_path: Path) -> dict[str, Any]:
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {k: v for k, v in os.environ.items() if k != "SPARK_WORKER_OPTS"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    try:
        done = subprocess.run(
            [sys.executable, __file__, ",".join(kinds), str(tmp_path)],
            env=env,
            capture_output=True,
            text=True,
            timeout=SCRIPT_TIMEOUT_SECS,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the GPU scenarios {kinds} did not finish within {SCRIPT_TIMEOUT_SECS}s: {exc.stderr!r:.3000}")
    assert done.returncode == 0, f"the GPU scenarios {kinds} failed:\n{done.stderr[-6000:]}"
    return json.loads((tmp_path / "results.json").read_text())


@pytest.fixture(scope="module")
def spark_gpus(request, tmp_path_factory) -> dict[str, Any]:
    """One subprocess for every Spark-GPU scenario selected: each SparkContext costs JVM start-up."""
    selected = {item.name for item in request.session.items if item.module is request.module}
    kinds = ["local-cluster"] + (["standalone"] if "test_standalone_workers_hand_out_disjoint_gpus" in selected else [])
    return _scenarios(kinds, tmp_path_factory.mktemp("gpus"))


def _assert_nodes_got_their_tasks_gpus(found: dict[str, Any]) -> None:
    handed = set(found["handed"])
    tasks = {d: ",".join(a) for d, a in found["task_gpus"].items()}
    nodes = found["all"]
    assert set(nodes) == {"worker-0", "worker-1"}, nodes
    got = {n: s["cuda"] for n, s in nodes.items()}
    assert not set(got["worker-0"].split(",")) & set(got["worker-1"].split(",")), got  # disjoint
    assert set(got.values()) <= handed, (got, handed)
    for name, seen in nodes.items():  # exactly its own task's addresses, in CUDA_VISIBLE_DEVICES and ctx.gpus
        assert seen["cuda"] == tasks[seen["executor_dir"]], (name, seen, tasks)
        assert seen["ctx"] == seen["cuda"].split(",") == seen["driver"], seen


def test_executors_get_disjoint_spark_gpus(spark_gpus):
    _assert_nodes_got_their_tasks_gpus(spark_gpus["local-cluster"])


def test_num_gpus_limits_the_spark_gpus(spark_gpus):
    found = spark_gpus["local-cluster"]
    assert set(found["one"]) == {"worker-0", "worker-1"}, found["one"]
    for seen in found["one"].values():
        first = found["task_gpus"][seen["executor_dir"]][0]
        assert (seen["cuda"], seen["ctx"]) == (first, [first]), seen


def test_more_gpus_than_the_task_has_is_a_clear_error(spark_gpus):
    found = spark_gpus["local-cluster"]["too_many"]
    assert found.get("error") == "ConfigError", found
    for words in (
        "tf_args.num_gpus=3",
        "2 GPU(s)",
        "spark.task.resource.gpu.amount",
        "spark.executor.resource.gpu.amount",
    ):
        assert words in found["message"], found


@pytest.mark.cluster
def test_standalone_workers_hand_out_disjoint_gpus(spark_gpus):
    _assert_nodes_got_their_tasks_gpus(spark_gpus["standalone"])


# ---- the nvidia-smi fallback, on the shared local-cluster (no Spark GPU resources) -------------
@pytest.fixture
def fake_smi_on_executors(sc, tmp_path, monkeypatch):
    """The fake nvidia-smi first on PATH of the Python workers of the jobs started from now on."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_nvidia_smi(bin_dir, FAKE_GPUS, FAKE_BUSY)
    monkeypatch.setitem(sc.environment, "PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return sc


def test_nodes_on_one_host_take_disjoint_free_gpus_by_nvidia_smi(fake_smi_on_executors, tmp_path, no_leftovers):
    found = _run_nodes(fake_smi_on_executors, tmp_path / "default")
    # the fake host has GPUs 0-4 with 1 busy: one GPU each (TFoS's default), in turn on the host
    assert {n: (s.get("cuda"), s.get("ctx")) for n, s in found.items()} == {
        "worker-0": ("0", ["0"]),
        "worker-1": ("2", ["2"]),
    }, found


def test_more_gpus_than_the_host_has_is_a_clear_error(fake_smi_on_executors, tmp_path, no_leftovers):
    found = _run_nodes(fake_smi_on_executors, tmp_path / "too_many", num_gpus=6)
    assert found.get("error") == "ConfigError", found
    for words in ("tf_args.num_gpus=6", "this host has 5 GPU(s)", "spark.executor.resource.gpu.amount", "num_gpus=0"):
        assert words in found["message"], found


if __name__ == "__main__":
    _main(sys.argv[1].split(","), Path(sys.argv[2]))
