"""No module of the data package uses pickle."""

from __future__ import annotations

from pathlib import Path

import tfonspark.data as data_pkg


def test_no_pickle_in_the_data_package():
    root = Path(data_pkg.__file__).parent
    for source in root.rglob("*.py"):
        assert "pickle" not in source.read_text(), source
