"""Stop requests (TFoS ``request_stop``): authenticated, from a private stop file, by helper and CLI."""

from __future__ import annotations

import hashlib
import json
import os
import stat

import pytest

import tfonspark
from tfonspark.driver.nodes.rendezvous import RendezvousServer
from tfonspark.driver.nodes.roles import plan_roles
from tfonspark.driver.nodes.stopping import StopFile, read_stop_file, write_stop_file
from tfonspark.errors import AuthenticationError, ClusterError, ConfigError

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


def test_a_stop_file_request_is_recorded(server, tmp_path):
    tfonspark.request_stop(_stop_file(server, tmp_path), reason="operator asked")
    assert server.stop_reason == "operator asked"
    tfonspark.request_stop(_stop_file(server, tmp_path), reason="second")
    assert server.stop_reason == "operator asked", "the first reason is kept"


def test_an_address_and_hex_secret_work_too(server):
    host, port = server.address
    tfonspark.request_stop(f"{host}:{port}", SECRET.hex())
    assert server.stop_reason.startswith("request_stop() from pid")


def test_a_wrong_secret_is_refused_before_anything_is_parsed(server):
    host, port = server.address
    rejected = server.rejected
    with pytest.raises(AuthenticationError, match="refused the stop request"):
        tfonspark.request_stop((host, port), os.urandom(32), timeout=5)
    assert server.stop_reason == ""
    assert server.rejected == rejected + 1


def test_a_stop_file_of_another_cluster_is_rejected(server, tmp_path):
    with pytest.raises(ClusterError, match="not other-cluster"):
        tfonspark.request_stop(_stop_file(server, tmp_path, cluster_id="other-cluster"))
    assert server.stop_reason == ""


def test_no_driver_listening_is_a_cluster_error(server, tmp_path):
    path = _stop_file(server, tmp_path)
    server.close()
    with pytest.raises(ClusterError, match="has the cluster shut down"):
        tfonspark.request_stop(path, timeout=2)


def test_stop_file_is_private_whole_and_hides_its_secret(tmp_path):
    stop = StopFile("10.0.0.1", 4242, CLUSTER, SECRET)
    path = write_stop_file(tmp_path / "s.json", stop)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert read_stop_file(path) == stop
    assert SECRET.hex() not in repr(stop)
    assert [p.name for p in tmp_path.iterdir()] == ["s.json"], "no temporary file left"
    fresh = write_stop_file(None, stop)
    try:
        assert stat.S_IMODE(os.stat(fresh).st_mode) == 0o600 and read_stop_file(fresh) == stop
    finally:
        os.unlink(fresh)


@pytest.mark.parametrize(
    "content, expected",
    [
        (None, "does not exist"),
        ("not json", "cannot read stop file"),
        (json.dumps({"format": "x"}), "is not a tfonspark stop file"),
        (json.dumps({"format": "tfonspark-stop-file/1", "address": [1], "cluster_id": "", "secret": ""}), "is not"),
    ],
)
def test_bad_stop_files_name_the_file(tmp_path, content, expected):
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=expected) as info:
        tfonspark.request_stop(path)
    assert "bad.json" in str(info.value)


@pytest.mark.parametrize(
    "target, secret, expected",
    [(12, None, "Received: int without a secret"), ("nohost", SECRET, "host:port"), ("h:1", "zz", "not hex")],
)
def test_bad_targets_say_what_is_valid(target, secret, expected):
    with pytest.raises(ConfigError, match=expected):
        tfonspark.request_stop(target, secret)
