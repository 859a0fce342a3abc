"""The supervisor: a small process (no TensorFlow) that owns one node's TF process.

It reserves the node's port, registers with the driver, spawns the TF process, tees its output
(keeping the tail for error reports), forwards its events (``ProcessUp`` as ``NodeUp``, each
``NodeEvent`` as it is: :mod:`..wire.events`) and its exit, and stops the TF process when the
driver says so, when the driver connection drops, or when the driver stays silent for
``heartbeat_timeout`` (it sends a ``Heartbeat`` every ``heartbeat_secs``, and so do we, from
``ClusterReady`` on). Because it, not the Spark task, is the TF process's parent, a TF process
killed by a signal is still reported with its output tail, and its feed socket (announced by an
early ``FeedSocket`` event) is removed. What the TF process writes is bounded before it is
relayed: a status line by ``MAX_STATUS_LINE``, an event by
``MAX_EVENT_BYTES`` (the driver holds every supervisor to the same limit).

Run as ``python -m tfonspark.executor.supervisor --cluster ID --executor N``; the arguments only
label the process for ``ps`` (and for tests that check nothing is left behind). The bootstrap
arrives on stdin; status lines (``TFOS-STATUS`` and a ``TaskStatus`` event) go to stdout for the
spawning task.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import IO

from ..config import NodeConfig
from ..distribute.tf_config import TF_CONFIG_ENV, build_tf_config
from ..errors import ConfigError, ProtocolError
from ..host import (
    SCRATCH_PREFIX,
    executor_key,
    local_ip_towards,
    process_alive,
    remove_scratch,
)
from ..ports import reserve_port, seal_port
from ..settings import COLLECTIVE_ENV
from ..wire import events as ev
from ..wire import messages as m
from ..wire.bootstrap import STATUS_PREFIX, read_bootstrap, write_bootstrap
from ..wire.framing import Connection, connect, remove_unix_socket
from . import tfos_env
from .gpus import assign as assign_gpus
from .gpus import cuda_env
from .spare import SPARE_DELAY_SECS, Adopted, Keeper, adopt, env_digest, spare_paths
from .standby import WARM_CODE, Standby, wait_accepting

TAIL_LINES = 60
MAX_EVENT_BYTES = 65 * 1024
"""The largest ``NodeEvent`` a supervisor relays and the driver accepts, JSON-encoded as sent: a
report of ``tfprocess.report.MAX_REPORT_BYTES`` (64 KiB) and its envelope (its type). The
supervisor drops a larger one with an error in its log; so does the driver."""
MAX_STATUS_LINE = 1024 * 1024
"""The longest status line read from the TF process (an error's traceback is the longest one
that is legitimate). A longer line is skipped, not read into memory, with an error in the log;
a traceback that long still reaches the driver in the node's output tail."""
ATTEMPT_ENV = "TFONSPARK_ATTEMPT"  # the TF process's ctx.attempt (0 = first start of the cluster)
SERVER_RESTARTS = 3
"""How many times a worker that only serves (``ps_cluster``, ``run(..., coordinator=True)``) is
restarted in place at least; ``max_restarts`` raises it (``NodeConfig.server_restarts``)."""
CLUSTER_MARGIN_SECS = 60.0  # past reservation_timeout, how long to wait for the cluster
EXECUTOR_POLL_SECS = 1.0  # how often the supervisor checks that its Spark executor still runs
SPARE_JOBS = ("chief", "master", "worker")  # nodes that keep a spare for a cluster restart (executor/spare.py)
_SKIP_CHUNK = 64 * 1024  # how an overlong status line is read past

log = logging.getLogger(__name__)


def _status(status: ev.TaskStatus) -> None:
    """Tell the spawning Spark task what happened; it may have gone already (SPARK mode)."""
    try:
        sys.stdout.write(STATUS_PREFIX + ev.to_line(status))
        sys.stdout.flush()
    except (BrokenPipeError, ValueError, OSError):
        pass


