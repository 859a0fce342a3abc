"""Which GPUs a node's TF process may use: TFoS's policy, as pure functions plus one nvidia-smi seam.

1. Spark gave the node's task GPUs (``spark.executor.resource.gpu.amount``,
   ``spark.task.resource.gpu.amount`` and a discovery script): the node gets exactly those
   addresses, or the first ``tf_args.num_gpus`` of them.
2. Else, unless on Kubernetes (``SPARK_EXECUTOR_POD_IP`` set: the NVIDIA device plugin can show a
   pod GPUs it may not use), free GPUs by ``nvidia-smi``: ``num_gpus`` of them (1 when not given),
   each node taking its turn among the cluster's nodes on the same host.
3. Else the CPU, logged once per process.

Asking for more GPUs than the node can have is a :class:`~tfonspark.errors.ConfigError` naming
the settings. The supervisor hands the result to the TF process as ``CUDA_VISIBLE_DEVICES``
(``""`` for the CPU, so TensorFlow never grabs every GPU of a shared host) and ``ctx.gpus``.
"""

from __future__ import annotations

import logging
import operator
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError

__all__ = [
    "K8S_ENV",
    "HostGpus",
    "assign",
    "check_request",
    "cuda_env",
    "local_index",
    "pick",
    "probe",
    "requested_gpus",
    "run_nvidia_smi",
    "spark_addresses",
]

log = logging.getLogger(__name__)

K8S_ENV = "SPARK_EXECUTOR_POD_IP"  #: set by Spark in executor pods: no nvidia-smi fallback there
SPARK_KEYS = (
    "spark.executor.resource.gpu.amount, spark.task.resource.gpu.amount and "
    "spark.executor.resource.gpu.discoveryScript (spark.worker.resource.gpu.* on standalone)"
)
SMI_TIMEOUT_SECS = 30.0  # one nvidia-smi call
BUSY_WAIT_SECS = 30.0  # how long a node waits for busy GPUs to free up before failing
BUSY_POLL_SECS = 5.0
_LIST_ARGS = ("--query-gpu=index,uuid", "--format=csv,noheader")
_BUSY_ARGS = ("--query-compute-apps=gpu_uuid", "--format=csv,noheader")

#: Runs ``nvidia-smi`` with the given arguments and returns its stdout. Raises FileNotFoundError
#: when it is not installed, CalledProcessError or TimeoutExpired when it fails.
Smi = Callable[[Sequence[str]], str]


class _Said:
    cpu = False  # "runs on the CPU" was logged by this process


def requested_gpus(tf_args: Any) -> int | None:
    """``tf_args.num_gpus`` (argparse namespace, object or mapping) as TFoS reads it; None if not given."""
    if isinstance(tf_args, Mapping):
        value = tf_args.get("num_gpus")
    elif isinstance(tf_args, (str, bytes, list, tuple)):  # argv: TFoS does not parse it either
        value = None
    else:
        value = getattr(tf_args, "num_gpus", None)
    if value is None:
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    try:
        number = None if isinstance(value, bool) else operator.index(value)  # numpy integers too
    except TypeError:
        number = None
    if number is None or number < 0:
        raise ConfigError(f"tf_args.num_gpus must be a whole number >= 0 (0 = CPU). Received: {value!r}")
    return number


def spark_addresses(resources: Mapping[str, Any]) -> list[str]:
    """The GPU addresses Spark assigned a task (``TaskContext.resources()``); [] if none."""
    gpu = resources.get("gpu")
    return [str(a) for a in gpu.addresses] if gpu is not None else []


def _asked(num_gpus: int | None) -> str:
    return f"tf_args.num_gpus={num_gpus}" if num_gpus is not None else "the default of 1 GPU per node"


