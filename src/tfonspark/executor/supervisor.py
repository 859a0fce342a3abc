"""The supervisor: a small process (no TensorFlow) that owns one node's TF process, for its life.

Its one job is that life cycle: it reserves the node's port, registers with the driver, starts
the TF process (:mod:`.spawn`), follows it to its end and reports how it ended, and stops it
when the driver says so, when the driver connection drops or falls silent for
``heartbeat_timeout``, when its Spark executor exits, or on SIGTERM. Because it, not the Spark
task, is the TF process's parent, a TF process killed by a signal is still reported with its
output tail, and its feed socket is removed. What it does along the way has a module each:

* :mod:`.relay`: the TF process's events and output, the heartbeats, the driver's ``Stop``;
* :mod:`.restart_in_place`: a worker that only serves, started again at its port when its server
  dies, with its standby TF process;
* :mod:`.spare`: a spare TF process kept for the next attempt of a whole-cluster restart, and
  the adoption of the last attempt's;
* :mod:`.warm`: the one kind of TF process started ahead (a standby, a spare).

Its state is one value, :class:`Life`. Run as ``python -m tfonspark.executor.supervisor
--cluster ID --executor N``; the arguments only label the process for ``ps`` (and for tests
that check nothing is left behind). The bootstrap arrives on stdin; status lines
(``TFOS-STATUS`` and a ``TaskStatus`` event) go to stdout for the spawning task.
"""

from __future__ import annotations

import collections
import contextlib
import enum
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping

from ..config import NodeConfig
from ..errors import ConfigError
from ..host import executor_key, local_ip_towards, make_scratch, process_alive, remove_scratch
from ..ports import reserve_port
from ..wire import events as ev
from ..wire import messages as m
from ..wire.bootstrap import read_bootstrap
from ..wire.framing import Connection, connect, remove_unix_socket
from . import forkserver
from .relay import Relay, task_status, tee
from .restart_in_place import InPlace, restarts_in_place
from .spare import Spares
from .spawn import Spawner
from .warm import WarmProcess

__all__ = ["TENSORFLOW_PORT", "Life", "Supervisor", "main", "node_port"]

TAIL_LINES = 60
CLUSTER_MARGIN_SECS = 60.0  # past reservation_timeout, how long to wait for the cluster
EXECUTOR_POLL_SECS = 1.0  # how often the supervisor checks that its Spark executor still runs

log = logging.getLogger(__name__)


class Life(enum.Enum):
    """Where a node's life is: the supervisor's one state, changed only under its lock.

    ::

        JOINING --ClusterReady, the node's GPUs and Keras settled--> RUNNING
        JOINING, RUNNING --a stop asked, no live TF process--> STOP_ASKED
        RUNNING --a stop asked: SIGTERM to the TF process--> STOPPING
        STOP_ASKED --a TF process started meanwhile, SIGTERM--> STOPPING
        any stop --the driver's Stop(final=True)--> its FINAL_ twin
        anything --the Spark executor exited--> EXECUTOR_GONE

    In JOINING, SIGTERM ends the supervisor at once (nothing to clean up). From a stop asked on
    no TF process follows (no restart in place, no standby). In STOPPING the TF process was sent
    SIGTERM by us: its exit is reported as stopped, not as a failure. After a final stop, or
    the executor's exit, no spare is kept for a next attempt; EXECUTOR_GONE is reported as a
    failure, whoever stopped the TF process.
    """

    JOINING = "joining"
    RUNNING = "running"
    STOP_ASKED = "stop asked"
    STOPPING = "stopping"
    FINAL_STOP_ASKED = "final stop asked"
    FINAL_STOPPING = "final stopping"
    EXECUTOR_GONE = "executor gone"

    @property
    def stop_asked(self) -> bool:
        return self not in (Life.JOINING, Life.RUNNING)

    @property
    def stopping(self) -> bool:
        """The TF process was sent SIGTERM (or its executor is gone): not signalled again but by force."""
        return self in (Life.STOPPING, Life.FINAL_STOPPING, Life.EXECUTOR_GONE)

    @property
    def stopped(self) -> bool:
        """Whether the TF process's exit is reported as stopped (not a failure)."""
        return self in (Life.STOPPING, Life.FINAL_STOPPING)

    @property
    def keeps_spare(self) -> bool:
        return self not in (Life.FINAL_STOP_ASKED, Life.FINAL_STOPPING, Life.EXECUTOR_GONE)

    def asked(self, why: Life, signalled: bool) -> Life:
        """The state once a stop is asked: ``why`` is STOP_ASKED, FINAL_STOP_ASKED or
        EXECUTOR_GONE; ``signalled``: the TF process is sent SIGTERM now."""
        if Life.EXECUTOR_GONE in (self, why):
            return Life.EXECUTOR_GONE
        final = why is Life.FINAL_STOP_ASKED or self in (Life.FINAL_STOP_ASKED, Life.FINAL_STOPPING)
        if signalled or self.stopping:
            return Life.FINAL_STOPPING if final else Life.STOPPING
        return Life.FINAL_STOP_ASKED if final else Life.STOP_ASKED


