"""The demo's reports: what the nodes send with ``ctx.report`` and how the driver prints them.

Every report is a flat JSON object with a ``kind``:

* ``"progress"`` (:func:`progress_message`): a :class:`tfonspark.keras.Progress`, from every
  node every ``log_every_steps`` steps and at the end of each epoch;
* ``"result"`` (:func:`result_message`): the chief's training history and the test set's
  confusion matrix (a few hundred bytes, whatever the size of the test set).

They travel on the node's own channel to the driver (``ctx.report``); the driver's
:class:`Console` is the ``on_report`` callback of ``tfonspark.run``.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Console", "Message", "format_progress", "progress_message", "result_message"]

Message = dict[str, Any]


def progress_message(progress: Any) -> Message:
    """A :class:`tfonspark.keras.Progress` as a report."""
    return {
        "kind": "progress",
        "epoch": progress.epoch,
        "step": progress.step,
        "steps": progress.steps,
        "epoch_end": progress.epoch_end,
        "rows_per_sec": round(progress.rows_per_sec, 1),
        "global_rows": progress.global_rows,
        "logs": {k: float(v) for k, v in progress.logs.items() if isinstance(v, (int, float, np.number))},
    }


def result_message(history: Mapping[str, Sequence[float]], confusion: np.ndarray) -> Message:
    """The chief's final report: Keras' ``history.history`` and the test confusion matrix."""
    return {
        "kind": "result",
        "history": {k: [float(v) for v in values] for k, values in history.items()},
        "confusion": np.asarray(confusion, dtype=np.int64).tolist(),
    }


def format_progress(message: Mapping[str, Any], epochs: int, node_rates: Mapping[int, float]) -> str:
    """One console line for a progress report.

    Step lines show the chief's running loss and accuracy, and rows/s summed over the latest
    report of each node; epoch-end lines show the global epoch metrics (``val_*`` included).
    """
    logs = message.get("logs", {})
    steps = message.get("steps")
    head = f"epoch {message['epoch'] + 1}/{epochs}  step {message['step']}/{steps or '?'}"
    if message.get("epoch_end"):
        metrics = "  ".join(f"{k} {v:.4f}" for k, v in logs.items())
        return f"{head}  done: {metrics}  {message['rows_per_sec']:.0f} rows/s (all nodes, with validation)"
    loss, accuracy = logs.get("loss"), logs.get("accuracy")
    parts = [head]
    if loss is not None:
        parts.append(f"loss {loss:.4f}")
    if accuracy is not None:
        parts.append(f"accuracy {accuracy:.4f}")
    nodes = len(node_rates)
    parts.append(f"{sum(node_rates.values()):.0f} rows/s ({nodes} node{'' if nodes == 1 else 's'})")
    return "  ".join(parts)


@dataclass
class Console:
    """The driver's ``on_report``: prints the chief's progress, keeps the chief's result.

    Step lines are printed for worker 0 only, with the rows/s of every node summed; epoch-end
    lines once (worker 0's, whose logs are global). Reports come one at a time, from the
    cluster's watcher thread.
    """

    epochs: int
    rates: dict[int, float] = field(default_factory=dict)
    trained_rows: int = 0
    result: Message | None = None
    _has_result: threading.Event = field(default_factory=threading.Event, repr=False)

    def __call__(self, report: Any) -> None:
        """Handle one :class:`tfonspark.driver.nodes.reports.Report`."""
        message, worker = report.metrics, int(report.index)
        if message.get("kind") == "result":
            self.result = dict(message)
            self._has_result.set()
            return
        if message.get("kind") != "progress":
            return
        if message.get("epoch_end") and worker == 0:
            self.trained_rows += int(message.get("global_rows") or 0)
        elif not message.get("epoch_end"):
            self.rates[worker] = float(message.get("rows_per_sec", 0.0))
        if worker == 0 and (message.get("epoch_end") or message["step"] != message.get("steps")):
            print("  " + format_progress(message, self.epochs, self.rates), flush=True)

    def wait_for_result(self, timeout: float) -> Message | None:
        """The chief's result, waiting up to ``timeout`` seconds for it to be handled."""
        self._has_result.wait(timeout)
        return self.result