def _limit_spark(spark: Sequence[str], num_gpus: int | None) -> list[str]:
    if num_gpus is None or num_gpus == len(spark):
        return list(spark)
    if num_gpus > len(spark):
        raise ConfigError(
            f"tf_args.num_gpus={num_gpus} but Spark gave this node's task {len(spark)} GPU(s) "
            f"(addresses {','.join(spark)}). A node uses only its task's GPUs: raise "
            "spark.task.resource.gpu.amount (spark.executor.resource.gpu.amount must be at least as "
            "large) or lower num_gpus."
        )
    log.warning(
        "tf_args.num_gpus=%d: the node uses %d of the %d GPUs Spark gave its task (%s); "
        "lower spark.task.resource.gpu.amount to leave the others to other tasks",
        num_gpus,
        num_gpus,
        len(spark),
        ",".join(spark),
    )
    return list(spark[:num_gpus])


@dataclass(frozen=True)
class HostGpus:
    """What ``nvidia-smi`` says about this host: its GPUs (index, uuid) and the busy ones."""

    gpus: tuple[tuple[str, str], ...] = ()
    busy: frozenset[str] = frozenset()  # uuids of GPUs running a compute process
    reason: str = ""  # why there are none

    def free(self) -> list[str]:
        """Indexes of the GPUs no compute process runs on, in nvidia-smi's order."""
        return [index for index, uuid in self.gpus if uuid not in self.busy]


def _csv_column(text: str, column: int) -> list[str]:
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) > column and cells[column]:
            rows.append(cells[column])
    return rows


def parse_gpu_list(text: str) -> list[tuple[str, str]]:
    """``nvidia-smi --query-gpu=index,uuid --format=csv,noheader`` -> [(index, uuid)]."""
    out = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) >= 2 and cells[0].isdigit() and cells[1]:
            out.append((cells[0], cells[1]))
    return out


def run_nvidia_smi(args: Sequence[str]) -> str:
    """The real :data:`Smi`: ``nvidia-smi`` on PATH, bounded by SMI_TIMEOUT_SECS."""
    path = shutil.which("nvidia-smi")
    if path is None:  # the usual CPU host: no process to start
        raise FileNotFoundError("nvidia-smi is not on PATH")
    done = subprocess.run([path, *args], capture_output=True, text=True, timeout=SMI_TIMEOUT_SECS, check=True)
    return done.stdout


def probe(smi: Smi = run_nvidia_smi) -> HostGpus:
    """This host's GPUs and which are busy; none (with the reason) if nvidia-smi is missing or fails."""
    try:
        gpus = tuple(parse_gpu_list(smi(_LIST_ARGS)))
        busy = frozenset(_csv_column(smi(_BUSY_ARGS), 0)) if gpus else frozenset()
    except FileNotFoundError:
        return HostGpus(reason="nvidia-smi is not on PATH")
    except subprocess.TimeoutExpired:
        return HostGpus(reason=f"nvidia-smi did not answer within {SMI_TIMEOUT_SECS:.0f}s")
    except (subprocess.CalledProcessError, OSError) as exc:
        detail = (getattr(exc, "stderr", None) or getattr(exc, "output", None) or str(exc)).strip()
        return HostGpus(reason=f"nvidia-smi failed: {detail.splitlines()[-1] if detail else exc}")
    return HostGpus(gpus, busy, "" if gpus else "nvidia-smi lists no GPU")


def local_index(cluster_spec: Mapping[str, Sequence[str]], job_name: str, task_index: int) -> int:
    """This node's position among the cluster's nodes on its own host (``host:port`` addresses)."""
    mine = cluster_spec[job_name][task_index]
    host = mine.rsplit(":", 1)[0]
    peers = [a for job in cluster_spec.values() for a in job if a.rsplit(":", 1)[0] == host]
    return peers.index(mine)


def pick(free: Sequence[str], count: int, index: int) -> list[str]:
    """The ``index``-th node's ``count`` GPUs of ``free``: disjoint while they last, then shared."""
    if count <= 0 or not free:
        return []
    start = index * count
    if start + count > len(free):
        log.warning(
            "node %d on this host wants GPUs %d-%d but only %d are free: GPUs are shared between nodes",
            index,
            start,
            start + count - 1,
            len(free),
        )
    return [free[(start + i) % len(free)] for i in range(count)]


