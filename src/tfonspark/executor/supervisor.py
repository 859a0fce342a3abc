"""The supervisor: a small process (no TensorFlow) that owns one node's TF process.

It reserves the node's port, registers with the driver, spawns the TF process, tees its output
(keeping the tail for error reports), forwards "up"/"exit" events, and stops the TF process when
the driver says so or when the driver connection drops. Because it, not the Spark task, is the
TF process's parent, a TF process killed by a signal is still reported with its output tail.

Run as ``python -m tfonspark.executor.supervisor --cluster ID --executor N``; the arguments only
label the process for ``ps`` (and for tests that check nothing is left behind). The bootstrap
arrives on stdin; status lines (``TFOS-STATUS {json}``) go to stdout for the spawning task.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from typing import IO, Any

from ..config import NodeConfig
from ..errors import ProtocolError
from ..wire import messages as m
from ..wire.bootstrap import read_bootstrap, write_bootstrap
from ..wire.framing import Connection, connect, remove_unix_socket
from .host import executor_key, local_ip_towards, reserve_port

STATUS_PREFIX = "TFOS-STATUS "
TAIL_LINES = 60


def _status(event: str, **fields: Any) -> None:
    """Tell the spawning Spark task what happened; it may have gone already (SPARK mode)."""
    try:
        sys.stdout.write(STATUS_PREFIX + json.dumps({"event": event, **fields}) + "\n")
        sys.stdout.flush()
    except (BrokenPipeError, ValueError, OSError):
        pass


class Supervisor:
    def __init__(self, config: NodeConfig, executor_id: int, gpus: list[str], payload: bytes) -> None:
        self.config = config
        self.executor_id = executor_id
        self.gpus = gpus
        self.payload = payload
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.stopping = False
        self.proc: subprocess.Popen | None = None
        self.data_path = ""  # the TF process's feed socket, removed after it exits
        self._lock = threading.Lock()

    def run(self) -> int:
        port_sock = reserve_port()
        host = local_ip_towards(self.config.driver_host)
        conn = connect((self.config.driver_host, self.config.driver_port), self.config.secret)
        try:
            return self._run(conn, host, port_sock)
        finally:
            port_sock.close()
            conn.close()

    def _run(self, conn: Connection, host: str, port_sock) -> int:
        port = port_sock.getsockname()[1]
        m.send_message(conn, m.Register(self.executor_id, host, port, executor_key(), os.getpid(),
                                        self.config.cluster_id))
        conn.settimeout(self.config.reservation_timeout + 60)
        reply = m.recv_message(conn, m.ClusterReady, m.Reject)
        conn.settimeout(None)
        if isinstance(reply, m.Reject):
            _status("rejected", reason=reply.reason)
            return 2
        assert isinstance(reply, m.ClusterReady)
        status_r, status_w = os.pipe()
        self.proc = self._spawn(reply, host, port_sock, status_w)
        os.close(status_w)
        port_sock.close()  # the TF process holds the reservation now; it alone releases it
        threading.Thread(target=self._listen, args=(conn,), daemon=True).start()
        tee = threading.Thread(target=self._tee, args=(self.proc.stdout,), daemon=True)
        tee.start()
        error = self._relay_status(conn, os.fdopen(status_r, "r"))
        code = self.proc.wait()
        _kill_group(self.proc.pid)  # children it left behind (TensorBoard, helpers)
        remove_unix_socket(self.data_path)  # left behind if the TF process was killed
        tee.join(timeout=5)
        exit_msg = m.NodeExit(self.executor_id, code, error, "".join(self.tail)[-16000:], self.stopping)
        with contextlib.suppress(OSError):
            m.send_message(conn, exit_msg)
        _status("exit", exit_code=code, stopped=self.stopping, traceback=error)
        return 0

    def _spawn(self, ready: m.ClusterReady, host: str, port_sock, status_w: int) -> subprocess.Popen:
        from ..driver.plan import build_tf_config

        env = dict(os.environ)
        env["TF_CONFIG"] = build_tf_config(ready.cluster_spec, ready.job_name, ready.task_index)
        env["PYTHONUNBUFFERED"] = "1"
        if self.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self.gpus)
        header = {
            "config": self.config.to_json(), "executor_id": self.executor_id,
            "job_name": ready.job_name, "task_index": ready.task_index,
            "cluster_spec": ready.cluster_spec, "host": host, "port_fd": port_sock.fileno(),
            "status_fd": status_w, "working_dir": os.getcwd(),
        }
        proc = subprocess.Popen(
            [sys.executable, "-m", "tfonspark.tfprocess.entry", "--cluster",
             self.config.cluster_id[:12], "--node", f"{ready.job_name}:{ready.task_index}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
            pass_fds=(port_sock.fileno(), status_w), start_new_session=True)
        assert proc.stdin is not None
        write_bootstrap(proc.stdin, header, self.payload)  # stdin stays open: EOF = we died
        return proc

    def _relay_status(self, conn: Connection, status: IO[str]) -> str:
        """Forward the TF process's "up" event; return the traceback it reports, if any."""
        error = ""
        for line in status:
            event = json.loads(line)
            if event["event"] == "up":
                assert self.proc is not None
                up = m.NodeUp(self.executor_id, self.proc.pid, event["host"], event["data_port"],
                              event.get("tensorboard_url", ""), event.get("data_path", ""))
                self.data_path = up.data_path
                m.send_message(conn, up)
                _status("up", tf_pid=self.proc.pid)
            elif event["event"] == "error":
                error = event["traceback"]
        return error

    def _tee(self, stream: IO[bytes] | None) -> None:
        """Copy the TF process's output to our stderr (the executor log), keeping the tail."""
        if stream is None:
            return
        out = sys.stderr.buffer
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace")
            self.tail.append(line)
            try:
                out.write(raw)
                out.flush()
            except (OSError, ValueError):
                pass

    def _listen(self, conn: Connection) -> None:
        """Wait for Stop from the driver; a dropped connection means the driver is gone."""
        grace = 0.0
        try:
            msg = m.recv_message(conn, m.Stop)
            assert isinstance(msg, m.Stop)
            grace = msg.grace_secs
        except (OSError, ProtocolError):
            pass
        self.terminate(grace)

    def terminate(self, grace: float) -> None:
        """SIGTERM the TF process group, SIGKILL after ``grace`` seconds."""
        with self._lock:
            proc = self.proc
            if proc is None or proc.poll() is not None:
                return
            self.stopping = True
        _kill_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=max(grace, 0.5))
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)


def _kill_group(pgid: int, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def main() -> int:
    header, payload = read_bootstrap(sys.stdin.buffer)
    config = NodeConfig.from_json(header["config"])
    supervisor = Supervisor(config, int(header["executor_id"]), list(header.get("gpus", [])), payload)
    signal.signal(signal.SIGTERM, lambda *_: supervisor.terminate(2.0))
    try:
        return supervisor.run()
    except Exception as exc:  # report anything to the task that spawned us, then fail
        _status("failed", reason=f"{type(exc).__name__}: {exc}")
        return 1


if __name__ == "__main__":
    os._exit(main())
