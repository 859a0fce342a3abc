"""``python -m tfonspark.demo``: see :mod:`tfonspark.demo`."""

from __future__ import annotations

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
