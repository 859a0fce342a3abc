"""demo/node.py: the demo's evaluation on a node."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.timeout(60)


def test_the_demo_evaluation_never_calls_the_model_on_zero_rows():
    from tfonspark.demo.node import predict_classes

    sizes: list[int] = []

    def model(features, training):
        assert len(features) > 0, "called on an empty batch"
        sizes.append(len(features))
        return np.eye(3)[np.full(len(features), 2)]

    assert predict_classes(model, np.zeros((2001, 4), np.float32)).tolist() == [2] * 2001
    assert sizes == [1000, 1000, 1]
    assert predict_classes(model, np.zeros((0, 4), np.float32)).shape == (0,) and sizes == [1000, 1000, 1]
