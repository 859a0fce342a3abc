"""demo/progress.py: the demo's progress reports, its console, and the result message."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from tfonspark.demo.progress import Console, format_progress, progress_message, result_message
from tfonspark.driver.nodes.reports import Report
from tfonspark.tfprocess.report import report_payload

pytestmark = pytest.mark.timeout(60)


# ---- progress reports ---------------------------------------------------------------------------


def progress(**overrides):
    """A stand-in for tfonspark.keras.Progress (same attributes)."""
    fields = dict(
        epoch=1,
        step=40,
        steps=100,
        logs={"loss": 0.25, "accuracy": 0.9},
        rows=2560,
        seconds=2.0,
        epoch_end=False,
        global_rows=None,
        worker=0,
    )
    fields.update(overrides)
    value = SimpleNamespace(**fields)
    value.rows_per_sec = fields["rows"] / fields["seconds"]
    return value


def test_a_progress_message_is_a_valid_report():
    message = progress_message(progress(logs={"loss": np.float32(0.25), "accuracy": 0.9, "note": "x"}))
    assert report_payload(message) == {
        "kind": "progress",
        "epoch": 1,
        "step": 40,
        "steps": 100,
        "epoch_end": False,
        "rows_per_sec": 1280.0,
        "global_rows": None,
        "logs": {"loss": 0.25, "accuracy": 0.9},
    }


def test_the_result_is_small_whatever_the_test_set():
    matrix = np.diag(np.full(10, 60_000 // 10))  # a 60,000-image test set
    message = result_message({"loss": [np.float32(0.5), 0.25], "val_accuracy": [0.9, 0.95]}, matrix)
    assert report_payload(message) == message
    assert message["confusion"][3][3] == 6000 and message["history"]["loss"] == [0.5, 0.25]
    assert len(json.dumps(message)) < 1000


def test_format_progress_step_and_epoch_lines():
    step = progress_message(progress())
    assert format_progress(step, 3, {0: 1280.0, 1: 1300.0}) == (
        "epoch 2/3  step 40/100  loss 0.2500  accuracy 0.9000  2580 rows/s (2 nodes)"
    )
    assert format_progress(step, 3, {0: 1280.0}).endswith("1280 rows/s (1 node)")
    end = progress_message(
        progress(step=100, epoch_end=True, global_rows=12800, logs={"loss": 0.2, "val_accuracy": 0.95})
    )
    line = format_progress(end, 3, {})
    assert line.startswith("epoch 2/3  step 100/100  done: loss 0.2000  val_accuracy 0.9500")
    assert "rows/s (all nodes" in line


# ---- the demo's console -------------------------------------------------------------------------


def report(index: int, metrics: dict) -> Report:
    return Report("worker", index, metrics)


def test_console_prints_the_chief_sums_rates_and_keeps_the_result(capsys):
    console = Console(epochs=2)
    console(report(1, progress_message(progress(rows=3000))))
    console(report(0, progress_message(progress())))
    console(report(0, progress_message(progress(step=100, epoch_end=True, global_rows=12800))))
    console(report(1, progress_message(progress(step=100, epoch_end=True, global_rows=12800))))
    assert console.wait_for_result(0.01) is None
    console(report(0, {"kind": "result", "history": {}}))
    console(report(0, {"kind": "something else"}))
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2, lines  # worker 1 is summed into the rate, not printed
    assert "2780 rows/s (2 nodes)" in lines[0] and "done:" in lines[1]
    assert console.trained_rows == 12800
    assert console.wait_for_result(0.01) == {"kind": "result", "history": {}}


# ---- data helpers -------------------------------------------------------------------------------


# ---- CLI ------------------------------------------------------------------------------------------
