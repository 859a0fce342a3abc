"""demo/__init__.py: the demo package's public names, and that importing it imports no TensorFlow."""

from __future__ import annotations

import pytest

from tfonspark import demo
from tfonspark.demo import to_features

pytestmark = pytest.mark.timeout(60)


def test_importing_the_demo_does_not_import_tensorflow():
    import subprocess
    import sys

    code = "import sys, tfonspark.demo; print('tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_public_names_are_the_package_s():
    assert demo.__all__ == sorted(demo.__all__)
    assert all(hasattr(demo, name) for name in demo.__all__)
    assert demo.to_features is to_features and demo.DEFAULT_MASTER == "local-cluster[2,1,1024]"
