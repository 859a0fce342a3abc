"""Fixtures of the wire's tests."""

from __future__ import annotations

import pytest

from tests.unit.wire._handshake import handshake_pair


@pytest.fixture
def pair():
    server, s_exc, client, c_exc = handshake_pair()
    assert s_exc is None and c_exc is None
    server.settimeout(5)
    client.settimeout(5)
    yield server, client
    server.close()
    client.close()
