"""GPU assignment (executor/gpus.py): Spark's task resources, tf_args.num_gpus, the nvidia-smi
fallback, Kubernetes, the CPU, and the errors that name the settings. No JVM, no GPU: nvidia-smi
is a fake (a function here, a script on PATH for the real supervisors of the last tests)."""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import types
from pathlib import Path

import numpy as np
import pytest

import tfonspark
from tfonspark.config import NodeConfig
from tfonspark.errors import ConfigError, NodeFailed
from tfonspark.executor import gpus
from tfonspark.testing import FakeSparkContext, LocalLauncher, fake_nvidia_smi
from tfonspark.tfprocess.context import NodeContext

pytestmark = pytest.mark.gpu

SPEC_ONE_HOST = {"worker": ["10.0.0.1:5000", "10.0.0.1:5001"]}


class FakeSmi:
    """nvidia-smi answering the two queries gpus.py makes; ``busy`` may change between calls."""

    def __init__(self, count: int = 4, busy: tuple[int, ...] = (), missing: bool = False) -> None:
        self.count = count
        self.busy = set(busy)
        self.missing = missing
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, args) -> str:
        self.calls.append(tuple(args))
        if self.missing:
            raise FileNotFoundError("nvidia-smi")
        if "--query-gpu=index,uuid" in args:
            return "".join(f"{i}, GPU-{i:04d}-uuid\n" for i in range(self.count))
        if "--query-compute-apps=gpu_uuid" in args:
            return "".join(f"GPU-{i:04d}-uuid\n" for i in sorted(self.busy))
        raise AssertionError(f"unexpected nvidia-smi arguments {args}")


class Clock:
    """A fake monotonic clock that ``sleep`` advances: busy waits cost no real time."""

    def __init__(self, smi: FakeSmi | None = None, free_after: float | None = None) -> None:
        self.now = 0.0
        self.smi = smi
        self.free_after = free_after

    def __call__(self) -> float:
        return self.now

    def sleep(self, secs: float) -> None:
        self.now += secs
        if self.smi is not None and self.free_after is not None and self.now >= self.free_after:
            self.smi.busy.clear()


@pytest.fixture(autouse=True)
def _cpu_not_yet_said(monkeypatch):
    monkeypatch.setattr(gpus._Said, "cpu", False)


def _assign(spark=(), num_gpus=None, spec=None, job="worker", index=0, environ=None, smi=None, clock=None):
    clock = clock or Clock()
    return gpus.assign(
        list(spark),
        num_gpus,
        spec or SPEC_ONE_HOST,
        job,
        index,
        environ or {},
        smi=smi or FakeSmi(),
        sleep=clock.sleep,
        clock=clock,
    )


# ---- tf_args.num_gpus ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("tf_args", "expected"),
    [
        (argparse.Namespace(num_gpus=2), 2),
        (argparse.Namespace(num_gpus=0), 0),
        (argparse.Namespace(num_gpus="3"), 3),  # argparse without type=int
        (argparse.Namespace(num_gpus=None), None),
        (argparse.Namespace(batch_size=8), None),
        ({"num_gpus": 1}, 1),
        ({"other": 1}, None),
        (["--num_gpus", "2"], None),  # argv lists are not parsed, as in TFoS
        ("num_gpus", None),
        (None, None),
        (types.SimpleNamespace(num_gpus=4), 4),
        ({"num_gpus": np.int64(2)}, 2),
    ],
)
def test_requested_gpus_reads_tf_args_as_tfos(tf_args, expected):
    assert gpus.requested_gpus(tf_args) == expected


@pytest.mark.parametrize("bad", [-1, True, 1.5, "two"])
def test_requested_gpus_rejects_nonsense(bad):
    with pytest.raises(ConfigError, match=r"tf_args.num_gpus must be a whole number >= 0.*Received"):
        gpus.requested_gpus(argparse.Namespace(num_gpus=bad))


def test_node_config_carries_num_gpus_through_json():
    config = NodeConfig("c", "127.0.0.1", 1, "ab" * 32, num_gpus=2)
    assert NodeConfig.from_json(config.to_json()).num_gpus == 2
    assert NodeConfig.from_json(NodeConfig("c", "h", 1, "ab" * 32).to_json()).num_gpus is None
    with pytest.raises(ConfigError, match="num_gpus"):
        NodeConfig("c", "h", 1, "ab" * 32, num_gpus=-2)


