"""dfutil.py: TFoS's dfutil names, exported from the data package."""

from __future__ import annotations

import tfonspark.data as data_pkg
from tfonspark import dfutil
from tfonspark.data import tfrecord as tr


def test_exported_members():
    for module in (tr, data_pkg, dfutil):
        assert module.__all__ == sorted(module.__all__)
        for name in module.__all__:
            assert hasattr(module, name), f"{module.__name__}.{name}"
    assert set(dfutil.__all__) == {"isLoadedDF", "loadTFRecords", "loadedDF", "saveAsTFRecords"}
    assert dfutil.loadedDF is tr.loaded_dfs
    assert not dfutil.isLoadedDF(object()) and not dfutil.isLoadedDF([])
