"""stop.py: the tfonspark-stop command line, with a stop file and with an address."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest

from tfonspark import stop as stop_cli
from tfonspark.driver.nodes.rendezvous import RendezvousServer
from tfonspark.driver.nodes.roles import plan_roles
from tfonspark.driver.nodes.stopping import StopFile, write_stop_file

SECRET = hashlib.sha256(b"stop-test-secret").digest()


CLUSTER = "stop-cluster-0123456789"


@pytest.fixture
def server():
    srv = RendezvousServer(CLUSTER, plan_roles(2), SECRET, "127.0.0.1")
    yield srv
    srv.close()


def _stop_file(server: RendezvousServer, tmp_path, cluster_id: str = CLUSTER, secret: bytes = SECRET) -> str:
    host, port = server.address
    return write_stop_file(tmp_path / "stop.json", StopFile(host, port, cluster_id, secret))


def test_cli_with_a_stop_file_and_with_an_address(server, tmp_path, monkeypatch, capsys):
    assert stop_cli.main([_stop_file(server, tmp_path), "--reason", "cli"]) == 0
    assert server.stop_reason == "cli" and "acknowledged" in capsys.readouterr().out
    host, port = server.address
    monkeypatch.delenv(stop_cli.SECRET_ENV_VAR, raising=False)
    assert stop_cli.main(["--address", f"{host}:{port}"]) == 1
    assert stop_cli.SECRET_ENV_VAR in capsys.readouterr().err
    monkeypatch.setenv(stop_cli.SECRET_ENV_VAR, os.urandom(32).hex())
    assert stop_cli.main(["--address", f"{host}:{port}"]) == 1
    assert "AuthenticationError" in capsys.readouterr().err
    monkeypatch.setenv(stop_cli.SECRET_ENV_VAR, SECRET.hex())
    assert stop_cli.main(["--address", f"{host}:{port}"]) == 0


def test_cli_runs_as_a_module(server, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "tfonspark.stop", _stop_file(server, tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert server.stop_reason.startswith("request_stop() from pid")
