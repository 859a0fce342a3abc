"""host.py: which addresses are wildcards, the bind address against the advertised one, executor keys
and liveness."""

from __future__ import annotations

import os
import time

import pytest

from tfonspark import host
from tfonspark.host import executor_key


@pytest.mark.parametrize("address", ["", "0.0.0.0", "::", "[::]", " 0.0.0.0 "])
def test_wildcards_are_recognised(address):
    assert host.is_wildcard(address)


@pytest.mark.parametrize("address", ["127.0.0.1", "10.1.2.3", "::1", "node-7.example"])
def test_addresses_are_not_wildcards(address):
    assert not host.is_wildcard(address)


def test_bind_address_defaults_to_the_advertised_one():
    assert host.bind_address("", "10.1.2.3") == "10.1.2.3"
    assert host.bind_address("0.0.0.0", "10.1.2.3") == "0.0.0.0"
    assert host.bind_address("127.0.0.1", "10.1.2.3") == "127.0.0.1"


def test_a_wildcard_spark_local_ip_is_never_advertised(monkeypatch):
    monkeypatch.setenv("SPARK_LOCAL_IP", "0.0.0.0")
    found = host.local_ip_towards("127.0.0.1")
    assert found and not host.is_wildcard(found)
    monkeypatch.setenv("SPARK_LOCAL_IP", "10.9.8.7")
    assert host.local_ip_towards("127.0.0.1") == "10.9.8.7"


# ---- TensorBoard: binds the bind host, advertises the node's address ---------------------------


# ---- the reservation holds the port on every family (issue 21, row 8) --------------------------


# ---- issue 43: a reservation kept across servers (share, seal), and who else listens -------------


def test_executor_key_outside_spark(monkeypatch):
    monkeypatch.delenv("SPARK_LOCAL_DIRS", raising=False)
    key = executor_key()
    assert key == executor_key() and len(key) == 16
    monkeypatch.setenv("SPARK_LOCAL_DIRS", "/tmp/blockmgr-1")
    other = executor_key()
    monkeypatch.setenv("SPARK_LOCAL_DIRS", "/tmp/blockmgr-2")
    assert len({key, other, executor_key()}) == 3


def test_executor_liveness_sees_exited_and_zombie_processes():
    import subprocess

    from tfonspark.host import executor_pid, process_alive

    assert process_alive(os.getpid())
    assert executor_pid() == 0  # pytest is not a Spark JVM's Python worker
    child = subprocess.Popen(["sleep", "600"])
    assert process_alive(child.pid)
    child.kill()
    time.sleep(0.2)  # killed, not reaped yet: a zombie
    assert not process_alive(child.pid)
    child.wait()
    assert not process_alive(child.pid)
