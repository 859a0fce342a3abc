"""Recovery after a node loss (issue 13, 26): from the kill to training resumed, part by part.

    python benchmarks/recovery.py                          # 3 repetitions, ~1 minute each on 2 cores
    python benchmarks/recovery.py --reps 1
    python benchmarks/recovery.py --reps 2 --variants spare,fresh --no-by-hand   # A/B, alternating

Each repetition, on one ``local-cluster[2,1,1024]``, runs the chaos scenario of
``tests/integration/test_restarts.py`` (its node program, ``restart_worker.py``): two workers
train a small MNIST CNN with ``tfonspark.keras.fit(model_dir=..., checkpoint_every_steps=N)``;
worker 1 stops in the middle of epoch 2, this process SIGKILLs its TF process (psutil) and the
driver restarts the cluster (``max_restarts=1``). From ``cluster.restart_log`` and the nodes'
``ctx.report`` timestamps (all on this machine's clock) it splits the time from the kill to the
first training step of attempt 1, each part ending where the next begins:

* detection: the kill until the teardown starts: the supervisor sees the exit and tells the
  driver (``Restart.failed_at``), which acts on it (``detect_s``) after giving the other nodes a
  moment to report their own failure;
* teardown and re-reservation (``teardown_s``; then until every node registered again);
* the slowest node's TF process until ``map_fun`` runs, then in ``map_fun``: importing
  TensorFlow, the strategy forming its collectives, building the model, restoring the
  checkpoint, and tracing and running the first step.

Variants (``--variants``, alternating within each rep): ``spare`` (the default behaviour: each
node of attempt 1 takes over its executor's warm spare TF process, TensorFlow already
imported: ``executor/spare.py``) and ``fresh`` (no spares, as before them; the driver is
patched here not to ask for them).

Then, by hand (after the first variant of each rep; ``--no-by-hand`` skips it): a fresh
``tfonspark.run`` of the same job on a copy of that ``model_dir`` with one epoch more (so it
restores the last checkpoint and trains), timed from the call to its first training step. The
ratio is automatic / by hand; "steps lost" is the steps trained before the kill minus the step
restored.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c  # noqa: E402
from _data import HELP, default_data  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "tests" / "integration" / "restart_worker.py"
TRAIN_ROWS, TEST_ROWS, BATCH = 2048, 2000, 64


@dataclass
class Recovery:
    """One repetition's figures (seconds, except steps); each part ends where the next begins.

    The parts after the re-reservation are the slowest node's (the strategy's collectives and
    the first step wait for every node): its TF process up to ``map_fun`` entered, then inside
    ``map_fun`` (``restart_worker.py``'s reports) importing TensorFlow, the strategy forming its
    collectives, building the model, restoring the checkpoint, and tracing and running the
    first step.
    """

    detection: float  # the kill -> the teardown starts (notice + Restart.detect_s)
    teardown: float
    reserve: float  # the teardown's end -> every node registered again
    spawn: float  # -> every TF process in map_fun (spawned, interpreter, bootstrap, unpickling)
    tf_import: float  # -> TensorFlow imported on every node
    collectives: float  # -> the strategy formed on every node
    model: float  # -> the model built on every node
    restore: float  # -> the checkpoint restored on every node (on_train_begin)
    first_step: float  # -> the first training step done
    total: float  # the kill -> the first training step of attempt 1
    notice: float  # the kill -> the driver learns of it (Restart.failed_at)
    steps_lost: int
    accuracy: float
    spares: int  # nodes of attempt 1 whose TF process was a warm spare
    by_hand: float = float("nan")  # the rerun by hand, call to first step (the first variant of a rep)

    @property
    def tf_startup(self) -> float:
        """From every node registered again to the first training step."""
        return self.spawn + self.tf_import + self.collectives + self.model + self.restore + self.first_step

    @property
    def ratio(self) -> float:
        return self.total / self.by_hand


def _latest(chaos: Any, kind: str, key: str = "t") -> float:
    """The slowest node's ``key`` in its ``kind`` report of attempt 1."""
    return max(float(r.metrics[key]) for r in chaos.of(kind, 1))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line (``--help``)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=3, help="repetitions (default 3)")
    p.add_argument("--every", type=int, default=8, help="checkpoint_every_steps (default 8)")
    p.add_argument(
        "--kill-at", type=int, default=13, help="steps into epoch 2 (of 4, 32 steps each) at the kill (default 13)"
    )
    p.add_argument("--mnist", default=default_data(), help=f"MNIST idx directory ({HELP})")
    p.add_argument(
        "--variants",
        default="spare",
        help="comma-separated, alternating in each rep: spare (warm spare TF processes, the default "
        "behaviour) and fresh (none, as before them); default spare",
    )
    p.add_argument("--no-by-hand", action="store_true", help="skip the rerun by hand")
    opts = p.parse_args(argv)
    opts.variants = [v.strip() for v in opts.variants.split(",") if v.strip()]
    if not opts.variants or set(opts.variants) - {"spare", "fresh"}:
        p.error("--variants takes spare and/or fresh")
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


@contextlib.contextmanager
def spares(on: bool) -> Iterator[None]:
    """Run the clusters started meanwhile with (the default) or without warm spares (``--variants``).

    Without: the driver never marks a node to keep a spare (``Attempts``), as before spares.
    """
    from tfonspark.driver.nodes.restarts import Attempts

    original = Attempts._mark_spares
    if not on:
        Attempts._mark_spares = lambda self, attempt: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        Attempts._mark_spares = original  # type: ignore[method-assign]


