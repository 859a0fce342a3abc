"""The public API is what ``__all__`` says, sorted, and every name in it exists (httpx's test_exported_members)."""

from __future__ import annotations

import importlib
import importlib.resources

import pytest

PUBLIC = [
    "tfonspark",
    "tfonspark.errors",
    "tfonspark.testing",
    "tfonspark.ml",
    "tfonspark.data.tfrecord",
    "tfonspark.demo",
]


@pytest.mark.parametrize("name", PUBLIC)
def test_all_is_sorted_and_complete(name):
    module = importlib.import_module(name)
    exported = list(module.__all__)
    assert exported == sorted(exported), f"{name}.__all__ is not sorted"
    missing = [n for n in exported if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ names what it does not define: {missing}"


def test_the_package_ships_its_type_marker():
    import tfonspark

    assert (importlib.resources.files(tfonspark) / "py.typed").is_file()


def test_top_level_names_users_need():
    import tfonspark

    for name in ("run", "Cluster", "InputMode", "NodeContext", "DataFeed", "Report", "TFCluster", "TFNode"):
        assert name in tfonspark.__all__
