"""What tf.debugging costs a training step: the tensorfx MNIST CNN, batch 64, one process.

    python examples/tensorfx/debug_overhead.py

Times ``model.train_step`` (a fresh ``tf.function`` per round, so each is traced with the
option on or off) for 40 steps on a fixed random batch: off (the trainer's default, nothing
instrumented), with ``check_numerics`` and with Debugger V2 dumps (``CONCISE_HEALTH``), three
interleaved rounds each; prints the median ms per step.
"""

import os
import sys
import tempfile
import time

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mnist as m  # noqa: E402

args = m.MnistArgs.parse(["--data", os.path.dirname(os.path.abspath(__file__)), "--mode", "local"])
rng = np.random.default_rng(0)
rows = (rng.random((64, 784), dtype=np.float32), rng.integers(0, 10, 64))
builder = m.MnistBuilder(args, {"train": rows})
graph = builder.build_training_graph()
batch = next(iter(builder.build_input("train", 64, 1, False)))


def timed(mode, steps=40):
    if mode == "numerics":
        tf.debugging.enable_check_numerics()
    if mode == "dump":
        tf.debugging.experimental.enable_dump_debug_info(
            tempfile.mkdtemp(), tensor_debug_mode="CONCISE_HEALTH", circular_buffer_size=-1
        )
    step = tf.function(graph.model.train_step)
    step(batch)  # trace
    t = time.perf_counter()
    for _ in range(steps):
        step(batch)
    float(graph.model.optimizer.iterations.numpy())
    elapsed = (time.perf_counter() - t) / steps
    tf.debugging.disable_check_numerics()
    tf.debugging.experimental.disable_dump_debug_info()
    return elapsed


results = {"off": [], "numerics": [], "dump": []}
for _ in range(3):
    for mode in results:
        results[mode].append(timed(mode))
for mode, values in results.items():
    print(f"{mode:9s} median {1000 * np.median(values):.1f} ms/step  ({', '.join(f'{1000 * v:.1f}' for v in values)})")
