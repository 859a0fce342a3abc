"""demo/data.py: the demo's data helpers: features, a fixed subset of rows, shards."""

from __future__ import annotations

import numpy as np
import pytest

from tfonspark.demo import limit_rows, shard, to_features
from tfonspark.errors import ConfigError

pytestmark = pytest.mark.timeout(60)


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
