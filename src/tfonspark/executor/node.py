"""The node task: runs in a Spark Python worker and starts one node's supervisor.

In ``InputMode.TENSORFLOW`` the task holds its executor slot until the TF process exits (as in
TFoS); in ``InputMode.SPARK`` it returns once the node is up so feed tasks can use the slot.
Failures of the TF process itself are reported to the driver by the supervisor; the task raises
only when the node could not be started at all.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

from ..config import InputMode, NodeConfig
from ..errors import ClusterError, ConfigError, ProtocolError
from ..host import executor_pid
from ..wire import events as ev
from ..wire.bootstrap import STATUS_PREFIX, write_bootstrap
from .gpus import check_request, spark_addresses

__all__ = ["node_task", "start_node"]

_POLL_SECS = 5.0  # how often a quiet wait checks that the supervisor still runs
_REAP_SECS = 10.0  # how long a supervisor told to stop may take to exit
_CONFIG_ERROR = "ConfigError: "  # how the supervisor words a ConfigError it failed with (TaskFailed)


class _StatusReader:
    """Status events printed by the supervisor, read straight from its stdout pipe (no Python
    buffering, so readiness of the descriptor is exactly "a line may be waiting")."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        self.proc = proc
        self.fd = proc.stdout.fileno()
        self._pending = b""
        self.eof = False

    def close(self) -> None:
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def events(self, deadline: float | None) -> Iterator[ev.TaskStatus]:
        """Events until EOF, until the supervisor has exited, or until ``deadline``."""
        with selectors.DefaultSelector() as sel:
            sel.register(self.fd, selectors.EVENT_READ)
            while not self.eof:
                while b"\n" in self._pending:
                    raw, self._pending = self._pending.split(b"\n", 1)
                    text = raw.decode("utf-8", "replace")
                    if text.startswith(STATUS_PREFIX):
                        with contextlib.suppress(ProtocolError):
                            status = ev.from_line(text[len(STATUS_PREFIX) :], ev.TaskStatus)
                            assert isinstance(status, ev.TaskStatus)
                            yield status
                left = _POLL_SECS if deadline is None else min(_POLL_SECS, deadline - time.monotonic())
                if left <= 0:
                    return
                if not sel.select(left):
                    if self.proc.poll() is not None:  # exited, yet its stdout is held open elsewhere
                        return
                    continue
                chunk = os.read(self.fd, 65536)
                if not chunk:
                    self.eof = True
                    chunk = b"\n"  # a last line without its newline
                self._pending += chunk


def _stop_supervisor(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the supervisor (it stops its TF process), SIGKILL it if it lingers."""
    with contextlib.suppress(OSError):
        proc.terminate()
    try:
        proc.wait(timeout=_REAP_SECS)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=_REAP_SECS)


def _spawn_supervisor(config: NodeConfig, executor_id: int, payload: bytes, gpus: list[str]) -> subprocess.Popen[bytes]:
    """Start the supervisor process (its own session) and hand it its bootstrap on stdin."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tfonspark.executor.supervisor",
            "--cluster",
            config.cluster_id[:12],
            "--executor",
            str(executor_id),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        header = {"config": config.to_json(), "executor_id": executor_id, "gpus": gpus, "executor_pid": executor_pid()}
        write_bootstrap(proc.stdin, header, payload)
        proc.stdin.close()
    except OSError:
        pass  # it died at once: start_node reports that from its exit code
    return proc


def start_node(
    config: NodeConfig, executor_id: int, payload: bytes, gpus: list[str], wait_for_exit: bool
) -> ev.TaskStatus:
    """Spawn a supervisor for ``executor_id``; return its last status (``TaskUp`` or ``TaskExit``).

    Start-up (registration, the cluster, the TF process coming up) is bounded by the driver's
    two ``reservation_timeout`` waits plus a margin; past that the supervisor is stopped and
    ClusterError raised. Waiting for the node's exit (``wait_for_exit``) is bounded by the
    supervisor's life, which its heartbeat deadline on the driver connection bounds in turn.
    """
    proc = _spawn_supervisor(config, executor_id, payload, gpus)
    reader = _StatusReader(proc)
    startup_secs = 2 * config.reservation_timeout + 120
    last: ev.TaskStatus | None = None
    try:
        for status in reader.events(time.monotonic() + startup_secs):
            last = status
            if not isinstance(status, ev.TaskUp) or not wait_for_exit:  # every other status is the last
                break
        if isinstance(last, ev.TaskUp) and wait_for_exit:
            for status in reader.events(None):
                last = status
        if isinstance(last, ev.TaskFailed) and last.reason.startswith(_CONFIG_ERROR):
            # a setting that cannot work on this host (port_range with no port left, TENSORFLOW_PORT
            # taken ...) stays a ConfigError, the setting named in its text, on the driver too
            reason = last.reason.removeprefix(_CONFIG_ERROR)
            raise ConfigError(f"executor {executor_id}: node could not start: {reason}")
        if isinstance(last, (ev.TaskRejected, ev.TaskFailed)):
            raise ClusterError(f"executor {executor_id}: node could not start: {last.reason}")
        if not isinstance(last, (ev.TaskUp, ev.TaskExit)):
            raise _silent_supervisor(proc, reader, executor_id, startup_secs)
    finally:
        reader.close()
    if isinstance(last, ev.TaskExit):
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=_REAP_SECS)  # reap it: it exits right after reporting
    return last


def _silent_supervisor(
    proc: subprocess.Popen[bytes], reader: _StatusReader, executor_id: int, startup_secs: float
) -> ClusterError:
    """The error for a supervisor that said nothing final: stopped if it still runs, reaped if not."""
    code = proc.poll()
    if code is None and not reader.eof:
        _stop_supervisor(proc)
        return ClusterError(
            f"executor {executor_id}: node did not start within {startup_secs:.0f}s; its supervisor was stopped"
        )
    with contextlib.suppress(subprocess.TimeoutExpired):
        code = proc.wait(timeout=_REAP_SECS)
    return ClusterError(f"executor {executor_id}: the node's supervisor exited without reporting (exit code {code})")


def node_task(config: NodeConfig, payload: bytes) -> Callable[[Iterator[int]], Iterator[ev.TaskStatus]]:
    """The ``mapPartitions`` function that starts the node(s) for the given executor ids."""

    def run(executor_ids: Iterator[int]) -> Iterator[ev.TaskStatus]:
        from pyspark import TaskContext

        task = TaskContext.get()
        resources = task.resources() if task is not None else {}
        gpus = spark_addresses(resources)  # the supervisor applies num_gpus, or picks by nvidia-smi
        check_request(gpus, config.num_gpus, os.environ)  # more GPUs than this node can have: fail now
        wait = config.input_mode == InputMode.TENSORFLOW
        for executor_id in executor_ids:
            yield start_node(config, executor_id, payload, gpus, wait)

    return run