class Supervisor:
    def __init__(
        self, config: NodeConfig, executor_id: int, gpus: list[str], payload: bytes, executor_pid: int = 0
    ) -> None:
        self.config = config
        self.executor_pid = executor_pid  # the Spark executor JVM: the node goes when it goes (0 = none)
        self.executor_gone = ""  # why the TF process was stopped with its executor
        self.executor_id = executor_id
        self.gpus = gpus
        self.keras_env: dict[str, str] = {}  # executor/tfos_env.py's variables for the TF process
        self.payload = payload
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.stopping = False
        self.proc: subprocess.Popen[bytes] | Adopted | None = None
        self.data_path = ""  # the TF process's feed socket, removed after it exits
        self.scratch = ""  # the TF process's TMPDIR, removed after it exits
        self.done = threading.Event()  # set once the TF process has exited (stops the heartbeats)
        self.job_name = ""  # the node's TF job, once the driver said it
        self.restarts = 0  # how many times the TF process was restarted in place
        self.stop_asked = False  # the driver, a signal or the executor's exit asked us to stop: no restart
        self.stop_final = False  # the driver's Stop said no cluster restart follows: the spare goes at once
        self._standby: Standby | None = None  # the next TF process of a worker that restarts in place
        self._held: socket.socket | None = None  # the node's reservation, kept by a worker that restarts in place
        self._keeper: Keeper | None = None  # the spare for the next attempt's node, while one may follow
        self.adopted = False  # the TF process is the previous attempt's spare (executor/spare.py)
        self.skipped = 0  # status lines from the TF process skipped (malformed, or nested too deep)
        self._spawning = False
        self._lock = threading.Lock()

    def run(self) -> int:
        host = local_ip_towards(self.config.driver_host)
        port_sock = reserve_port()
        try:
            conn = connect((self.config.driver_host, self.config.driver_port), self.config.secret)
        except BaseException:
            port_sock.close()
            raise
        try:
            return self._run(conn, host, port_sock)
        finally:
            port_sock.close()
            conn.close()

    def _run(self, conn: Connection, host: str, port_sock: socket.socket) -> int:
        port = port_sock.getsockname()[1]
        m.send_message(
            conn, m.Register(self.executor_id, host, port, executor_key(), os.getpid(), self.config.cluster_id)
        )
        reply = self._await_cluster(conn)
        if isinstance(reply, m.Reject):
            _status(ev.TaskRejected(reply.reason))
            return 2
        assert isinstance(reply, m.ClusterReady)
        threading.Thread(target=self._heartbeat, args=(conn,), daemon=True, name="tfos-heartbeat").start()
        try:  # the node's GPUs (executor/gpus.py), its Keras; a node that cannot have them fails with the reason
            self.gpus = assign_gpus(
                self.gpus, self.config.num_gpus, reply.cluster_spec, reply.job_name, reply.task_index, os.environ
            )
            self.keras_env = tfos_env.env_changes(
                self.config, os.environ
            )  # legacy_keras=on without tf_keras fails here
        except ConfigError as exc:
            return self._cannot_start(conn, exc)
        self._spawning = True  # SIGTERM from now on stops the TF process instead of us
        ended = None
        try:
            ended = self._lives(conn, reply, host, port_sock)
        finally:
            self.done.set()  # stops the heartbeats
            standby = self._take_standby()
            if standby is not None:
                standby.discard()
            try:  # the exit first: discarding a spare waits for it, and the node that failed first is named first
                if ended is not None:
                    self._report_exit(conn, *ended)
            finally:
                self._release_spare(ended)
        return 0

    def _lives(
        self, conn: Connection, ready: m.ClusterReady, host: str, port_sock: socket.socket
    ) -> tuple[int, str] | None:
        """Run the TF process, and again at the same port while :meth:`_may_restart` allows it.

        A worker that restarts in place keeps ``port_sock`` for its whole life (``_held``), so
        the port is never free between two of its servers (``standby.py``). Returns how the last
        one ended (exit code, traceback), or None where one could not start.
        """
        standby = None
        self.job_name = ready.job_name
        spare = self._adopt(ready, port_sock)
        self._held = port_sock if self._holds_port() else None
        while True:
            try:
                ended = self._life(conn, ready, host, port_sock, spare or standby)
                spare = None
            finally:
                if self._held is None:
                    port_sock.close()  # the TF process holds the reservation now; it alone releases it
            if ended is None or not self._may_restart(ended[0]):
                return ended
            seal_port(port_sock)  # sealed already, unless the server died in its own start
            died_at, standby = time.monotonic(), self._take_standby()
            self.restarts += 1
            watch = (conn, _task_address(ready), self.restarts, ended[0], died_at)
            threading.Thread(target=self._announce_restart, args=watch, daemon=True, name="tfos-restart").start()

    def _life(
        self,
        conn: Connection,
        ready: m.ClusterReady,
        host: str,
        port_sock: socket.socket,
        standby: Standby | Adopted | None,
    ) -> tuple[int, str] | None:
        """Start one TF process holding ``port_sock`` (``standby``'s, if given) and follow it to its end.

        Returns (exit code, traceback), or None where it could not be spawned (the node then
        fails, saying why).
        """
        if isinstance(standby, Adopted):
            return self._follow(conn, self._wake_spare(standby, ready, host), standby.status_r, ready, host)
        if standby is not None:
            return self._follow(conn, self._wake(standby, ready, host), standby.status_r, ready, host)
        status_r, status_w = os.pipe()
        try:
            proc = self.proc = self._spawn(ready, host, port_sock, status_w)
        except OSError as exc:  # EAGAIN/ENOMEM from fork, a missing interpreter: the node fails, saying why
            os.close(status_r)
            self._cannot_start(conn, exc)
            return None
        finally:
            os.close(status_w)
        if port_sock is not self._held:
            port_sock.close()
        return self._follow(conn, proc, status_r, ready, host)

    def _follow(
        self,
        conn: Connection,
        proc: subprocess.Popen[bytes] | Adopted,
        status_r: int,
        ready: m.ClusterReady,
        host: str,
    ) -> tuple[int, str]:
        """Relay one TF process's events until it exits; then remove what it left behind."""
        tee = threading.Thread(target=self._tee, args=(proc.stdout,), daemon=True)
        try:
            if self.stop_asked:  # SIGTERM or Stop arrived while the TF process was being spawned
                self.terminate(2.0, force=True)
            if not self.restarts:  # the first TF process: from now on the driver may stop it
                self._start_watchers(conn)
            successor = self._successor()
            if self._held is not None:  # a worker that restarts in place: its port sealed, its standby
                standby = successor == "standby"
                threading.Thread(
                    target=self._warm, args=(ready, host, standby), daemon=True, name="tfos-standby"
                ).start()
            elif successor == "spare":  # the next attempt's, should the cluster restart
                threading.Thread(target=self._keep_spare, args=(ready,), daemon=True, name="tfos-spare").start()
            tee.start()
            with os.fdopen(status_r, "r", encoding="utf-8", errors="replace") as status:
                error = self._relay_status(conn, status)
            code = proc.wait()
        finally:  # however we got here, the TF process and what it left behind go
            if proc.poll() is None:
                self.terminate(2.0, force=True)
            proc.wait()
            _kill_group(proc.pid)  # children it left behind (TensorBoard, helpers)
            remove_unix_socket(self.data_path)  # left behind if the TF process was killed
            remove_scratch(self.scratch)
        tee.join(timeout=5)
        return code, error

    def _start_watchers(self, conn: Connection) -> None:
        """The threads that stop the TF process: the driver's Stop (or silence), the executor's exit."""
        threading.Thread(target=self._listen, args=(conn,), daemon=True).start()
        if self.executor_pid:
            threading.Thread(target=self._watch_executor, daemon=True, name="tfos-executor-watch").start()

    def _report_exit(self, conn: Connection, code: int, error: str) -> None:
        """Tell the driver and the spawning task how the (last) TF process ended."""
        stopped = self.stopping and not self.executor_gone  # a lost executor is a failure, not a stop
        error = f"{self.executor_gone}\n{error}".strip() if self.executor_gone else error
        if self.restarts and not stopped:
            error = f"{error}\n(its TF server had been restarted in place {self.restarts} time(s))".strip()
        exit_msg = m.NodeExit(self.executor_id, code, error, "".join(self.tail)[-16000:], stopped)
        with contextlib.suppress(OSError):
            m.send_message(conn, exit_msg)
        _status(ev.TaskExit(code, stopped, error))

    def _successor(self) -> str:
        """The warm TF process kept for a restart of this one: ``"standby"`` (a worker restarting in
        place), ``"spare"`` (a cluster restart may follow) or ``""``: none, or ``spare_processes`` off."""
        if not self.config.spare_processes:
            return ""
        if self._restartable():
            return "standby"
        return "spare" if self._wants_spare() and not self.restarts else ""

    # ---- restarts in place (the workers of a parameter-server cluster) ---------------------------
    def _restartable(self) -> bool:
        """Whether a death of the TF process could still be followed by a restart in place."""
        return self.job_name == "worker" and self.restarts < self.config.server_restarts

    def _may_restart(self, code: int) -> bool:
        """Whether the TF process that just ended (``code``) restarts at its port.

        Only a worker that only serves (``NodeConfig.server_restarts`` > 0: ``ps_cluster``,
        ``run(..., coordinator=True)``), killed by a signal and not stopped, restarts: TF's
        coordinator re-runs its closures once it accepts again. A ps's variables die with it,
        and anything else runs user code: those fail as before.
        """
        if code >= 0 or self.stop_asked or self.executor_gone or self.job_name != "worker":
            return False
        if not self._restartable():
            if self.config.server_restarts:
                log.error("tfonspark supervisor: TF server died again after %d restart(s): giving up", self.restarts)
            return False
        return True

    def _holds_port(self) -> bool:
        """Whether the supervisor keeps the node's reservation across its TF processes: a worker
        that restarts in place (it runs ``server.serve``: TF's server, never a user's ``bind``)."""
        return self.job_name == "worker" and self.config.server_restarts > 0

    def _warm(self, ready: m.ClusterReady, host: str, standby: bool) -> None:
        """Once the TF server accepts: seal its port (``host.seal_port``), then, with ``standby``,
        start its standby (if none waits yet)."""
        if not wait_accepting(_task_address(ready), self.config.reservation_timeout, self.done):
            return
        held = self._held
        if held is not None:
            with contextlib.suppress(OSError):
                seal_port(held)  # the TF process did, after its server start; a Python bind's does not
        if not standby:
            return
        with self._lock:
            if self._standby is not None or self.stop_asked:
                return
        try:
            spawned: Standby | None = self._spawn_standby(ready, host)
        except OSError as exc:  # no standby: a restart starts a new process, as without one
            log.warning("tfonspark supervisor: cannot start a standby TF process: %s", exc)
            return
        with self._lock:
            if self._standby is None and not self.stop_asked and not self.done.is_set():
                self._standby, spawned = spawned, None
        if spawned is not None:
            spawned.discard()

    def _take_standby(self) -> Standby | None:
        """The standby, if one is alive (it then belongs to the caller)."""
        with self._lock:
            standby, self._standby = self._standby, None
        if standby is not None and not standby.alive():
            standby.discard()
            return None
        return standby

    # ---- a spare for the next attempt (a whole-cluster restart: executor/spare.py) ---------------
    def _wants_spare(self) -> bool:
        """Whether this node keeps a spare TF process: a cluster restart may follow, it trains, and
        the next attempt's node can find it (an executor known by its ``SPARK_LOCAL_DIRS``: ``host.executor_key``)."""
        if not os.environ.get("SPARK_LOCAL_DIRS"):
            return False
        return self.config.keep_spare and not self.config.server_restarts and self.job_name in SPARE_JOBS

    def _spare_paths(self) -> list[str]:
        return spare_paths(self.config.cluster_id, executor_key(), self.executor_id)

    def _keep_spare(self, ready: m.ClusterReady) -> None:
        """A little after the TF process started, start the keeper of its spare (see :mod:`.spare`)."""
        if self.done.wait(SPARE_DELAY_SECS):
            return
        scratch = tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{self.config.cluster_id[:12]}-")
        label = ["--cluster", self.config.cluster_id[:12], "--node", f"{ready.job_name}:{ready.task_index}"]
        try:
            keeper: Keeper | None = Keeper.start(self._spare_paths()[0], self._tf_env(ready, scratch), label)
        except OSError as exc:  # no spare: a restart starts a new process, as without one
            log.warning("tfonspark supervisor: cannot start a spare TF process: %s", exc)
            remove_scratch(scratch)
            return
        with self._lock:
            if not self.done.is_set():
                self._keeper, keeper = keeper, None
        if keeper is not None:
            keeper.release(keep=False)

    def _release_spare(self, ended: tuple[int, str] | None) -> None:
        """Keep the spare for the next attempt where this node failed or was stopped for another's
        failure (a restart may follow); else (done, stopped for good, executor gone) discard it now."""
        with self._lock:
            keeper, self._keeper = self._keeper, None
        if keeper is not None:
            failed = ended is not None and ended[0] != 0
            keeper.release(keep=failed and not self.executor_gone and not self.stop_final)

    def _adopt(self, ready: m.ClusterReady, port_sock: socket.socket) -> Adopted | None:
        """The previous attempt's spare on this executor, if one matches, holding our reservation.

        ``port_sock`` itself goes to the spare (:meth:`~.spare.Adopted.give_port`) and ours is
        closed: the port is bound throughout. Where none is adopted, ``port_sock`` stays ours.
        """
        if not self.config.attempt or ready.job_name not in SPARE_JOBS or self._holds_port():
            return None  # (a worker that restarts in place keeps its reservation: it keeps no spare either)
        try:
            spare = adopt(self._spare_paths(), env_digest(self._tf_env(ready, "")))
        except OSError as exc:
            log.warning("tfonspark supervisor: cannot look for a spare TF process: %s", exc)
            return None
        if spare is None:
            return None
        try:
            spare.give_port(port_sock)
        except OSError as exc:
            port = port_sock.getsockname()[1]
            log.warning("tfonspark supervisor: cannot hand port %d to the spare TF process: %s", port, exc)
            spare.discard()
            return None
        port_sock.close()  # the spare holds the reservation now (it is its own: no copy of ours may keep the port)
        self.adopted = True
        return spare

    def _wake_spare(self, spare: Adopted, ready: m.ClusterReady, host: str) -> Adopted:
        """Make the adopted ``spare`` the TF process: this attempt's environment, then its bootstrap."""
        self.proc, self.scratch = spare, spare.scratch
        tf_config = build_tf_config(ready.cluster_spec, ready.job_name, ready.task_index)
        spare.set_env({TF_CONFIG_ENV: tf_config, ATTEMPT_ENV: str(self.config.attempt)})
        self._bootstrap(spare, ready, host, spare.port_fd, spare.status_fd)
        return spare

    def _announce_restart(
        self, conn: Connection, address: tuple[str, int], restart: int, code: int, died_at: float
    ) -> None:
        """Tell the driver (a ``ServerRestarted`` event) once the restarted server accepts, or gave up."""
        accepting = wait_accepting(address, self.config.reservation_timeout, self.done)
        down_s = round(time.monotonic() - died_at, 3)
        event = ev.ServerRestarted(restart, self.config.server_restarts, code, down_s, accepting)
        log.warning("tfonspark supervisor: TF server %s restarted in place: %s", self.job_name, event)
        self._relay(conn, event)

    def _watch_executor(self) -> None:
        """Stop the TF process when the Spark executor it belongs to is gone (killed, lost, preempted).

        The node runs in its own session, so nothing else would stop it: it would go on outside
        Spark's accounting, holding memory and GPUs Spark gives to the replacement executor.
        """
        while not self.done.wait(EXECUTOR_POLL_SECS):
            if not process_alive(self.executor_pid):
                self.executor_gone = f"the node's Spark executor (JVM pid {self.executor_pid}) exited; its TF process was stopped with it"
                self.terminate(2.0)
                return

    def _cannot_start(self, conn: Connection, error: Exception) -> int:
        """A node whose TF process cannot start ends as if it had failed at once, saying why."""
        text = f"{type(error).__name__}: {error}"
        self.done.set()  # stops the heartbeats
        self._send(conn, m.NodeExit(self.executor_id, 1, text, "", False))
        _status(ev.TaskExit(1, False, text))
        return 0

    def _await_cluster(self, conn: Connection) -> m.Message:
        """The driver's ClusterReady or Reject, within ``reservation_timeout`` (+ a margin)."""
        deadline = time.monotonic() + self.config.reservation_timeout + CLUSTER_MARGIN_SECS
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("the driver sent no cluster within the reservation timeout")
                conn.settimeout(left)
                reply = m.recv_message(conn, m.ClusterReady, m.Reject, m.Heartbeat)
                if not isinstance(reply, m.Heartbeat):
                    return reply
        finally:
            with contextlib.suppress(OSError):
                conn.settimeout(None)

    def _spawn(
        self, ready: m.ClusterReady, host: str, port_sock: socket.socket, status_w: int
    ) -> subprocess.Popen[bytes]:
        # every temp file of the TF process (its feed socket, checkpoint scratch, TensorFlow's
        # and the user's own) lands in one private directory that is removed when it exits
        self.scratch = tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{self.config.cluster_id[:12]}-")  # whose it is
        try:
            return self._start_tf_process(ready, host, port_sock, status_w)
        except BaseException:  # no TF process: _run's clean-up never starts, so the directory goes here
            remove_scratch(self.scratch)
            self.scratch = ""
            raise

    def _start_tf_process(
        self, ready: m.ClusterReady, host: str, port_sock: socket.socket, status_w: int
    ) -> subprocess.Popen[bytes]:
        env = self._tf_env(ready, self.scratch)
        command = ["-m", "tfonspark.tfprocess.entry"]
        proc = self._popen(command, ready, env, (port_sock.fileno(), status_w))
        self._bootstrap(proc, ready, host, port_sock.fileno(), status_w)
        return proc

    def _tf_env(self, ready: m.ClusterReady, scratch: str) -> dict[str, str]:
        """The TF process's environment: its ``TF_CONFIG``, temp dir, GPUs, Keras."""
        env = dict(os.environ)
        if "PYTHONPATH" in env:
            env["PYTHONPATH"] = without_wheel_zips(env["PYTHONPATH"], sys.path)
        env["TMPDIR"] = env["TMP"] = env["TEMP"] = scratch
        env[TF_CONFIG_ENV] = build_tf_config(ready.cluster_spec, ready.job_name, ready.task_index)
        env[COLLECTIVE_ENV] = self.config.collective  # read by tfonspark.distribute.strategy()
        env["PYTHONUNBUFFERED"] = "1"
        env[ATTEMPT_ENV] = str(self.config.attempt)  # ctx.attempt, for code that has no ctx
        env.update(self.keras_env)  # Keras 2 / TFoS import shims, where asked for
        env.update(cuda_env(self.gpus, env))  # CUDA_VISIBLE_DEVICES="" on the CPU: TF must not take every GPU
        return env

    def _popen(
        self, command: list[str], ready: m.ClusterReady, env: dict[str, str], fds: tuple[int, int]
    ) -> subprocess.Popen[bytes]:
        """Start a TF process (``python COMMAND``, labelled with the cluster and node) in its own session."""
        label = ["--cluster", self.config.cluster_id[:12], "--node", f"{ready.job_name}:{ready.task_index}"]
        return subprocess.Popen(
            [sys.executable, *command, *label],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            pass_fds=fds,
            start_new_session=True,
        )

    def _bootstrap(
        self, proc: subprocess.Popen[bytes] | Adopted, ready: m.ClusterReady, host: str, port_fd: int, status_fd: int
    ) -> None:
        """Send the TF process its bootstrap: the node's header (descriptors as numbered in it) and payload."""
        header = {
            "config": self.config.to_json(),
            "executor_id": self.executor_id,
            "job_name": ready.job_name,
            "task_index": ready.task_index,
            "cluster_spec": ready.cluster_spec,
            "host": host,
            "port_fd": port_fd,
            "status_fd": status_fd,
            "working_dir": os.getcwd(),
        }
        assert proc.stdin is not None
        with contextlib.suppress(OSError):  # if it died at once, its exit is reported as usual
            write_bootstrap(proc.stdin, header, self.payload)  # stdin stays open: EOF = we died

    def _spawn_standby(self, ready: m.ClusterReady, host: str) -> Standby:
        """The next TF process, TensorFlow imported, waiting for its bootstrap (see :mod:`.standby`),
        holding the node's reservation (``_held``) as its ``port_fd`` already."""
        assert self._held is not None
        port_fd = self._held.fileno()
        scratch = tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{self.config.cluster_id[:12]}-")
        status_r, status_w = os.pipe()
        try:
            proc = self._popen(["-c", WARM_CODE], ready, self._tf_env(ready, scratch), (port_fd, status_w))
        except BaseException:
            os.close(status_r)
            remove_scratch(scratch)
            raise
        finally:
            os.close(status_w)
        return Standby(proc, port_fd, status_r, status_w, scratch)

    def _wake(self, standby: Standby, ready: m.ClusterReady, host: str) -> subprocess.Popen[bytes]:
        """Make ``standby`` (holding the port's reservation) the TF process: send it its bootstrap."""
        self.proc, self.scratch = standby.proc, standby.scratch
        self._bootstrap(standby.proc, ready, host, standby.port_fd, standby.status_fd)
        return standby.proc

    def _relay_status(self, conn: Connection, status: IO[str]) -> str:
        """Forward the TF process's events to the driver; return the traceback it reports, if any.

        Ends when the TF process exits (EOF on the status pipe). A driver that is gone is
        handled by ``_listen``; sends that fail here are dropped. A malformed line is skipped,
        and so is an event nested too deep to be encoded again for the driver (``metrics``
        nested some 500-990 deep decode, then ``dataclasses.asdict`` raised RecursionError here,
        which ended the relay and the node with it): the node goes on, with a rate-limited error.
        """
        error = ""
        for line in _status_lines(status):
            try:
                event = ev.from_line(line, ev.FeedSocket, ev.ProcessUp, ev.ProcessError, ev.NodeEvent)
            except ProtocolError as exc:
                self._skipped(str(exc))
                continue
            try:
                match event:
                    case ev.FeedSocket(data_path=path):  # ours to remove if the TF process dies
                        self.data_path = path
                    case ev.ProcessUp():
                        self._node_up(conn, event)
                    case ev.NodeEvent():
                        self._relay(conn, event)
                    case ev.ProcessError(traceback=text):
                        error = text
            except RecursionError:
                self._skipped(
                    f"a {event.TYPE!r} event nested too deep to encode for the driver (RecursionError at "
                    f"Python's recursion limit, {sys.getrecursionlimit()}); received: {line[:120]!r}..."
                )
        return error

    def _skipped(self, why: str) -> None:
        """Log a status line skipped for ``why``: the first 10, then 1 in 1,000 (the driver's rule)."""
        self.skipped += 1
        if self.skipped <= 10 or self.skipped % 1000 == 0:
            log.error(
                "tfonspark supervisor: skipped a status line from the TF process: %s. The node goes on "
                "(%d skipped so far)",
                why,
                self.skipped,
            )

    def _node_up(self, conn: Connection, event: ev.ProcessUp) -> None:
        """The TF process is ready: tell the driver where its feed listens, and the task that it runs."""
        assert self.proc is not None
        up = m.NodeUp(
            self.executor_id,
            self.proc.pid,
            event.host,
            event.data_port,
            event.tensorboard_url,
            event.data_path,
            list(self.gpus),
        )
        self.data_path = up.data_path or self.data_path
        self._send(conn, up)
        _status(ev.TaskUp(self.proc.pid))

    @staticmethod
    def _relay(conn: Connection, event: ev.NodeEvent) -> None:
        """Send one node event on to the driver, unless it is over ``MAX_EVENT_BYTES``."""
        payload = m.encode(event)
        if len(payload) > MAX_EVENT_BYTES:
            log.error(
                "tfonspark supervisor: dropped a %r event of %d bytes from the TF process; an event may "
                "be at most %d bytes (MAX_EVENT_BYTES). Received: %r...",
                event.TYPE,
                len(payload),
                MAX_EVENT_BYTES,
                payload[:120].decode("utf-8", "replace"),
            )
            return
        with contextlib.suppress(OSError, ProtocolError):
            conn.send(payload)

    @staticmethod
    def _send(conn: Connection, message: m.Message) -> None:
        with contextlib.suppress(OSError, ProtocolError):
            m.send_message(conn, message)

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

    def _heartbeat(self, conn: Connection) -> None:
        """Tell the driver we are alive every ``heartbeat_secs`` until the node exits."""
        interval = self.config.heartbeat_secs
        if interval <= 0:
            return
        while not self.done.wait(interval):
            try:
                m.send_message(conn, m.Heartbeat())
            except (OSError, ProtocolError):
                return  # the driver is gone: _listen stops the TF process

    def _listen(self, conn: Connection) -> None:
        """Wait for Stop from the driver. A dropped connection, or no message at all (the driver
        sends heartbeats) within ``heartbeat_timeout``, means the driver is gone."""
        grace = 0.0
        timeout = self.config.heartbeat_timeout
        try:
            conn.settimeout(timeout if timeout > 0 else None)
            while True:
                msg = m.recv_message(conn, m.Stop, m.Heartbeat)
                if isinstance(msg, m.Stop):
                    grace, self.stop_final = msg.grace_secs, msg.final
                    break
        except (OSError, ProtocolError):  # socket.timeout is an OSError
            pass
        self.terminate(grace)

    def terminate(self, grace: float, force: bool = False) -> None:
        """SIGTERM the TF process group, SIGKILL after ``grace`` seconds."""
        with self._lock:
            self.stop_asked = True  # also between two TF processes of a restart: no next one
            proc = self.proc
            if proc is None or proc.poll() is not None:
                return
            if self.stopping and not force:
                return  # another thread is stopping it
            self.stopping = True
        _kill_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=max(grace, 0.5))
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)

    def on_sigterm(self) -> None:
        """SIGTERM (the node task gave up on us): stop the TF process, or exit if there is none.

        Runs in the main thread between bytecodes, so it sees ``_spawning``/``proc`` consistent.
        """
        if not self._spawning:  # registering or waiting for the cluster: nothing to clean up
            _status(ev.TaskFailed("stopped (SIGTERM) before the TF process started"))
            os._exit(1)
        if self.proc is None:  # being spawned: _follow stops it right after
            self.stopping = self.stop_asked = True
            return
        threading.Thread(target=self.terminate, args=(2.0,), daemon=True).start()