def _no_gpu_error(num_gpus: int, why: str) -> ConfigError:
    return ConfigError(
        f"tf_args.num_gpus={num_gpus} but Spark assigned this node no GPU and {why}. Let Spark "
        f"assign GPUs ({SPARK_KEYS}), or set num_gpus=0 to run on the CPU."
    )


def check_request(
    spark: Sequence[str], num_gpus: int | None, environ: Mapping[str, str], smi: Smi = run_nvidia_smi
) -> None:
    """Fail early (in the node's Spark task, before it joins the cluster) when ``num_gpus`` asks for
    more GPUs than the node can ever have; GPUs that are only busy are waited for later."""
    if spark:
        _limit_spark(spark, num_gpus)
        return
    if not num_gpus:
        return
    if K8S_ENV in environ:
        raise _no_gpu_error(num_gpus, "on Kubernetes tfonspark does not pick GPUs by nvidia-smi")
    host = probe(smi)
    if len(host.gpus) < num_gpus:
        raise _no_gpu_error(num_gpus, _host_has(host))


def _host_has(host: HostGpus) -> str:
    return f"this host has {len(host.gpus)} GPU(s)" if host.gpus else f"this host has none ({host.reason})"


def _say_cpu(reason: str) -> list[str]:
    if not _Said.cpu:
        _Said.cpu = True
        log.info("no GPU for this node (%s): TensorFlow runs on the CPU", reason)
    return []


def assign(
    spark: Sequence[str],
    num_gpus: int | None,
    cluster_spec: Mapping[str, Sequence[str]],
    job_name: str,
    task_index: int,
    environ: Mapping[str, str],
    smi: Smi = run_nvidia_smi,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> list[str]:
    """The GPU addresses for one node's TF process ([] = CPU); see the module docstring."""
    if spark:
        return _limit_spark(spark, num_gpus)
    if num_gpus == 0:
        return _say_cpu("tf_args.num_gpus=0")
    if K8S_ENV in environ:
        if num_gpus:
            raise _no_gpu_error(num_gpus, "on Kubernetes tfonspark does not pick GPUs by nvidia-smi")
        return _say_cpu("Kubernetes, and Spark assigned none")
    count = num_gpus or 1
    deadline = clock() + BUSY_WAIT_SECS
    host = probe(smi)
    while len(host.free()) < count <= len(host.gpus) and clock() < deadline:  # busy ones may free up
        sleep(BUSY_POLL_SECS)
        host = probe(smi)
    if len(host.gpus) < count:
        if num_gpus:
            raise _no_gpu_error(num_gpus, _host_has(host))
        return _say_cpu(f"Spark assigned none and {host.reason}")
    free = host.free()
    if len(free) < count:
        busy = ",".join(i for i, u in host.gpus if u in host.busy)
        raise ConfigError(
            f"{_asked(num_gpus)} but only {len(free)} of this host's {len(host.gpus)} GPUs were free "
            f"for {BUSY_WAIT_SECS:.0f}s (busy by nvidia-smi: {busy}). Free them, lower tf_args.num_gpus "
            f"(0 = CPU), or let Spark assign GPUs ({SPARK_KEYS})."
        )
    chosen = pick(free, count, local_index(cluster_spec, job_name, task_index))
    log.info("GPUs %s for %s:%d (free by nvidia-smi)", ",".join(chosen), job_name, task_index)
    return chosen


def cuda_env(gpus: Sequence[str], environ: Mapping[str, str]) -> dict[str, str]:
    """The variables that give a TF process exactly ``gpus`` ("" = none: the CPU).

    nvidia-smi and Spark's discovery scripts number GPUs in PCI bus order; CUDA numbers them
    fastest first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, so that is set unless already chosen.
    """
    env = {"CUDA_VISIBLE_DEVICES": ",".join(gpus)}
    if gpus and "CUDA_DEVICE_ORDER" not in environ:
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return env
