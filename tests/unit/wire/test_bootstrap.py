"""wire/bootstrap.py: the bootstrap a supervisor hands its TF process, written and read back."""

from __future__ import annotations

import io

import pytest

from tfonspark.errors import ProtocolError
from tfonspark.wire import bootstrap


def test_bootstrap_round_trip():
    stream = io.BytesIO()
    bootstrap.write_bootstrap(stream, {"config": "{}", "port_fd": 7}, b"\x00payload\xff" * 1000)
    stream.seek(0)
    header, payload = bootstrap.read_bootstrap(stream)
    assert header == {"config": "{}", "port_fd": 7}
    assert payload == b"\x00payload\xff" * 1000


@pytest.mark.parametrize("cut", [0, 3, 8, 12, -1])
def test_bootstrap_truncated_is_a_protocol_error(cut):
    stream = io.BytesIO()
    bootstrap.write_bootstrap(stream, {"a": 1}, b"payload")
    data = stream.getvalue()
    with pytest.raises(ProtocolError, match="truncated"):
        bootstrap.read_bootstrap(io.BytesIO(data[:cut]))