def without_wheel_zips(pythonpath: str, search: list[str]) -> str:
    """``pythonpath`` without the pyspark.zip and py4j zip that Spark puts first where the pyspark
    wheel holding them is installed on ``search`` (the TF process's own path): the same files.

    Python compiles a zip's modules on every import (the zips hold no bytecode), which made
    ``from pyspark import cloudpickle`` cost each TF process 1-2 s of its start-up; the installed
    copies load from their cached bytecode.
    """
    kept = []
    for entry in pythonpath.split(os.pathsep):
        lib = os.path.dirname(entry)  # .../site-packages/pyspark/python/lib
        installed = os.path.dirname(os.path.dirname(os.path.dirname(lib)))  # .../site-packages
        name = os.path.basename(entry)
        if lib.endswith(os.path.join("pyspark", "python", "lib")) and installed in search:
            if name == "pyspark.zip" and os.path.isfile(os.path.join(installed, "pyspark", "__init__.py")):
                continue
            version = name[len("py4j-") : -len("-src.zip")]
            if name.startswith("py4j-") and os.path.isdir(os.path.join(installed, f"py4j-{version}.dist-info")):
                continue
        kept.append(entry)
    return os.pathsep.join(kept)


def _status_lines(status: IO[str]) -> Iterator[str]:
    """The TF process's status lines; one longer than ``MAX_STATUS_LINE`` is skipped with an error.

    An overlong line is read past in chunks, so it never sits in memory whole.
    """
    while True:
        line = status.readline(MAX_STATUS_LINE + 1)
        if not line:
            return
        if len(line) <= MAX_STATUS_LINE:
            yield line
            continue
        head, size = line[:120], len(line)
        while not line.endswith("\n"):
            line = status.readline(_SKIP_CHUNK)
            if not line:
                break
            size += len(line)
        log.error(
            "tfonspark supervisor: skipped a status line of %d characters from the TF process; a status line "
            "may be at most %d (MAX_STATUS_LINE). Received: %r...",
            size,
            MAX_STATUS_LINE,
            head,
        )


