"""What ``import tensorflow`` costs a TF process, with and without tfonspark's import hook.

    python benchmarks/tf_import.py              # 5 rounds of fresh interpreters, one per variant
    python benchmarks/tf_import.py --rounds 8

Every TF process, standby, spare and TFModel worker imports TensorFlow once. tfonspark runs
that first import through :func:`tfonspark.tfimport.prepare_tensorflow_import`: the cyclic GC
paused, then frozen, and Keras's optional integrations (``keras.wrappers`` with scikit-learn,
``matplotlib.pyplot``), which Keras 3 imports when those packages are installed, deferred to
their first use. Each run is a fresh interpreter that imports TensorFlow and runs one op
(``tf.constant(1)``), and reports its own CPU seconds (user + system) and whether scikit-learn
was loaded:

* ``plain``: ``import tensorflow`` as any program does;
* ``gc-only``: the import with the GC paused, then frozen, nothing deferred (tfonspark before
  the deferral);
* ``hooked``: the same after ``prepare_tensorflow_import()``, as in a TF process.

Variants alternate within each round (the order rotates); medians and the per-round ratios are
printed. Which of scikit-learn and matplotlib this environment has decides the deferred part.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as c  # noqa: E402

PROBE = """\
import json, resource, sys, time
start = time.perf_counter()
if sys.argv[1] == "hooked":
    from tfonspark.tfimport import prepare_tensorflow_import
    prepare_tensorflow_import()
if sys.argv[1] == "gc-only":
    import gc
    from tfonspark.gcpause import paused
    with paused():
        import tensorflow
    gc.freeze()
import tensorflow as tf
tf.constant(1)
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"cpu": usage.ru_utime + usage.ru_stime, "wall": time.perf_counter() - start,
                  "sklearn": "sklearn" in sys.modules}))
"""
VARIANTS = ("plain", "gc-only", "hooked")


def one_run(variant: str) -> dict[str, float]:
    """A fresh interpreter's import of TensorFlow: its CPU and wall seconds."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, variant], capture_output=True, text=True, timeout=300, env=env, check=True
    )
    return json.loads(done.stdout.splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="rounds of one run of each variant (default 5)")
    opts = parser.parse_args(argv)
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    for r in range(opts.rounds):
        for variant in VARIANTS[r % len(VARIANTS) :] + VARIANTS[: r % len(VARIANTS)]:
            run = one_run(variant)
            runs[variant].append(run)
            print(
                f"round {r + 1} {variant:<6} cpu {run['cpu']:.2f}s wall {run['wall']:.2f}s "
                f"sklearn loaded: {run['sklearn']}",
                flush=True,
            )
    rows = [
        [
            variant,
            f"{statistics.median(r['cpu'] for r in runs[variant]):.2f}",
            f"{statistics.median(r['wall'] for r in runs[variant]):.2f}",
            str(runs[variant][-1]["sklearn"]),
        ]
        for variant in VARIANTS
    ]
    print(f"\n## import tensorflow in a fresh interpreter ({opts.rounds} rounds; load average {c.load_average()})\n")
    print(c.markdown_table(["variant", "CPU s (median)", "wall s (median)", "scikit-learn loaded"], rows))
    print()
    for other in ("plain", "gc-only"):
        each = [h["cpu"] / o["cpu"] for h, o in zip(runs["hooked"], runs[other])]
        print(
            f"hooked / {other} CPU, per round: {', '.join(f'{r:.2f}' for r in each)}; median {statistics.median(each):.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