class Supervisor:
    """One node's life: start its TF process, follow it to its end, report the exit (module doc)."""

    def __init__(
        self, config: NodeConfig, executor_id: int, gpus: list[str], payload: bytes, executor_pid: int = 0
    ) -> None:
        self.config = config
        self.executor_id = executor_id
        self.executor_pid = executor_pid  # the Spark executor JVM: the node goes when it goes (0 = none)
        self.spawner = Spawner(config, executor_id, gpus, payload)
        self.in_place = InPlace(config)
        self.spares = Spares(config, executor_id, self.spawner)
        self.life = Life.JOINING
        self.relay: Relay | None = None  # the driver connection's, once the driver sent the cluster
        self.proc: subprocess.Popen[bytes] | WarmProcess | None = None
        self.scratch = ""  # the TF process's TMPDIR, removed after it exits
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.done = threading.Event()  # set once the TF process has exited (stops the heartbeats)
        self.job_name = ""  # the node's TF job, once the driver said it
        self._lock = threading.Lock()

    def run(self) -> int:
        host = local_ip_towards(self.config.driver_host)
        port_sock = node_port(self.config)
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
            task_status(ev.TaskRejected(reply.reason))
            return 2
        if isinstance(reply, m.Stop):  # the cluster will not form (another node cannot come): no TF process
            task_status(ev.TaskExit(0, stopped=True))
            return 0
        assert isinstance(reply, m.ClusterReady)
        relay = self.relay = Relay(conn, self.executor_id)
        beats = (self.config.heartbeat_secs, self.done)
        threading.Thread(target=relay.heartbeats, args=beats, daemon=True, name="tfos-heartbeat").start()
        try:  # a node that cannot have its GPUs or its Keras fails with the reason
            self.spawner.settle(reply)
        except ConfigError as exc:
            return self._cannot_start(relay, exc)
        with self._lock:  # SIGTERM from now on stops the TF process instead of us
            self.life = Life.RUNNING if self.life is Life.JOINING else self.life
        ended = None
        try:
            ended = self._lives(relay, reply, host, port_sock)
        finally:
            self.done.set()  # stops the heartbeats
            standby = self.in_place.take_standby()
            if standby is not None:
                standby.discard()
            try:  # the exit first: discarding a spare waits for it, and the node that failed first is named first
                if ended is not None:
                    self._report_exit(relay, *ended)
            finally:
                self._release_spare(ended)
        return 0

    def _lives(
        self, relay: Relay, ready: m.ClusterReady, host: str, port_sock: socket.socket
    ) -> tuple[int, str] | None:
        """Run the TF process, and again at the same port while a restart in place is due.

        A worker that restarts in place keeps ``port_sock`` for its whole life
        (``in_place.held``), so the port is never free between two of its servers. Returns how
        the last one ended (exit code, traceback), or None where one could not start.
        """
        self.job_name = ready.job_name
        warm = self.spares.adopt(ready, port_sock)
        held = self.in_place.held = port_sock if restarts_in_place(self.config, ready.job_name) else None
        while True:
            try:
                ended = self._life(relay, ready, host, port_sock, warm)
            finally:
                if held is None:
                    port_sock.close()  # the TF process holds the reservation now; it alone releases it
            if ended is None or not self.in_place.may_restart(ended[0], self.job_name, self.life.stop_asked):
                return ended
            died_at, warm = time.monotonic(), self.in_place.restarted()
            watch = (relay, ready, self.in_place.restarts, ended[0], died_at, self.done)
            threading.Thread(target=self.in_place.announce, args=watch, daemon=True, name="tfos-restart").start()

    def _life(
        self, relay: Relay, ready: m.ClusterReady, host: str, port_sock: socket.socket, warm: WarmProcess | None
    ) -> tuple[int, str] | None:
        """Start one TF process holding ``port_sock`` (``warm``, which holds it already, if given)
        and follow it to its end: (exit code, traceback), or None where it could not be spawned
        (the node then fails, saying why)."""
        if warm is not None:
            self.proc, self.scratch = warm, warm.scratch
            self.spawner.wake(warm, ready, host, self.spawner.attempt_env(ready))
            return self._follow(relay, warm, warm.status_r, ready)
        forked = self._forked(ready, port_sock)
        if forked is not None:
            warm, env = forked
            self.proc, self.scratch = warm, warm.scratch
            self.spawner.wake(warm, ready, host, env)
            return self._follow(relay, warm, warm.status_r, ready)
        status_r, status_w = os.pipe()
        try:
            proc, self.scratch = self.spawner.cold(ready, host, port_sock, status_w)
            self.proc = proc
        except OSError as exc:  # EAGAIN/ENOMEM from fork, a missing interpreter: the node fails, saying why
            os.close(status_r)
            self._cannot_start(relay, exc)
            return None
        finally:
            os.close(status_w)
        if port_sock is not self.in_place.held:
            port_sock.close()
        return self._follow(relay, proc, status_r, ready)

    def _forked(self, ready: m.ClusterReady, port_sock: socket.socket) -> tuple[WarmProcess, dict[str, str]] | None:
        """A TF process forked from this executor's fork server (:mod:`.forkserver`), holding
        ``port_sock``, and the environment to give it; None where it is to be spawned: the
        ``fork_server`` setting off, GPUs (CUDA and fork do not mix), outside a Spark executor, or
        no server answered."""
        if not self.config.fork_server or self.spawner.gpus or not self.executor_pid:
            return None
        if not os.environ.get("SPARK_LOCAL_DIRS"):  # executor_key() would not name the executor
            return None
        scratch = make_scratch(self.config.cluster_id)
        env = self.spawner.env(ready, scratch)
        warm = None
        try:
            warm = forkserver.fork(env, self.spawner.label(ready), scratch, self.executor_pid)
            if warm is not None:
                warm.give_port(port_sock)
        except OSError as exc:
            log.warning("tfonspark supervisor: cannot fork the TF process: %s; it is spawned", exc)
            if warm is not None:
                warm.discard()
            warm = None
        if warm is None:
            remove_scratch(scratch)
            return None
        if port_sock is not self.in_place.held:
            port_sock.close()  # the forked process holds the reservation now
        return warm, env

    def _follow(
        self, relay: Relay, proc: subprocess.Popen[bytes] | WarmProcess, status_r: int, ready: m.ClusterReady
    ) -> tuple[int, str]:
        """Relay one TF process's events until it exits; then remove what it left behind."""
        teeing = threading.Thread(target=tee, args=(proc.stdout, self.tail), daemon=True)
        try:
            if self.life.stop_asked:  # SIGTERM or Stop arrived while the TF process was being spawned
                self.terminate(2.0, force=True)
            if not self.in_place.restarts:  # the first TF process: from now on the driver may stop it
                self._start_watchers(relay)
            self._start_successor(ready)
            teeing.start()
            with os.fdopen(status_r, "r", encoding="utf-8", errors="replace") as status:
                error = relay.status(status, proc.pid, self.spawner.gpus)
            code = proc.wait()
        finally:  # however we got here, the TF process and what it left behind go
            if proc.poll() is None:
                self.terminate(2.0, force=True)
            proc.wait()
            _kill_group(proc.pid)  # children it left behind (TensorBoard, helpers)
            remove_unix_socket(relay.data_path)  # left behind if the TF process was killed
            remove_scratch(self.scratch)
        teeing.join(timeout=5)
        return code, error

    def _start_watchers(self, relay: Relay) -> None:
        """The threads that stop the TF process: the driver's Stop (or silence), the executor's exit."""
        threading.Thread(target=self._obey_driver, args=(relay,), daemon=True).start()
        if self.executor_pid:
            threading.Thread(target=self._watch_executor, daemon=True, name="tfos-executor-watch").start()

    def _start_successor(self, ready: m.ClusterReady) -> None:
        """Once the TF process runs: a worker that restarts in place seals its port once its
        server accepts, and starts its standby; another may keep a spare for the next attempt."""
        successor = self._successor()
        if self.in_place.held is not None:
            wanted = (ready, self.spawner, successor == "standby", self.done, self._wants_standby)
            threading.Thread(target=self.in_place.serving, args=wanted, daemon=True, name="tfos-standby").start()
        elif successor == "spare":  # the next attempt's, should the cluster restart
            kept = (ready, self.done)
            threading.Thread(target=self.spares.keep, args=kept, daemon=True, name="tfos-spare").start()

    def _successor(self) -> str:
        """The warm TF process kept for a restart of this one: ``"standby"`` (a worker restarting in
        place), ``"spare"`` (a cluster restart may follow) or ``""``: none, or ``spare_processes`` off."""
        if not self.config.spare_processes:
            return ""
        if self.in_place.restartable(self.job_name):
            return "standby"
        return "spare" if self.spares.wanted(self.job_name) and not self.in_place.restarts else ""

    def _wants_standby(self) -> bool:
        return not self.life.stop_asked and not self.done.is_set()

    def _report_exit(self, relay: Relay, code: int, error: str) -> None:
        """Tell the driver and the spawning task how the (last) TF process ended."""
        life = self.life
        stopped = life.stopped  # a lost executor is a failure, not a stop
        if life is Life.EXECUTOR_GONE:
            gone = f"the node's Spark executor (JVM pid {self.executor_pid}) exited; its TF process was stopped with it"
            error = f"{gone}\n{error}".strip()
        if self.in_place.restarts and not stopped:
            error = f"{error}\n(its TF server had been restarted in place {self.in_place.restarts} time(s))".strip()
        relay.send(m.NodeExit(self.executor_id, code, error, "".join(self.tail)[-16000:], stopped))
        task_status(ev.TaskExit(code, stopped, error))

    def _release_spare(self, ended: tuple[int, str] | None) -> None:
        """Keep the spare for the next attempt where this node failed or was stopped for another's
        failure (a restart may follow); else (done, stopped for good, executor gone) discard it now."""
        failed = ended is not None and ended[0] != 0
        self.spares.release(keep=failed and self.life.keeps_spare)

    def _obey_driver(self, relay: Relay) -> None:
        """Stop the TF process at the driver's ``Stop``, or once the driver is gone."""
        stop = relay.await_stop(self.config.heartbeat_timeout)
        if stop is None:
            self.terminate(0.0)
        else:
            self.terminate(stop.grace_secs, why=Life.FINAL_STOP_ASKED if stop.final else Life.STOP_ASKED)

    def _watch_executor(self) -> None:
        """Stop the TF process when the Spark executor it belongs to is gone (killed, lost, preempted).

        The node runs in its own session, so nothing else would stop it: it would go on outside
        Spark's accounting, holding memory and GPUs Spark gives to the replacement executor.
        """
        while not self.done.wait(EXECUTOR_POLL_SECS):
            if not process_alive(self.executor_pid):
                self.terminate(2.0, why=Life.EXECUTOR_GONE)
                return

    def terminate(self, grace: float, force: bool = False, why: Life = Life.STOP_ASKED) -> None:
        """Ask the node to stop (``why``: :meth:`Life.asked`); SIGTERM the TF process group, SIGKILL
        after ``grace`` seconds, unless another thread stops it already (``force``: anyway)."""
        with self._lock:  # also between two TF processes of a restart: no next one
            proc = self.proc
            signalled = proc is not None and proc.poll() is None and (force or not self.life.stopping)
            self.life = self.life.asked(why, signalled)
        if not signalled or proc is None:
            return
        _kill_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=max(grace, 0.5))
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)

    def on_sigterm(self) -> None:
        """SIGTERM (the node task gave up on us): stop the TF process, or exit if there is none yet.

        Runs in the main thread between bytecodes: it takes no lock, the stop runs in a thread.
        """
        if self.life is Life.JOINING:  # registering or waiting for the cluster: nothing to clean up
            task_status(ev.TaskFailed("stopped (SIGTERM) before the TF process started"))
            os._exit(1)
        threading.Thread(target=self.terminate, args=(2.0,), daemon=True).start()

    def _cannot_start(self, relay: Relay, error: Exception) -> int:
        """A node whose TF process cannot start ends as if it had failed at once, saying why."""
        text = f"{type(error).__name__}: {error}"
        self.done.set()  # stops the heartbeats
        relay.send(m.NodeExit(self.executor_id, 1, text, "", False))
        task_status(ev.TaskExit(1, False, text))
        return 0

    def _await_cluster(self, conn: Connection) -> m.Message:
        """The driver's ClusterReady, Reject or Stop (the cluster will not form), within
        ``reservation_timeout`` (+ a margin)."""
        deadline = time.monotonic() + self.config.reservation_timeout + CLUSTER_MARGIN_SECS
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("the driver sent no cluster within the reservation timeout")
                conn.settimeout(left)
                reply = m.recv_message(conn, m.ClusterReady, m.Reject, m.Stop, m.Heartbeat)
                if not isinstance(reply, m.Heartbeat):
                    return reply
        finally:
            with contextlib.suppress(OSError):
                conn.settimeout(None)


