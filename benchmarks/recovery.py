"""Recovery after a node loss (issue 13): from the kill to training resumed, and rerunning by hand.

    python benchmarks/recovery.py              # 3 repetitions, ~1 minute each on 2 cores
    python benchmarks/recovery.py --reps 1

Each repetition, on one ``local-cluster[2,1,1024]``, runs the chaos scenario of
``tests/integration/test_restarts.py`` (its node program, ``restart_worker.py``): two workers
train a small MNIST CNN with ``tfonspark.keras.fit(model_dir=..., checkpoint_every_steps=N)``;
worker 1 stops in the middle of epoch 2, this process SIGKILLs its TF process (psutil) and the
driver restarts the cluster (``max_restarts=1``). From ``cluster.restart_log`` and the nodes'
``ctx.report`` timestamps (all on this machine's clock) it splits the time from the kill to the
first training step of attempt 1:

* detection: the kill until the teardown starts: the supervisor sees the exit and tells the
  driver (``Restart.failed_at``), which acts on it (``detect_s``) after giving the other nodes a
  moment to report their own failure;
* teardown and re-reservation (``teardown_s``, ``reserve_s``);
* TF start-up: the TF processes starting (``startup_s``), then ``map_fun`` until the first
  training step of attempt 1 (importing TensorFlow, the strategy's collectives, the restore,
  tracing and running the first step).

Then, by hand: a fresh ``tfonspark.run`` of the same job on a copy of that ``model_dir`` with one
epoch more (so it restores the last checkpoint and trains), timed from the call to its first
training step. The ratio is automatic / by hand; "steps lost" is the steps trained before the
kill minus the step restored.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "tests" / "integration" / "restart_worker.py"
DEFAULT_MNIST = REPO.parent / "shared" / "data" / "mnist"
TRAIN_ROWS, TEST_ROWS, BATCH = 2048, 2000, 64


@dataclass
class Recovery:
    """One repetition's figures (seconds, except steps)."""

    notice: float  # the kill -> the driver learns of it (Restart.failed_at)
    detect: float  # Restart.detect_s
    teardown: float
    reserve: float
    startup: float  # TF processes started (Restart.startup_s)
    first_step: float  # every map_fun running -> the first training step
    total: float  # the kill -> the first training step of attempt 1
    restart_total: float  # Restart.total_s
    by_hand: float
    steps_lost: int
    accuracy: float

    @property
    def detection(self) -> float:
        """The kill until the teardown starts."""
        return self.notice + self.restart_total - self.teardown - self.reserve - self.startup

    @property
    def tf_startup(self) -> float:
        """TF processes starting, then map_fun up to the first training step."""
        return self.startup + self.first_step

    @property
    def ratio(self) -> float:
        return self.total / self.by_hand


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line (``--help``)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=3, help="repetitions (default 3)")
    p.add_argument("--every", type=int, default=8, help="checkpoint_every_steps (default 8)")
    p.add_argument(
        "--kill-at", type=int, default=13, help="steps into epoch 2 (of 4, 32 steps each) at the kill (default 13)"
    )
    p.add_argument("--mnist", default=str(DEFAULT_MNIST), help=f"MNIST idx directory (default {DEFAULT_MNIST})")
    opts = p.parse_args(argv)
    if opts.reps < 1 or opts.every < 1 or not 0 < opts.kill_at < TRAIN_ROWS // BATCH:
        p.error("--reps and --every must be >= 1, --kill-at between 1 and 31")
    return opts


def load_worker() -> ModuleType:
    """The tests' node program, imported from its file and shipped to executors by value."""
    spec = importlib.util.spec_from_file_location("restart_worker", WORKER)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {WORKER}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    c.ship_by_value(module)
    return module


def first_step(chaos: Any, attempt: int) -> float:
    """time.time() of the first training step of ``attempt`` (the earlier of the two workers)."""
    steps = chaos.of("step", attempt)
    if not steps:
        raise RuntimeError(f"attempt {attempt} reported no training step: {[r.metrics for r in chaos.reports]}")
    return min(float(r.metrics["t"]) for r in steps)


