"""The demo's parts without Spark: progress channel, console, data helpers, feed drain, CLI checks."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from tfonspark import demo
from tfonspark._demo.data import limit_rows, shard, to_features
from tfonspark._demo.feed import DrainableFeed
from tfonspark._demo.progress import (
    ProgressSender,
    ProgressServer,
    format_progress,
    progress_message,
)
from tfonspark.errors import ConfigError
from tfonspark.tfprocess.feedserver import FeedServer

from .test_feed_local import SECRET, Bg, close_feed, feeder_for

pytestmark = pytest.mark.timeout(60)


def wait_for(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


# ---- progress channel ---------------------------------------------------------------------------


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


def test_messages_cross_the_channel_in_order_with_the_worker_added():
    received: list[dict] = []
    with ProgressServer("127.0.0.1", received.append) as server:
        sender = ProgressSender(server.address, server.secret_hex, worker=1)
        sender(progress())
        assert sender.send({"kind": "result", "predictions": list(range(10_000))})
        sender.close()
        assert wait_for(lambda: len(received) == 2)
    first, second = received
    assert first == {
        "worker": 1,
        "kind": "progress",
        "epoch": 1,
        "step": 40,
        "steps": 100,
        "epoch_end": False,
        "rows_per_sec": 1280.0,
        "global_rows": None,
        "logs": {"loss": 0.25, "accuracy": 0.9},
    }
    assert second["kind"] == "result" and second["predictions"][-1] == 9999


def test_a_sender_without_the_secret_is_refused_and_goes_quiet():
    received: list[dict] = []
    with ProgressServer("127.0.0.1", received.append) as server:
        intruder = ProgressSender(server.address, "00" * 32, worker=0)
        assert not intruder.send({"kind": "progress"})
        assert not intruder.send({"kind": "progress"})  # broken: no second attempt
    assert received == []


def test_a_sender_never_raises_when_the_driver_is_gone():
    server = ProgressServer("127.0.0.1", lambda message: None)
    address, secret = server.address, server.secret_hex
    server.close()
    assert not ProgressSender(address, secret, worker=0).send({"kind": "progress"})


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


def test_console_prints_the_chief_sums_rates_and_keeps_the_result(capsys):
    console = demo._Console(epochs=2)
    console({"kind": "progress", "worker": 1, **progress_message(progress(rows=3000))})
    console({"kind": "progress", "worker": 0, **progress_message(progress())})
    console(
        {"kind": "progress", "worker": 0, **progress_message(progress(step=100, epoch_end=True, global_rows=12800))}
    )
    console(
        {"kind": "progress", "worker": 1, **progress_message(progress(step=100, epoch_end=True, global_rows=12800))}
    )
    console({"kind": "result", "worker": 0, "history": {}})
    console({"kind": "something else"})
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2, lines  # worker 1 is summed into the rate, not printed
    assert "2780 rows/s (2 nodes)" in lines[0] and "done:" in lines[1]
    assert console.trained_rows == 12800
    assert console.result == {"kind": "result", "worker": 0, "history": {}}


# ---- data helpers -------------------------------------------------------------------------------


def test_to_features_flattens_and_scales():
    images = np.array([[[0, 255], [51, 102]]], dtype=np.uint8)
    features = to_features(images)
    assert features.dtype == np.float32 and features.shape == (1, 4)
    np.testing.assert_allclose(features, [[0.0, 1.0, 0.2, 0.4]], rtol=1e-6)


def test_limit_rows_is_a_fixed_random_subset():
    images = np.arange(100, dtype=np.uint8).reshape(100, 1, 1)
    labels = np.arange(100) % 10
    small, small_labels = limit_rows(images, labels, 30)
    again, _ = limit_rows(images, labels, 30)
    assert len(small) == 30 and np.array_equal(small, again)
    assert np.array_equal(small.ravel() % 10, small_labels)
    assert len(np.unique(small_labels)) > 5  # drawn at random, not the first 30
    assert limit_rows(images, labels, None)[0] is images
    with pytest.raises(ConfigError, match="max_rows"):
        limit_rows(images, labels, 0)


def test_shards_partition_the_rows():
    rows = np.arange(11)
    parts = [shard(rows, i, 3) for i in range(3)]
    assert sorted(np.concatenate(parts).tolist()) == rows.tolist()
    assert [len(p) for p in parts] == [4, 4, 3]
    with pytest.raises(ConfigError, match="shard index"):
        shard(rows, 3, 3)


# ---- DrainableFeed --------------------------------------------------------------------------------


def fed_server(rows: int, partitions: int) -> tuple[FeedServer, Bg]:
    """A FeedServer being fed ``rows`` (x, label=i) rows in ``partitions`` partitions."""
    server = FeedServer(SECRET)
    feeder = feeder_for(server)
    per = rows // partitions

    def feed_all() -> int:
        total = 0
        for p in range(partitions):
            part = [(np.full(4, i, np.float32), i) for i in range(p * per, (p + 1) * per)]
            total += next(feeder.train_rdd(p, iter(part)))
        close_feed(server)
        return total

    return server, Bg(feed_all)


def test_drain_reads_the_rest_of_the_feed_until_its_end():
    server, feeding = fed_server(3000, 3)
    try:
        feed = DrainableFeed(server)
        first = feed.next_columns(100)
        assert first is not None and first.count == 100
        assert feed.drain() == 2900
        assert feeding.get() == 3000
        assert feed.next_columns(10) is None and feed.drain() == 0
    finally:
        server.close()


def test_concurrent_readers_each_row_exactly_once():
    server, feeding = fed_server(6000, 4)
    try:
        feed = DrainableFeed(server)
        seen: list[np.ndarray] = []
        lock = threading.Lock()

        def read() -> None:
            while (batch := feed.next_columns(37)) is not None:
                with lock:
                    seen.append(np.asarray(batch.columns[1]))

        readers = [Bg(read) for _ in range(3)]
        for reader in readers:
            reader.get()
        assert feeding.get() == 6000
        assert np.array_equal(np.sort(np.concatenate(seen)), np.arange(6000))
    finally:
        server.close()


# ---- CLI ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("option", ["--epochs", "--batch-size", "--max-train-rows", "--nodes"])
def test_main_refuses_counts_below_one_before_starting_spark(option, capsys):
    assert demo.main([option, "0"]) == 1
    err = capsys.readouterr().err
    assert f"ConfigError: {option} must be >= 1. Received: {option}=0" in err


def test_main_reports_a_missing_data_directory(tmp_path, capsys):
    assert demo.main(["--data", str(tmp_path / "nowhere")]) == 1
    assert "data directory does not exist" in capsys.readouterr().err


def test_recipe_defaults_depend_on_the_data_size():
    server = SimpleNamespace(address=("127.0.0.1", 1), secret_hex="ab" * 32)
    dataset = SimpleNamespace(
        image_shape=(28, 28),
        num_classes=10,
        test_images=np.zeros((1, 28, 28), np.uint8),
        test_labels=np.zeros(1, np.uint8),
    )
    args = demo._parse_args([])
    small = demo._node_args(args, dataset, 1438, server, threads=1)
    assert (small.epochs, small.global_batch, small.steps_per_epoch) == (10, 64, 22)
    large = demo._node_args(args, dataset, 60_000, server, threads=1)
    assert (large.epochs, large.global_batch, large.steps_per_epoch) == (3, 128, 468)
    assert large.log_every_steps == 117
    explicit = demo._node_args(
        demo._parse_args(["--epochs", "2", "--batch-size", "100"]), dataset, 60_000, server, threads=1
    )
    assert (explicit.epochs, explicit.global_batch, explicit.steps_per_epoch) == (2, 100, 600)


def test_importing_the_demo_does_not_import_tensorflow():
    import subprocess
    import sys

    code = "import sys, tfonspark.demo; print('tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_model_takes_flat_images_and_returns_logits():
    pytest.importorskip("keras")
    model = demo.build_model((28, 28), 10, total_steps=10)
    assert model.input_shape == (None, 784)
    assert tuple(model(np.zeros((3, 784), np.float32)).shape) == (3, 10)
    assert model.compiled and model.optimizer is not None
