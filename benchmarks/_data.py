"""Where the benchmarks read MNIST-family idx files when no flag names a directory: one place.

``$TFONSPARK_DATA`` (the examples' variable) for MNIST; else the project's data checkout beside
this repository, where the project's machines keep MNIST and Fashion-MNIST. Users pass the
benchmark's own flag (``--data``/``--mnist``/``--fashion``) instead.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["HELP", "default_data"]

_BESIDE = Path(__file__).resolve().parents[2] / "shared" / "data"
HELP = "default: $TFONSPARK_DATA for MNIST, else the project's data checkout beside the repository"


def default_data(name: str = "mnist") -> str:
    """The directory of ``name``'s idx files to read when no flag names one (it may not exist:
    then loading it says which file is missing, and where)."""
    if name == "mnist" and os.environ.get("TFONSPARK_DATA"):
        return os.environ["TFONSPARK_DATA"]
    return str(_BESIDE / name)