def one_rep(rw: ModuleType, sc: Any, data: str, opts: argparse.Namespace, work: str) -> Recovery:
    """The chaos run, then the rerun by hand; the figures of both."""
    import tfonspark

    steps = TRAIN_ROWS // BATCH
    model_dir = os.path.join(work, "model")
    chaos = rw.Chaos(target="tf")
    job = rw.Job(data, model_dir, checkpoint_every=opts.every, hold_at=steps + opts.kill_at, steps_per_epoch=steps)
    with c.quiet_stage("killed run (max_restarts=1)"):
        cluster = tfonspark.run(sc, rw.main, job, 2, on_report=chaos, max_restarts=1, reservation_timeout=120)
        cluster.shutdown(timeout=600)
    if chaos.killed_at is None or cluster.restarts != 1:
        raise RuntimeError(f"expected one kill and one restart: {chaos.kill_error} {cluster.restart_log}")
    (restart,) = cluster.restart_log
    resumed = first_step(chaos, 1)
    started = restart.failed_at + restart.total_s  # every node's map_fun running again
    restored = min(int(r.metrics["iterations"]) for r in chaos.of("begin", 1))
    held = int(chaos.of("hold", 0)[0].metrics["step"])

    again = os.path.join(work, "by-hand")
    shutil.copytree(model_dir, again)
    manual = rw.Chaos(target="")
    more = rw.Job(data, again, epochs=job.epochs + 1, checkpoint_every=opts.every, steps_per_epoch=steps)
    with c.quiet_stage("rerun by hand"):
        called = time.time()
        cluster = tfonspark.run(sc, rw.main, more, 2, on_report=manual, reservation_timeout=120)
        cluster.shutdown(timeout=600)
    return Recovery(
        notice=restart.failed_at - chaos.killed_at,
        detect=restart.detect_s,
        teardown=restart.teardown_s,
        reserve=restart.reserve_s,
        startup=restart.startup_s,
        first_step=resumed - started,
        total=resumed - chaos.killed_at,
        restart_total=restart.total_s,
        by_hand=first_step(manual, 0) - called,
        steps_lost=held - restored,
        accuracy=chaos.accuracy(),
    )


def report(results: list[Recovery], opts: argparse.Namespace) -> None:
    """One line per repetition, then the median table."""
    columns = [
        ("detection", "detection"),
        ("teardown", "teardown"),
        ("reserve", "re-reservation"),
        ("tf_startup", "TF start-up to 1st step"),
        ("total", "kill -> training resumed"),
        ("by_hand", "rerun by hand to 1st step"),
        ("ratio", "auto / by hand"),
    ]
    details = ["notice", "detect", "startup", "first_step"]
    for i, r in enumerate(results):
        cells = ", ".join(f"{name} {getattr(r, name):.2f}" for name in [n for n, _ in columns] + details)
        print(f"rep {i + 1}: {cells}, steps lost {r.steps_lost}, accuracy {r.accuracy:.2f}%", flush=True)
    row = [f"{statistics.median(getattr(r, name) for r in results):.2f}" for name, _ in columns]
    lost = statistics.median(r.steps_lost for r in results)
    print()
    print(
        f"Median of {len(results)} rep(s), seconds; checkpoint_every_steps={opts.every}, kill after "
        f"{opts.kill_at} steps of epoch 2; load average {c.load_average()}:"
    )
    print()
    print(c.markdown_table([label for _, label in columns] + ["steps lost"], [row + [f"{lost:g}"]]))


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    rw = load_worker()
    if not rw.step_checkpoints():
        print("NOTE: tfonspark.keras.fit has no checkpoint_every_steps here: epoch checkpoints only", flush=True)
    work = tempfile.mkdtemp(prefix="tfos-recovery-")
    try:
        data = rw.write_data(os.path.join(work, "mnist.npz"), opts.mnist, TRAIN_ROWS, TEST_ROWS)
        sc, _ = c.fresh_spark()
        results = []
        for rep in range(opts.reps):
            rep_dir = os.path.join(work, f"rep{rep}")
            os.makedirs(rep_dir)
            with c.quiet_stage(f"rep {rep + 1}/{opts.reps}"):
                results.append(one_rep(rw, sc, data, opts, rep_dir))
        report(results, opts)
    finally:
        c.stop_spark()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