def test_run_rejects_a_bad_num_gpus_before_starting_anything():
    with pytest.raises(ConfigError, match="tf_args.num_gpus"):
        tfonspark.run(FakeSparkContext(), print, argparse.Namespace(num_gpus=-1), 1, launcher=LocalLauncher())


# ---- Spark's task resources ------------------------------------------------------------------
def test_spark_addresses_from_task_resources():
    info = types.SimpleNamespace(name="gpu", addresses=["2", "3"])
    assert gpus.spark_addresses({"gpu": info}) == ["2", "3"]
    assert gpus.spark_addresses({}) == []
    assert gpus.spark_addresses({"fpga": info}) == []


def test_spark_gpus_are_used_as_given_and_nvidia_smi_is_not_asked():
    smi = FakeSmi(count=8)
    assert _assign(spark=["2", "3"], smi=smi) == ["2", "3"]
    assert _assign(spark=["2", "3"], num_gpus=2, smi=smi) == ["2", "3"]
    assert smi.calls == []


def test_num_gpus_limits_the_spark_gpus_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="tfonspark.executor.gpus"):
        assert _assign(spark=["4", "5", "6"], num_gpus=2) == ["4", "5"]
    assert "uses 2 of the 3 GPUs Spark gave its task" in caplog.text
    assert _assign(spark=["4", "5"], num_gpus=0) == []


def test_more_gpus_than_the_task_has_is_an_error_naming_the_settings():
    for call in (
        lambda: _assign(spark=["0", "1"], num_gpus=3),
        lambda: gpus.check_request(["0", "1"], 3, {}, smi=FakeSmi()),
    ):
        with pytest.raises(ConfigError) as info:
            call()
        text = str(info.value)
        assert "tf_args.num_gpus=3" in text and "2 GPU(s) (addresses 0,1)" in text
        assert "spark.task.resource.gpu.amount" in text and "spark.executor.resource.gpu.amount" in text


# ---- the nvidia-smi fallback ---------------------------------------------------------------
def test_nodes_on_one_host_take_disjoint_free_gpus():
    smi = FakeSmi(count=4, busy=(1,))
    first = _assign(index=0, smi=smi)
    second = _assign(index=1, smi=smi)
    assert (first, second) == (["0"], ["2"])  # one GPU each by default, GPU 1 is busy


def test_num_gpus_sets_how_many_each_node_takes():
    smi = FakeSmi(count=5, busy=(1,))
    spec = {"ps": ["10.0.0.1:4000"], "worker": ["10.0.0.1:5000", "10.0.0.2:5000", "10.0.0.1:5001"]}
    assert _assign(num_gpus=2, spec=spec, job="ps", index=0, smi=smi) == ["0", "2"]
    assert _assign(num_gpus=2, spec=spec, job="worker", index=0, smi=smi) == ["3", "4"]
    assert _assign(num_gpus=2, spec=spec, job="worker", index=1, smi=smi) == ["0", "2"]  # other host


def test_more_nodes_than_free_gpus_share_them_with_a_warning(caplog):
    smi = FakeSmi(count=2)
    spec = {"worker": [f"10.0.0.1:{5000 + i}" for i in range(3)]}
    with caplog.at_level(logging.WARNING, logger="tfonspark.executor.gpus"):
        assert [_assign(spec=spec, index=i, smi=smi) for i in range(3)] == [["0"], ["1"], ["0"]]
    assert "GPUs are shared between nodes" in caplog.text


def test_local_index_compares_whole_host_names():
    spec = {"chief": ["10.0.0.12:1"], "worker": ["10.0.0.1:2", "10.0.0.12:3", "10.0.0.1:4"]}
    assert gpus.local_index(spec, "worker", 2) == 1  # TFoS's prefix match would count 10.0.0.12
    assert gpus.local_index(spec, "worker", 1) == 1
    assert gpus.local_index(spec, "chief", 0) == 0
    assert gpus.local_index({"worker": ["[::1]:5", "[::1]:6"]}, "worker", 1) == 1


def test_no_nvidia_smi_means_cpu_said_once(caplog):
    with caplog.at_level(logging.INFO, logger="tfonspark.executor.gpus"):
        assert _assign(smi=FakeSmi(missing=True)) == []
        assert _assign(index=1, smi=FakeSmi(missing=True)) == []
    said = [r.getMessage() for r in caplog.records if "runs on the CPU" in r.getMessage()]
    assert said == [
        "no GPU for this node (Spark assigned none and nvidia-smi is not on PATH): TensorFlow runs on the CPU"
    ]


