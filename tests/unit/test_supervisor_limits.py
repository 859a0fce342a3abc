"""The supervisor's hardening (issue 21): no scratch directory left when the TF process cannot be
spawned, and status lines from the TF process bounded before they are read, relayed or sent."""

from __future__ import annotations

import glob
import io
import os
import socket
import tempfile
import types

import pytest

from tfonspark.config import NodeConfig
from tfonspark.executor import supervisor as supervisor_module
from tfonspark.executor.supervisor import Supervisor
from tfonspark.testing import FakeDriver
from tfonspark.wire import framing as f
from tfonspark.wire import messages as m

SECRET_HEX = "5b" * 32


def _config(**overrides) -> NodeConfig:
    fields = {
        "cluster_id": "supervisor-limits-test",
        "driver_host": "127.0.0.1",
        "driver_port": 1,
        "secret_hex": SECRET_HEX,
        "reservation_timeout": 30.0,
    }
    fields.update(overrides)
    return NodeConfig(**fields)


@pytest.fixture
def pair():
    """(supervisor end, driver end) of one signed connection."""
    a, b = socket.socketpair()
    key = os.urandom(32)
    sup, drv = f.Connection(a, key, True), f.Connection(b, key, False)
    yield sup, drv
    sup.close()
    drv.close()


# ---- row 6: a TF process that cannot be spawned leaves no scratch directory -----------------------


def test_a_tf_process_that_cannot_be_spawned_leaves_no_scratch_dir(monkeypatch, tmp_path):
    """EAGAIN from Popen (too many processes): the node fails with the reason, its TMPDIR is gone."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # only this test's scratch dirs are seen
    spawned: list[list[str]] = []

    def no_more_processes(args, *rest, **kwargs):
        spawned.append(args)
        assert glob.glob(str(tmp_path / "tfos-node-*")), "the scratch dir is made before the spawn"
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(supervisor_module.subprocess, "Popen", no_more_processes)
    fake = FakeDriver(SECRET_HEX, heartbeat_secs=0.2)
    try:
        sup = Supervisor(_config(driver_port=fake.port, heartbeat_secs=0.2), 0, [], b"")
        assert sup.run() == 0
        assert spawned, "Popen was called"
        assert glob.glob(str(tmp_path / "tfos-node-*")) == []
        exit_msg = fake.wait_for(m.NodeExit, timeout=10)
        assert exit_msg.exit_code == 1 and not exit_msg.stopped
        assert "BlockingIOError" in exit_msg.traceback and "Resource temporarily unavailable" in exit_msg.traceback
        assert sup.scratch == ""
    finally:
        fake.close()


def test_a_tf_process_spawn_interrupted_by_anything_else_leaves_no_scratch_dir(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(supervisor_module.subprocess, "Popen", interrupted)
    sup = Supervisor(_config(), 0, [], b"")
    ready = m.ClusterReady("worker", 0, {"worker": ["127.0.0.1:1"]})
    with socket.socket() as port_sock, pytest.raises(KeyboardInterrupt):
        port_sock.bind(("127.0.0.1", 0))
        sup._spawn(ready, "127.0.0.1", port_sock, 1)
    assert glob.glob(str(tmp_path / "tfos-node-*")) == [] and sup.scratch == ""


def test_a_real_spawn_still_gets_its_scratch_dir(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    made: list[dict[str, str]] = []

    def fake_popen(args, **kwargs):
        made.append(kwargs["env"])
        return types.SimpleNamespace(stdin=io.BytesIO(), pid=1)

    monkeypatch.setattr(supervisor_module.subprocess, "Popen", fake_popen)
    sup = Supervisor(_config(), 0, [], b"")
    with socket.socket() as port_sock:
        port_sock.bind(("127.0.0.1", 0))
        sup._spawn(m.ClusterReady("worker", 0, {"worker": ["127.0.0.1:1"]}), "127.0.0.1", port_sock, 1)
    assert made[0]["TMPDIR"] == sup.scratch and os.path.isdir(sup.scratch)