def killed_run(rw: ModuleType, sc: Any, data: str, opts: argparse.Namespace, model_dir: str) -> Recovery:
    """The chaos run: worker 1's TF process SIGKILLed in epoch 2; the figures of its recovery."""
    import tfonspark

    steps = TRAIN_ROWS // BATCH
    chaos = rw.Chaos(target="tf")
    job = rw.Job(data, model_dir, checkpoint_every=opts.every, hold_at=steps + opts.kill_at, steps_per_epoch=steps)
    with c.quiet_stage("killed run (max_restarts=1)"):
        cluster = tfonspark.run(sc, rw.main, job, 2, on_report=chaos, max_restarts=1, reservation_timeout=120)
        cluster.shutdown(timeout=600)
    if chaos.killed_at is None or cluster.restarts != 1:
        raise RuntimeError(f"expected one kill and one restart: {chaos.kill_error} {cluster.restart_log}")
    (restart,) = cluster.restart_log
    resumed = first_step(chaos, 1)
    torn_down = restart.failed_at + restart.detect_s  # the teardown starts
    registered = restart.failed_at + restart.total_s - restart.startup_s  # every node registered again
    marks = [
        _latest(chaos, "start"),
        _latest(chaos, "ready", "imported"),
        _latest(chaos, "ready", "strategy"),
        _latest(chaos, "ready"),
        _latest(chaos, "begin"),
        resumed,
    ]
    parts = [b - a for a, b in zip([registered, *marks[:-1]], marks, strict=True)]
    restored = min(int(r.metrics["iterations"]) for r in chaos.of("begin", 1))
    held = int(chaos.of("hold", 0)[0].metrics["step"])
    return Recovery(
        torn_down - chaos.killed_at,
        restart.teardown_s,
        registered - torn_down - restart.teardown_s,
        *parts,
        total=resumed - chaos.killed_at,
        notice=restart.failed_at - chaos.killed_at,
        steps_lost=held - restored,
        accuracy=chaos.accuracy(),
        spares=sum(1 for r in chaos.of("start", 1) if r.metrics.get("spare")),
    )


def by_hand(rw: ModuleType, sc: Any, data: str, opts: argparse.Namespace, model_dir: str, work: str) -> float:
    """A fresh ``tfonspark.run`` on a copy of ``model_dir`` with one epoch more: the call to its first step."""
    import tfonspark

    steps = TRAIN_ROWS // BATCH
    again = os.path.join(work, "by-hand")
    shutil.copytree(model_dir, again)
    manual = rw.Chaos(target="")
    more = rw.Job(data, again, epochs=rw.Job.epochs + 1, checkpoint_every=opts.every, steps_per_epoch=steps)
    with c.quiet_stage("rerun by hand"):
        called = time.time()
        cluster = tfonspark.run(sc, rw.main, more, 2, on_report=manual, reservation_timeout=120)
        cluster.shutdown(timeout=600)
    return first_step(manual, 0) - called


def report(results: dict[str, list[Recovery]], opts: argparse.Namespace) -> None:
    """One line per repetition, then the median table, one row per variant."""
    columns = [
        ("detection", "detection"),
        ("teardown", "teardown"),
        ("reserve", "re-reservation"),
        ("spawn", "TF process to map_fun"),
        ("tf_import", "import TF"),
        ("collectives", "strategy (collectives)"),
        ("model", "model built"),
        ("restore", "restore"),
        ("first_step", "1st step (trace + run)"),
        ("total", "kill -> training resumed"),
        ("by_hand", "rerun by hand to 1st step"),
        ("ratio", "auto / by hand"),
    ]
    details = ["notice", "tf_startup"]
    rows = []
    for variant, runs in results.items():
        for i, r in enumerate(runs):
            cells = ", ".join(f"{name} {getattr(r, name):.2f}" for name in [n for n, _ in columns] + details)
            print(
                f"{variant} rep {i + 1}: {cells}, spares used {r.spares}/2, steps lost {r.steps_lost}, "
                f"accuracy {r.accuracy:.2f}%",
                flush=True,
            )
        row = [f"{statistics.median(getattr(r, name) for r in runs):.2f}" for name, _ in columns]
        lost = statistics.median(r.steps_lost for r in runs)
        rows.append([variant, *row, f"{lost:g}"])
    print()
    print(
        f"Median of {opts.reps} rep(s), seconds; checkpoint_every_steps={opts.every}, kill after "
        f"{opts.kill_at} steps of epoch 2; load average {c.load_average()}:"
    )
    print()
    print(c.markdown_table(["variant", *[label for _, label in columns], "steps lost"], rows))


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
        results: dict[str, list[Recovery]] = {v: [] for v in opts.variants}
        for rep in range(opts.reps):
            for k, variant in enumerate(c.rotate(opts.variants, rep)):
                rep_dir = os.path.join(work, f"rep{rep}-{variant}")
                model_dir = os.path.join(rep_dir, "model")
                os.makedirs(rep_dir)
                with c.quiet_stage(f"rep {rep + 1}/{opts.reps}, {variant} (load {c.load_average()})"):
                    with spares(variant == "spare"):
                        result = killed_run(rw, sc, data, opts, model_dir)
                    if k == 0 and not opts.no_by_hand:
                        result.by_hand = by_hand(rw, sc, data, opts, model_dir, rep_dir)
                results[variant].append(result)
        report(results, opts)
    finally:
        c.stop_spark()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