TENSORFLOW_PORT = "TENSORFLOW_PORT"
"""TFoS's variable on the executor: the TF server's port of its node (read on the TFoS face only)."""


def node_port(config: NodeConfig, environ: Mapping[str, str] | None = None) -> socket.socket:
    """The node's TF port, reserved (:func:`tfonspark.ports.reserve_port`): the first free port
    of the ``port_range`` setting, any free port where there is none.

    On the TFoS face (``TFCluster.run``), the executor's ``TENSORFLOW_PORT``, as in TFoS, pins
    it: that port exactly, or a ConfigError naming the variable where it is taken (two nodes on
    one host cannot share it) or is not a port. ``environ`` defaults to ``os.environ``.
    """
    pinned = (os.environ if environ is None else environ).get(TENSORFLOW_PORT, "").strip()
    if not config.tfos_face or not pinned:
        return reserve_port(port_range=config.port_range, what="the node's TF port")
    try:
        port = int(pinned)
        if not 1 <= port <= 65535:
            raise ValueError
    except ValueError:
        raise ConfigError(
            f"{TENSORFLOW_PORT} must be a port 1-65535 (TFoS: the TF server's port of this executor's node). "
            f"Received: {pinned!r} (from the executor's environment)"
        ) from None
    try:
        return reserve_port(port)
    except OSError as exc:
        raise ConfigError(
            f"{TENSORFLOW_PORT}={port} (the executor's environment) is taken on host {socket.gethostname()}: {exc}. "
            f"Each node on a host needs its own TF port: unset it and set port_range to a range instead"
        ) from None


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
        task_status(ev.TaskFailed(f"{type(exc).__name__}: {exc}"))
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
        task_status(ev.TaskFailed(f"{type(exc).__name__}: {exc}"))
        return 1


if __name__ == "__main__":
    os._exit(main())
