"""The node task: runs in a Spark Python worker and starts one node's supervisor.

In ``InputMode.TENSORFLOW`` the task holds its executor slot until the TF process exits (as in
TFoS); in ``InputMode.SPARK`` it returns once the node is up so feed tasks can use the slot.
Failures of the TF process itself are reported to the driver by the supervisor; the task raises
only when the node could not be started at all.
"""

from __future__ import annotations

import json
import selectors
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..config import InputMode, NodeConfig
from ..errors import ClusterError
from ..wire.bootstrap import write_bootstrap
from .supervisor import STATUS_PREFIX

__all__ = ["node_task", "start_node"]

_FINAL = ("exit", "rejected", "failed")


def _events(proc: subprocess.Popen, deadline: float | None) -> Iterator[dict[str, Any]]:
    """Status events printed by the supervisor, until EOF or ``deadline``."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return
            if not sel.select(left):
                continue
            line = proc.stdout.readline()
            if not line:
                return
            text = line.decode("utf-8", "replace")
            if text.startswith(STATUS_PREFIX):
                yield json.loads(text[len(STATUS_PREFIX):])


def start_node(config: NodeConfig, executor_id: int, payload: bytes, gpus: list[str],
               wait_for_exit: bool) -> dict[str, Any]:
    """Spawn a supervisor for ``executor_id``; return its last status event."""
    proc = subprocess.Popen([sys.executable, "-m", "tfonspark.executor.supervisor",
                             "--cluster", config.cluster_id[:12], "--executor", str(executor_id)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdin is not None
    write_bootstrap(proc.stdin, {"config": config.to_json(), "executor_id": executor_id,
                                 "gpus": gpus}, payload)
    proc.stdin.close()
    startup = time.monotonic() + config.reservation_timeout + 120
    last: dict[str, Any] = {"event": "none"}
    for event in _events(proc, startup):
        last = event
        if event["event"] in _FINAL or (event["event"] == "up" and not wait_for_exit):
            break
    if wait_for_exit and last["event"] == "up":
        for event in _events(proc, None):
            last = event
    if last["event"] in ("rejected", "failed"):
        raise ClusterError(f"executor {executor_id}: node could not start: {last.get('reason')}")
    if proc.stdout is not None:
        proc.stdout.close()
    return {"executor_id": executor_id, **last}


def node_task(config: NodeConfig, payload: bytes) -> Callable[[Iterator[int]], Iterator[dict]]:
    """The ``mapPartitions`` function that starts the node(s) for the given executor ids."""

    def run(executor_ids: Iterator[int]) -> Iterator[dict]:
        from pyspark import TaskContext

        task = TaskContext.get()
        resources = task.resources() if task is not None else {}
        gpus = list(resources["gpu"].addresses) if "gpu" in resources else []
        wait = config.input_mode == InputMode.TENSORFLOW
        for executor_id in executor_ids:
            yield start_node(config, executor_id, payload, gpus, wait)

    return run
