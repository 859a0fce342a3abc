"""Polling a condition until a deadline: the one helper every test that waits on another thread
or process uses."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["wait_until"]


def wait_until(predicate: Callable[[], object], timeout: float = 10.0, interval: float = 0.02) -> bool:
    """Whether ``predicate()`` became true within ``timeout`` seconds (asked every ``interval``
    seconds, and once more at the deadline)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())