def test_num_gpus_zero_means_cpu_without_asking_nvidia_smi():
    smi = FakeSmi(count=4)
    assert _assign(num_gpus=0, smi=smi) == []
    gpus.check_request([], 0, {}, smi=smi)
    assert smi.calls == []


def test_kubernetes_never_uses_nvidia_smi():
    smi = FakeSmi(count=4)
    k8s = {gpus.K8S_ENV: "10.1.2.3"}
    assert _assign(environ=k8s, smi=smi) == []
    with pytest.raises(ConfigError, match="Kubernetes.*spark.executor.resource.gpu.amount"):
        _assign(num_gpus=1, environ=k8s, smi=smi)
    with pytest.raises(ConfigError, match="Kubernetes"):
        gpus.check_request([], 1, k8s, smi=smi)
    assert smi.calls == []
    assert _assign(spark=["7"], environ=k8s, smi=smi) == ["7"]  # Spark's GPUs are used on Kubernetes


@pytest.mark.parametrize(
    ("smi", "reason"),
    [
        (FakeSmi(missing=True), "nvidia-smi is not on PATH"),
        (FakeSmi(count=0), "nvidia-smi lists no GPU"),
        (FakeSmi(count=4), "this host has 4 GPU(s)"),
    ],
)
def test_more_gpus_than_the_host_has_is_an_early_error(smi, reason):
    with pytest.raises(ConfigError) as info:
        gpus.check_request([], 5, {}, smi=smi)
    text = str(info.value)
    assert "tf_args.num_gpus=5" in text and reason in text and "num_gpus=0" in text
    assert "spark.executor.resource.gpu.amount" in text and "spark.task.resource.gpu.amount" in text


def test_the_early_check_ignores_busy_gpus_and_unrequested_ones():
    gpus.check_request([], 2, {}, smi=FakeSmi(count=2, busy=(0, 1)))  # busy: waited for later
    gpus.check_request([], None, {}, smi=FakeSmi(missing=True))  # not asked for: CPU is fine


def test_busy_gpus_are_waited_for_then_taken():
    smi = FakeSmi(count=2, busy=(0, 1))
    clock = Clock(smi, free_after=10)
    assert _assign(num_gpus=1, smi=smi, clock=clock) == ["0"]
    assert 10 <= clock.now < gpus.BUSY_WAIT_SECS


def test_gpus_that_stay_busy_are_an_error_after_the_wait():
    smi = FakeSmi(count=3, busy=(0, 2))
    clock = Clock()
    with pytest.raises(ConfigError) as info:
        _assign(num_gpus=2, smi=smi, clock=clock)
    assert clock.now >= gpus.BUSY_WAIT_SECS
    text = str(info.value)
    assert "tf_args.num_gpus=2 but only 1 of this host's 3 GPUs were free" in text and "busy by nvidia-smi: 0,2" in text
    with pytest.raises(ConfigError, match="the default of 1 GPU per node but only 0"):
        _assign(smi=FakeSmi(count=1, busy=(0,)), clock=Clock())


def test_asked_for_gpus_on_a_host_without_any_is_an_error():
    with pytest.raises(ConfigError, match=r"num_gpus=1 but Spark assigned this node no GPU and this host has none"):
        _assign(num_gpus=1, smi=FakeSmi(missing=True))


def test_probe_reports_why_nvidia_smi_gave_nothing():
    def fails(args):
        raise subprocess.CalledProcessError(9, ["nvidia-smi"], output="", stderr="NVIDIA-SMI has failed\n")

    def hangs(args):
        raise subprocess.TimeoutExpired(["nvidia-smi"], 30)

    assert gpus.probe(fails).reason == "nvidia-smi failed: NVIDIA-SMI has failed"
    assert "did not answer" in gpus.probe(hangs).reason
    host = gpus.probe(FakeSmi(count=3, busy=(1,)))
    assert host.free() == ["0", "2"] and host.reason == ""


def test_parse_gpu_list_skips_noise():
    text = "0, GPU-a\n\nNo devices were found\n1, GPU-b\n"
    assert gpus.parse_gpu_list(text) == [("0", "GPU-a"), ("1", "GPU-b")]


