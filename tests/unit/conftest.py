"""Fixtures shared by unit tests."""

from __future__ import annotations

import os
import socket

import pytest

from tfonspark.wire import framing as f


@pytest.fixture
def pair():
    """(supervisor end, driver end) of one signed connection."""
    a, b = socket.socketpair()
    key = os.urandom(32)
    sup, drv = f.Connection(a, key, True), f.Connection(b, key, False)
    yield sup, drv
    sup.close()
    drv.close()
