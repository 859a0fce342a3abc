"""demo/model.py: the demo's model takes flat images and returns logits."""

from __future__ import annotations

import numpy as np
import pytest

from tfonspark import demo

pytestmark = pytest.mark.timeout(60)


def test_the_model_takes_flat_images_and_returns_logits():
    pytest.importorskip("keras")
    model = demo.build_model((28, 28), 10, total_steps=10)
    assert model.input_shape == (None, 784)
    assert tuple(model(np.zeros((3, 784), np.float32)).shape) == (3, 10)
    assert model.compiled and model.optimizer is not None