def test_run_nvidia_smi_raises_file_not_found_without_it(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(FileNotFoundError):
        gpus.run_nvidia_smi(["-L"])


def test_the_real_nvidia_smi_runner_on_scripts(monkeypatch, tmp_path):
    fake_nvidia_smi(tmp_path, 3, (2,))
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert gpus.probe().free() == ["0", "1"]
    broken = tmp_path / "nvidia-smi"
    broken.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed: no driver' >&2\nexit 9\n")
    assert gpus.probe().reason == "nvidia-smi failed: NVIDIA-SMI has failed: no driver"


# ---- what the TF process sees ----------------------------------------------------------------
def test_cuda_env_for_gpus_and_for_the_cpu():
    assert gpus.cuda_env([], {}) == {"CUDA_VISIBLE_DEVICES": ""}
    assert gpus.cuda_env(["0", "3"], {}) == {"CUDA_VISIBLE_DEVICES": "0,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert gpus.cuda_env(["1"], {"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}) == {"CUDA_VISIBLE_DEVICES": "1"}


@pytest.mark.parametrize(("value", "expected"), [("0,3", ["0", "3"]), ("", []), ("-1", []), ("2,-1,3", ["2"])])
def test_ctx_gpus_from_cuda_visible_devices(monkeypatch, value, expected):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    ctx = NodeContext(executor_id=0, job_name="worker", task_index=0, cluster_spec={}, default_fs="", working_dir="")
    assert ctx.gpus == expected
    given = NodeContext(
        executor_id=0, job_name="worker", task_index=0, cluster_spec={}, default_fs="", working_dir="", gpus=["5"]
    )
    assert given.gpus == ["5"]


# ---- real supervisors and TF processes (LocalLauncher: no Spark, so no Spark GPUs) ------------
def write_gpus(args: dict, ctx) -> None:
    import json
    import os
    from pathlib import Path

    seen = {
        "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "ctx": ctx.gpus,
        "order": os.environ.get("CUDA_DEVICE_ORDER"),
    }
    (Path(args["dir"]) / f"{ctx.job_name}-{ctx.task_index}.json").write_text(json.dumps(seen))


def _seen(path: Path) -> dict[str, dict]:
    import json

    return {p.stem: json.loads(p.read_text()) for p in sorted(path.glob("*.json"))}


def _run_local(tmp_path: Path, num_gpus: int | None, count: int, busy: tuple[int, ...], monkeypatch) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake_nvidia_smi(bin_dir, count, busy)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    tf_args = {"dir": str(out), "num_gpus": num_gpus}
    cluster = tfonspark.run(
        FakeSparkContext(), write_gpus, tf_args, 2, reservation_timeout=60, launcher=LocalLauncher()
    )
    cluster.shutdown(timeout=60)
    return _seen(out)


def test_supervisors_give_each_local_node_its_own_free_gpus(tmp_path, monkeypatch):
    seen = _run_local(tmp_path, 2, count=5, busy=(1,), monkeypatch=monkeypatch)
    assert seen == {
        "worker-0": {"cuda": "0,2", "ctx": ["0", "2"], "order": "PCI_BUS_ID"},
        "worker-1": {"cuda": "3,4", "ctx": ["3", "4"], "order": "PCI_BUS_ID"},
    }


def test_supervisors_run_on_the_cpu_with_no_gpu_visible(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # inherited: must not leak into a CPU node
    seen = _run_local(tmp_path, 0, count=4, busy=(), monkeypatch=monkeypatch)
    assert {s["cuda"] for s in seen.values()} == {""} and all(s["ctx"] == [] for s in seen.values())


def test_a_node_that_cannot_get_its_gpus_fails_naming_the_settings(tmp_path, monkeypatch):
    # LocalLauncher has no Spark task to check early: the supervisor finds it and says why
    with pytest.raises(NodeFailed) as info:
        _run_local(tmp_path, 5, count=4, busy=(), monkeypatch=monkeypatch)
    text = str(info.value)
    assert "ConfigError: tf_args.num_gpus=5 but Spark assigned this node no GPU and this host has 4 GPU(s)" in text
    assert "spark.task.resource.gpu.amount" in text and "num_gpus=0" in text
    assert not list((tmp_path / "out").glob("*.json")), "no TF process may start without its GPUs"
