"""Stand-ins for Spark in fast tests of a cluster's lifecycle (no JVM, real node processes).

``tfonspark.run(FakeSparkContext(), map_fun, args, 2, launcher=LocalLauncher())`` starts real
supervisors and TF processes from threads of the test process: everything but Spark is real.
"""

from __future__ import annotations

import stat
import threading
import traceback
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from ..driver.nodes.launcher import LocalLauncher

__all__ = ["FakeAccumulator", "FakeRDD", "FakeSparkContext", "LocalLauncher", "fake_nvidia_smi"]


class FakeAccumulator:
    """``sc.accumulator(0)``: add and read, thread-safe."""

    def __init__(self, value: int = 0) -> None:
        self.value = value
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.value += n


class FakeRDD:
    """``parallelize(...)``, ``mapPartitions``/``mapPartitionsWithIndex`` and ``collect``, run here.

    A failing task fails ``collect`` as Spark does: with an error whose text holds the task's
    Python traceback and no Python exception chained to it, so code that brings executor errors
    back (``tfonspark.wire.errors``) is tested on what it will really get.
    """

    def __init__(
        self, partitions: list[list[Any]], fns: tuple[Callable[[int, Iterator[Any]], Iterable[Any]], ...] = ()
    ):
        self.partitions = partitions
        self._fns = fns

    def barrier(self) -> FakeRDD:
        return self

    def mapPartitions(self, fn: Callable[[Iterator[Any]], Iterable[Any]]) -> FakeRDD:  # noqa: N802
        return FakeRDD(self.partitions, (*self._fns, lambda _i, rows: fn(rows)))

    def mapPartitionsWithIndex(self, fn: Callable[[int, Iterator[Any]], Iterable[Any]]) -> FakeRDD:  # noqa: N802
        return FakeRDD(self.partitions, (*self._fns, fn))

    def collect(self) -> list[Any]:
        out: list[Any] = []
        for index, rows in enumerate(self.partitions):
            try:
                data: Iterable[Any] = rows
                for fn in self._fns:
                    data = fn(index, iter(data))
                out.extend(data)
            except Exception:
                failure = f"Job aborted due to stage failure: Task {index} failed:\n{traceback.format_exc()}"
                raise RuntimeError(failure) from None
        return out


class _Conf:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)


class FakeSparkContext:
    """What the driver calls on a SparkContext outside of running jobs; records cancelled groups."""

    def __init__(self, conf: dict[str, str] | None = None) -> None:
        self.conf = {"spark.driver.host": "127.0.0.1", **(conf or {})}
        self.cancelled: list[str] = []
        self.local_properties: dict[str, str | None] = {}

    def getConf(self) -> _Conf:  # noqa: N802 - SparkContext's name
        return _Conf(self.conf)

    def cancelJobGroup(self, group: str) -> None:  # noqa: N802
        self.cancelled.append(group)

    def setJobGroup(self, group: str, description: str, interruptOnCancel: bool = False) -> None:  # noqa: N802, N803
        self.local_properties["spark.jobGroup.id"] = group

    def setLocalProperty(self, key: str, value: str | None) -> None:  # noqa: N802
        self.local_properties[key] = value

    def accumulator(self, value: int) -> FakeAccumulator:
        return FakeAccumulator(value)

    def parallelize(self, data: Iterable[Any], numSlices: int | None = None) -> FakeRDD:  # noqa: N803
        rows = list(data)
        n = max(1, numSlices or 1)
        return FakeRDD([rows[len(rows) * i // n : len(rows) * (i + 1) // n] for i in range(n)])


def fake_nvidia_smi(bin_dir: Path, count: int, busy: tuple[int, ...] = ()) -> Path:
    """Write ``bin_dir/nvidia-smi``, a script answering the two queries of :mod:`tfonspark.executor.gpus`
    for a host of ``count`` GPUs (``GPU-0000-uuid``...) of which ``busy`` run a compute process.

    Put ``bin_dir`` first on ``PATH`` (of the test, or of the executors) to drive the nvidia-smi
    fallback without GPUs; any other arguments make it fail, saying so.
    """
    listing = "".join(f"{i}, GPU-{i:04d}-uuid\\n" for i in range(count))
    busy_text = "".join(f"GPU-{i:04d}-uuid\\n" for i in busy)
    script = Path(bin_dir) / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        'case "$*" in\n'
        f"  *--query-gpu=index,uuid*) printf '{listing}' ;;\n"
        f"  *--query-compute-apps=gpu_uuid*) printf '{busy_text}' ;;\n"
        '  *) echo "fake nvidia-smi: unexpected arguments: $*" >&2; exit 2 ;;\n'
        "esac\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return script
