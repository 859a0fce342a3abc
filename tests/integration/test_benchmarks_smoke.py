"""Smoke runs of the benchmarks: they still start, feed, infer and print their tables.

Only tfonspark and plain-Spark variants (no TFoS install), small data, one shared Spark context
per script (``--quick``). Speed is measured by the benchmarks themselves, never asserted here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 240  # per script; both finish in well under 90 s together on an idle 2-core machine


def _run_benchmark(script: str, *args: str) -> str:
    """Run ``benchmarks/<script> --quick ...``; return its stdout, failing with its output tail."""
    cmd = [sys.executable, str(REPO / "benchmarks" / script), "--quick", "--no-install", *args]
    try:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{script} did not finish within {TIMEOUT}s: {(exc.stdout or b'')[-2000:]!r}")
    assert proc.returncode == 0, f"{script} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def _table(out: str) -> tuple[list[str], list[list[str]]]:
    """The header cells and row cells of the Markdown table printed at the end."""
    lines: list[str] = []
    for line in out.splitlines():  # the first table only (rows/s); a CPU table follows it
        if line.startswith("|"):
            lines.append(line)
        elif lines:
            break
    assert len(lines) >= 3, f"no Markdown table in the output:\n{out}"
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
    return cells[0], cells[2:]


@pytest.mark.slow
def test_feed_benchmark_quick_run_prints_a_table():
    """feed.py measures tfonspark RDD/DF and both plain-Spark limits, on array and list rows,
    warm and on the 1st pass, and prints its table."""
    out = _run_benchmark("feed.py", "--variants", "rdd,df,plain", "--shapes", "tabular", "--row-types", "array,list")
    header, rows = _table(out)
    assert [r[0] for r in rows] == ["tabular", "tabular-list"]
    assert "TFoS 2.2.5" not in header, "the TFoS variant was not asked for"
    rates, list_rates = dict(zip(header, rows[0])), dict(zip(header, rows[1]))
    rdd = ("tfonspark RDD", "Spark foreachPartition", "tfonspark RDD 1st pass", "Spark foreachPartition 1st pass")
    for column in (*rdd, "tfonspark DF", "Spark mapInArrow drain"):
        assert rates[column] not in ("", "n/a"), rates
    for column in rdd:
        assert list_rates[column] not in ("", "n/a"), list_rates
    assert list_rates["tfonspark DF"] == "n/a", "DataFrames have no list rows"
    assert "tabular: tfonspark RDD >= 0.8x Spark foreachPartition" in out
    assert "tabular-list: tfonspark RDD 1st pass >= 0.8x Spark foreachPartition 1st pass" in out


@pytest.mark.slow
def test_inference_benchmark_quick_run_prints_a_table():
    """inference.py measures both Cluster.inference reading styles and predict_batch_udf, first
    pass and warm, and prints its table with the ratios."""
    out = _run_benchmark("inference.py", "--variants", "rows,columns,udf")
    header, rows = _table(out)
    assert [r[0] for r in rows] == ["next_batch (rows)", "next_columns", "predict_batch_udf"]
    for row in rows:
        cells = dict(zip(header, row))
        for column in ("first rows/s", "warm rows/s", "first / udf", "warm / udf"):
            assert cells[column] not in ("", "n/a"), cells
    assert "next_columns >= 1.5x predict_batch_udf (warm)" in out


@pytest.mark.slow
def test_streaming_benchmark_quick_run_prints_both_ratios():
    """streaming.py times the streaming and batch feeds and an empty foreachBatch sink in one run."""
    out = _run_benchmark("streaming.py")
    header, rows = _table(out)
    cells = dict(zip(header, rows[0]))
    assert cells["micro-batches"] == "3" and cells["stream / batch"].endswith("x"), cells
    assert float(cells["empty foreachBatch s per micro-batch"]) > 0, cells
    assert cells["stream / plain Spark stream"].endswith("x"), cells
    assert "streaming feed >= 0.7x batch feed" in out and "per micro-batch: the streaming feed adds" in out
    assert "against plain Spark reading the same micro-batches into Python" in out


@pytest.mark.parametrize("folder", ["benchmarks", "examples"])
def test_benchmarks_and_examples_import_only_public_tfonspark_names(folder: str) -> None:
    """What users copy from must not lean on private modules (``tfonspark._x``) or names (``_y``)."""
    import ast

    private = []
    for path in sorted((REPO / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tfonspark"):
                modules, names = [node.module or ""], [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                modules, names = [a.name for a in node.names if a.name.startswith("tfonspark")], []
            else:
                continue
            parts = [p for m in modules for p in m.split(".")] + names
            if any(p.startswith("_") for p in parts):
                private.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert private == []


@pytest.mark.slow
def test_step_guard_benchmark_quick_run_prints_the_ratio(mnist_dir):
    """step_guard.py times the guarded and the plain training step and prints their ratio."""
    cmd = [sys.executable, str(REPO / "benchmarks" / "step_guard.py"), "--quick", "--data", str(mnist_dir)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [line.split()[2] for line in proc.stdout.splitlines() if line.startswith("rep ")] == ["plain", "guarded"]
    assert "guarded / plain:" in proc.stdout


@pytest.mark.slow
def test_ps_vs_mwms_benchmark_quick_run_prints_both_rates_and_the_ratio(mnist_dir):
    """ps_vs_mwms.py trains with a ps_cluster and with MWMS in one run and prints their steps/s side by side."""
    cmd = [sys.executable, str(REPO / "benchmarks" / "ps_vs_mwms.py"), "--quick", "--data", str(mnist_dir)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    header, rows = _table(proc.stdout)
    cells = dict(zip(header, rows[0]))
    assert len(rows) == 1 and cells["PS / MWMS"].strip("*").endswith("x"), cells
    for column in ("PS steps/s", "MWMS steps/s", "PS accuracy", "MWMS accuracy"):
        assert float(cells[column].rstrip("%")) > 0, cells
    assert "40 steps x global batch 64, 2 workers on local[3]" in proc.stdout
    assert "/proc/loadavg" in proc.stdout
