"""executor/forkserver.py: TF processes forked from a real fork server (TensorFlow imported once),
relabelled for ps, in sessions of their own, their exits reported; the server goes with its executor."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil
import pytest

from tests.waiting import wait_until
from tfonspark.executor import forkserver
from tfonspark.host import process_alive

LABEL = ["--cluster", "forkunittest", "--node", "worker:0"]


@pytest.fixture
def executor(tmp_path, monkeypatch):
    """A stand-in Spark executor (a sleeping process) whose fork server the tests use."""
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path / "blockmgr"))  # names the executor
    monkeypatch.setenv("TFONSPARK_FORK_UNIT_TEST", str(tmp_path))  # a digest, so a server, of this test's own
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield proc
    proc.kill()
    proc.wait()


def _fork(executor: subprocess.Popen):
    warm = forkserver.fork(dict(os.environ), LABEL, "", executor.pid)
    assert warm is not None, "no fork server answered"
    return warm


def _server_of(pid: int) -> psutil.Process:
    return psutil.Process(pid).parent()


def test_children_are_relabelled_in_their_own_session_and_their_exits_reported(executor):
    first = _fork(executor)
    child = psutil.Process(first.pid)
    cmdline = " ".join(child.cmdline())
    assert "tfonspark.tfprocess.entry --cluster forkunittest --node worker:0" in cmdline, cmdline
    server = _server_of(first.pid)
    assert "tfonspark.executor.forkserver" in " ".join(server.cmdline())
    assert os.getpgid(first.pid) == first.pid and os.getsid(first.pid) == first.pid  # its group can be killed
    first.let_go()  # EOF where its port would come: it exits at once, as a warm TF process does
    assert first.wait(15) == 0

    second = _fork(executor)  # the same server, TensorFlow imported once
    assert _server_of(second.pid).pid == server.pid
    os.kill(second.pid, signal.SIGKILL)
    assert second.wait(15) == -signal.SIGKILL  # the signal, as a Popen would report it
    second.let_go()

    third = _fork(executor)
    third.discard()  # not used after all: it goes (killed where it did not end at its EOF)
    assert wait_until(lambda: not process_alive(third.pid), 10)
    third.let_go()

    path = forkserver.server_path(os.environ)
    assert os.path.exists(path)
    executor.kill()  # the executor goes: so does its server, and its socket
    assert wait_until(lambda: not process_alive(server.pid), 10)
    assert not os.path.exists(path)


def test_the_environment_tensorflow_is_imported_with_names_the_server():
    env = {"PYTHONPATH": "/a", "HOME": "/root"}
    per_node = {**env, "TF_CONFIG": '{"task": {}}', "TMPDIR": "/tmp/x", "TFONSPARK_ATTEMPT": "2"}
    assert forkserver.import_digest(env) == forkserver.import_digest(per_node)  # what differs per node
    assert forkserver.import_digest(env) != forkserver.import_digest({**env, "PYTHONPATH": "/b"})
    assert forkserver.import_digest(env) != forkserver.import_digest({**env, "TF_USE_LEGACY_KERAS": "1"})


def test_an_idle_server_exits_and_a_later_fork_starts_another(executor, monkeypatch):
    monkeypatch.setattr(forkserver, "IDLE_SECS", 2.0)
    first = _fork(executor)
    server = _server_of(first.pid).pid
    first.let_go()
    assert first.wait(15) == 0
    assert wait_until(lambda: not process_alive(server), 15)  # no child for 2 s
    second = _fork(executor)
    assert _server_of(second.pid).pid != server
    second.let_go()
    assert second.wait(15) == 0
