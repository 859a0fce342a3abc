"""The tf.data service on Spark against local tf.data: elements/s and the consumer's CPU per element.

    python benchmarks/data_service.py            # 20,000 augmented MNIST images per variant
    python benchmarks/data_service.py --quick    # smoke run: 2,000 images, workers 1

A CPU-heavy input pipeline: the MNIST training images (``--data``), read from a raw file of 785-byte records (label, 28x28 pixels),
each image augmented with TF ops costing about 1 ms of CPU (upscale to 56x56, random crop,
flip, brightness and contrast, a 5x5 blur ``--blur`` times, back to 28x28), batched by
``--batch-size``. One consumer reads ``--elements`` images, doing no work of its own, in turn:

* **local**: the pipeline in the consumer's process, ``map(num_parallel_calls=AUTOTUNE)``;
* **service N**: ``tfonspark.data_service(sc, N)`` on ``local-cluster[2,1,1024]`` executors,
  ``parallel_epochs`` (each worker an endless shuffled stream; the consumer takes what it needs).

Reported: elements/s, and the consumer process's CPU seconds per element
(``time.process_time``: every thread of the process, so local tf.data's augmentation counts
there and the service's does not), and the ratio to local. The augmentation's own CPU cost per
image is measured first, single-threaded, in this process.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import fresh_spark, load_average, markdown_table, stop_spark  # noqa: E402
from _data import HELP, default_data  # noqa: E402

RECORD = 785  # one label byte and 28 x 28 pixels


def write_records(data_dir: Path, out: Path) -> int:
    """The training images and labels as one raw file of ``RECORD``-byte records; their count."""
    from tfonspark.demo.datasets import load_mnist

    mnist = load_mnist(data_dir)
    images = mnist.train_images.reshape(len(mnist.train_images), -1)
    records = np.concatenate([mnist.train_labels.reshape(-1, 1).astype(np.uint8), images], axis=1)
    out.write_bytes(records.tobytes())
    return len(records)


def augment(record: Any, blur: int) -> Any:
    """One record: the image augmented (about 1 ms of CPU with the default ``blur``), and its label."""
    import tensorflow as tf

    raw = tf.io.decode_raw(record, tf.uint8)
    label = tf.cast(raw[0], tf.int64)
    image = tf.reshape(tf.cast(raw[1:], tf.float32) / 255.0, [28, 28, 1])
    image = tf.image.resize(image, [56, 56])
    image = tf.image.random_crop(image, [48, 48, 1])
    image = tf.image.random_flip_left_right(image)
    image = tf.image.random_brightness(image, 0.2)
    image = tf.image.random_contrast(image, 0.8, 1.2)
    kernel = tf.ones([5, 5, 1, 1]) / 25.0
    batch = image[tf.newaxis]
    for _ in range(blur):
        batch = tf.nn.conv2d(batch, kernel, strides=1, padding="SAME")
    return tf.image.resize(batch[0], [28, 28]), label


def pipeline(path: str, blur: int, batch_size: int, parallel: Any) -> Any:
    """The endless shuffled stream of augmented batches."""
    import tensorflow as tf

    ds = tf.data.FixedLengthRecordDataset(path, RECORD).shuffle(10_000).repeat()
    ds = ds.map(lambda r: augment(r, blur), num_parallel_calls=parallel)
    return ds.batch(batch_size).prefetch(2)


def consume(ds: Any, batches: int) -> tuple[float, float]:
    """Read ``batches`` batches of ``ds``: (wall seconds, this process's CPU seconds), after 5 warm-up batches."""
    it = iter(ds)
    for _ in range(5):
        next(it)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(batches):
        next(it)
    return time.perf_counter() - wall, time.process_time() - cpu


def image_cost(path: str, blur: int, images: int) -> float:
    """CPU seconds per augmented image, one thread (the pipeline's own cost)."""
    import tensorflow as tf

    ds = tf.data.FixedLengthRecordDataset(path, RECORD).repeat().map(lambda r: augment(r, blur))
    options = tf.data.Options()
    options.threading.private_threadpool_size = 1
    ds = ds.with_options(options)
    it = iter(ds)
    for _ in range(50):
        next(it)
    cpu = time.process_time()
    for _ in range(images):
        next(it)
    return (time.process_time() - cpu) / images


def run_service(sc: Any, workers: int, path: str, opts: argparse.Namespace, batches: int) -> tuple[float, float]:
    """The pipeline on ``workers`` executors through the service; the consumer reads ``batches``."""
    import tfonspark

    with tfonspark.data_service(sc, workers, reservation_timeout=120) as svc:
        ds = svc.distribute(
            pipeline(path, opts.blur, opts.batch_size, 2), "parallel_epochs", job_name=f"bench-{workers}"
        )
        return consume(ds, batches)


def main(argv: list[str] | None = None) -> None:
    opts = parse(argv)
    import tensorflow as tf

    batches = max(1, opts.elements // opts.batch_size)
    elements = batches * opts.batch_size
    with tempfile.TemporaryDirectory(prefix="tfos-bench-ds-") as tmp:
        path = str(Path(tmp) / "mnist-train.bin")
        count = write_records(Path(opts.data), Path(path))
        cost = image_cost(path, opts.blur, 500 if opts.quick else 2000)
        print(f"{count} MNIST images; augmentation: {cost * 1e3:.2f} ms CPU per image (one thread)", flush=True)
        load_before = load_average()
        rows = [
            _row(
                "local tf.data (AUTOTUNE)",
                consume(pipeline(path, opts.blur, opts.batch_size, tf.data.AUTOTUNE), batches),
                elements,
            )
        ]
        sc, _ = fresh_spark(reuse=True)
        for workers in opts.workers:
            rows.append(
                _row(f"service, {workers} executor worker(s)", run_service(sc, workers, path, opts, batches), elements)
            )
        stop_spark()
    base = rows[0][2]
    table = [[name, f"{rate:,.0f}", f"{cpu * 1e6:,.0f}", f"{base / cpu:.1f}x"] for name, rate, cpu in rows]
    print(markdown_table(["variant", "elements/s", "consumer CPU µs/element", "CPU cut vs local"], table))
    print(
        f"\n{elements} elements per variant, batch {opts.batch_size}, blur {opts.blur}; "
        f"load average before {load_before}, after {load_average()}; cores {os.cpu_count()}"
    )
    print("command: python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]))


def _row(name: str, measured: tuple[float, float], elements: int) -> tuple[str, float, float]:
    wall, cpu = measured
    print(f"{name}: {elements / wall:,.0f} elements/s, {cpu / elements * 1e6:,.0f} µs consumer CPU/element", flush=True)
    return name, elements / wall, cpu / elements


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default=default_data(), help=f"directory of the MNIST idx files ({HELP})")
    p.add_argument("--elements", type=int, default=20_000, help="images the consumer reads per variant")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--blur", type=int, default=8, help="5x5 blurs per image (the augmentation's cost)")
    p.add_argument("--workers", default="1,2", help="service variants: executor workers, comma-separated")
    p.add_argument("--quick", action="store_true", help="smoke run: 2,000 images, 1 worker")
    opts = p.parse_args(argv)
    if opts.quick:
        opts.elements, opts.workers = min(opts.elements, 2_000), "1"
    opts.workers = [int(w) for w in str(opts.workers).split(",") if w.strip()]
    return opts


if __name__ == "__main__":
    main()
