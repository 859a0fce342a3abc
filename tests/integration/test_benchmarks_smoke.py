"""Smoke runs of the benchmarks: they still start, feed, infer and print their tables.

Only tfonspark and plain-Spark variants (no TFoS install), small data, one shared Spark context
(``--quick``). feed.py, inference.py and streaming.py run one after another in one subprocess
(this file is its script), sharing that context: each script's own process would start Python,
the JVM and two executor JVMs again. Speed is measured by the benchmarks themselves, never
asserted here.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import re
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 240  # per script; both finish in well under 90 s together on an idle 2-core machine
# the benchmarks that run in one shared process, by the test that checks each one's output
SHARED: dict[str, tuple[str, ...]] = {
    "test_feed_benchmark_quick_run_prints_a_table": (
        "feed.py",
        *("--variants", "rdd,df,plain,paired", "--shapes", "tabular", "--row-types", "array,list"),
    ),
    "test_inference_benchmark_quick_run_prints_a_table": ("inference.py", "--variants", "rows,columns,udf"),
    # 3 micro-batches as --quick's 150,000 rows give, of 10,000 rows each
    "test_streaming_benchmark_quick_run_prints_both_ratios": (
        "streaming.py",
        "--rows",
        "30000",
        "--batch-rows",
        "10000",
    ),
}
SHARED_TIMEOUT = 560  # all three (under the tests' own 600 s); each took 31-35 s in CI at 2 cores


def _run_shared(runs: list[tuple[str, ...]], out: Path) -> None:
    """The subprocess: ``main(["--quick", "--no-install", ...])`` of each benchmark in turn, on one
    Spark context; writes each one's stdout and exit status (or traceback) to ``out``."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import _common

    from tfonspark.testing import SparkManager

    _common.stop_spark = lambda: None  # type: ignore[assignment]  # the next script reuses it
    results: dict[str, Any] = {}
    try:
        for script, *args in runs:
            printed = io.StringIO()
            try:
                with contextlib.redirect_stdout(printed):
                    rc = importlib.import_module(Path(script).stem).main(["--quick", "--no-install", *args])
            except BaseException:  # noqa: BLE001 (SystemExit too: reported to the script's test)
                rc, printed = 1, io.StringIO(printed.getvalue() + traceback.format_exc())
            results[script] = {"rc": rc, "stdout": printed.getvalue()}
            print(f"# {script} exited {rc}", file=sys.stderr, flush=True)
    finally:
        SparkManager.instance().stop()
    out.write_text(json.dumps(results))


@pytest.fixture(scope="module")
def shared_runs(request, tmp_path_factory) -> dict[str, Any]:
    """Run the selected ones of :data:`SHARED` in one subprocess; their results by script."""
    selected = [item.name for item in request.session.items if item.module is request.module]
    runs = [SHARED[name] for name in SHARED if name in selected]
    out = tmp_path_factory.mktemp("benchmarks") / "results.json"
    cmd = [sys.executable, __file__, json.dumps(runs), str(out)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=SHARED_TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{[r[0] for r in runs]} did not finish within {SHARED_TIMEOUT}s: {(exc.stderr or b'')[-3000:]!r}")
    assert proc.returncode == 0 and out.exists(), (
        f"exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return {script: dict(result, stderr=proc.stderr) for script, result in json.loads(out.read_text()).items()}


def _shared_output(shared_runs: dict[str, Any], script: str) -> str:
    """``script``'s stdout from the shared run, failing with its output tail if it failed."""
    result = shared_runs[script]
    assert result["rc"] == 0, f"{script} exited {result['rc']}\n{result['stdout'][-3000:]}\n{result['stderr'][-3000:]}"
    return result["stdout"]


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
@pytest.mark.timeout(600)  # the first of the shared run's tests pays for all of it
def test_feed_benchmark_quick_run_prints_a_table(shared_runs):
    """feed.py measures tfonspark RDD/DF and both plain-Spark limits, on array and list rows,
    warm and on the 1st pass, also paired job by job on one cluster, and prints its table."""
    out = _shared_output(shared_runs, "feed.py")
    header, rows = _table(out)
    assert [r[0] for r in rows] == ["tabular", "tabular-list"]
    assert "TFoS 2.2.5" not in header, "the TFoS variant was not asked for"
    rates, list_rates = dict(zip(header, rows[0])), dict(zip(header, rows[1]))
    rdd = ("tfonspark RDD", "Spark foreachPartition", "tfonspark RDD 1st pass", "Spark foreachPartition 1st pass")
    rdd += tuple(f"{name}, paired" for name in rdd)
    for column in (*rdd, "tfonspark DF", "Spark mapInArrow drain"):
        assert rates[column] not in ("", "n/a"), rates
    for column in rdd:
        assert list_rates[column] not in ("", "n/a"), list_rates
    assert list_rates["tfonspark DF"] == "n/a", "DataFrames have no list rows"
    assert "tabular: tfonspark RDD >= 0.8x Spark foreachPartition" in out
    assert "tabular-list: tfonspark RDD 1st pass >= 0.8x Spark foreachPartition 1st pass" in out
    assert "tabular-list: tfonspark RDD, paired >= 0.8x Spark foreachPartition, paired" in out
    assert re.search(r"- tabular-list warm: \d+\.\d\d\n", out), "the paired ratios are printed"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_inference_benchmark_quick_run_prints_a_table(shared_runs):
    """inference.py measures both Cluster.inference reading styles and predict_batch_udf, first
    pass and warm, and prints its table with the ratios."""
    out = _shared_output(shared_runs, "inference.py")
    header, rows = _table(out)
    assert [r[0] for r in rows] == ["next_batch (rows)", "next_columns", "predict_batch_udf"]
    for row in rows:
        cells = dict(zip(header, row))
        for column in ("first rows/s", "warm rows/s", "first / udf", "warm / udf"):
            assert cells[column] not in ("", "n/a"), cells
    assert "next_columns >= 1.5x predict_batch_udf (warm)" in out


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_streaming_benchmark_quick_run_prints_both_ratios(shared_runs):
    """streaming.py times the streaming and batch feeds and an empty foreachBatch sink in one run."""
    out = _shared_output(shared_runs, "streaming.py")
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


def test_tf_import_benchmark_defers_kerass_extras_in_the_hooked_import():
    """tf_import.py imports real TensorFlow three ways; only the hooked import leaves scikit-learn out."""
    pytest.importorskip("sklearn")  # the [demo] extra; without it no import loads it
    cmd = [sys.executable, str(REPO / "benchmarks" / "tf_import.py"), "--rounds", "1"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = dict(re.findall(r"^round 1 (\S+) .* sklearn loaded: (\w+)$", proc.stdout, re.M))
    assert loaded == {"plain": "True", "gc-only": "True", "hooked": "False"}, proc.stdout
    assert "hooked / gc-only CPU" in proc.stdout


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("TFONSPARK_ALL_SMOKE") != "1",
    reason="two clusters training MNIST (a ps_cluster and MWMS): 108 s in make test, which leaves it out; "
    "TFONSPARK_ALL_SMOKE=1 runs it",
)
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


if __name__ == "__main__":
    _run_shared([tuple(run) for run in json.loads(sys.argv[1])], Path(sys.argv[2]))
