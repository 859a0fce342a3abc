"""What the ``ps_cluster`` driver scripts (``ps_driver.py``, ``ps_models_driver.py``,
``ps_failures_driver.py``) share: finding their node processes, and how they end.

Imported by those scripts as a sibling module (a script's directory is on ``sys.path``), never by
pytest, and importing nothing heavy at import time.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

NODE_MARKERS = ("tfonspark.tfprocess.entry", "tfonspark.executor.supervisor")


def node_pids(cluster_ids: list[str]) -> list[int]:
    """The pids of the supervisors and TF processes of the given clusters."""
    import psutil

    pids = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info.get("cmdline") or [])
        if any(m in cmd for m in NODE_MARKERS) and any(c[:12] in cmd for c in cluster_ids):
            pids.append(proc.pid)
    return pids


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def write_and_exit(out: dict, out_path: str, sc: Any) -> None:
    """Write ``out`` as JSON to ``out_path``, stop Spark and end the process at once: TF's
    coordinator threads do not stop within a process."""
    with open(out_path, "w") as f:
        json.dump(out, f)
    sys.stdout.flush()
    sc.stop()
    os._exit(0)