def _task_address(ready: m.ClusterReady) -> tuple[str, int]:
    """Where this node's server is reached: its address in the cluster spec."""
    host, _, port = ready.cluster_spec[ready.job_name][ready.task_index].rpartition(":")
    return host.strip("[]"), int(port)


def _kill_group(pgid: int, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def main() -> int:
    header, payload = read_bootstrap(sys.stdin.buffer)
    try:
        # settings also read on the node (TENSORBOARD_PORT, TFONSPARK_COLLECTIVE) apply where the
        # driver resolved their default; a bad one fails the node before it registers
        config = NodeConfig.from_json(header["config"]).on_node()
    except Exception as exc:
        _status(ev.TaskFailed(f"{type(exc).__name__}: {exc}"))
        return 1
    supervisor = Supervisor(
        config,
        int(header["executor_id"]),
        list(header.get("gpus", [])),
        payload,
        executor_pid=int(header.get("executor_pid", 0)),
    )
    signal.signal(signal.SIGTERM, lambda *_: supervisor.on_sigterm())
    try:
        return supervisor.run()
    except Exception as exc:  # report anything to the task that spawned us, then fail
        _status(ev.TaskFailed(f"{type(exc).__name__}: {exc}"))
        return 1


if __name__ == "__main__":
    os._exit(main())
