"""A warm spare TF process kept across a whole-cluster restart (``max_restarts``).

After a node failure the driver restarts the whole cluster: every node gets a new supervisor
and a fresh TF process, and importing TensorFlow in it was most of the recovery (8-12 s of
14-21 s at load 12 on 2 cores). So while a restart may still follow (``NodeConfig.keep_spare``),
each supervisor keeps a *spare*: a warm TF process (:mod:`.warm`) that has imported TensorFlow
and waits for its port and bootstrap, as the standby of a restart in place does. Its parent is a
small *keeper* process (no TensorFlow), not the supervisor, so that it outlives the supervisor
of the failed attempt:

* the keeper (``python -m tfonspark.executor.spare PATH``) starts the spare, then listens on the
  Unix socket ``PATH`` (in a directory only this user may enter: ``$TMPDIR/tfos-spares-UID``,
  or a private one beside it where another user made that name first), named by the cluster,
  the executor and the node;
* the supervisor that started it writes ``keep`` to the keeper's stdin when its own TF process
  ended in failure (a restart may follow), then exits. Without ``keep``, EOF on that stdin
  discards the spare at once; with it, the keeper waits up to :data:`SPARE_WAIT_SECS` for the
  next attempt's supervisor on the same executor;
* that supervisor connects (:func:`adopt`), receives the spare's pipes (``SCM_RIGHTS``), hands
  the spare its reserved port's socket itself (``WarmProcess.give_port``: ``SCM_RIGHTS`` again,
  on the spare's stdin, a Unix socket; the spare puts it at its ``port_fd``), and writes the new
  attempt's environment (``TF_CONFIG``, ``TFONSPARK_ATTEMPT``) and the bootstrap. The
  reservation is passed, never closed and bound again, so no other process can take the port
  in between (issue 43: closing it first, then binding the spare's own socket, let another
  user's ``bind()`` take the port in 2-14 of 30 adoptions). The keeper
  stays the spare's parent only to send its exit status (:class:`Kept`), so a spare killed
  by a signal is reported as such; if the adopter goes, the keeper kills the spare.

The spare costs one idle TF process (and its memory: about 700 MiB RSS, 300 MiB of it its own,
on CPU) per node while a restart may follow, and competes for CPU while it imports,
:data:`SPARE_DELAY_SECS` after the node's own TF process started. The ``spare_processes``
setting (``NodeConfig.spare_processes``) off: no spare, nor a standby. :class:`Spares` is a
supervisor's side of it: keeping this node's spare, adopting the last attempt's.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import logging
import os
import select
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..config import NodeConfig
from ..host import executor_key, make_scratch, process_alive, remove_scratch
from ..wire import messages as m
from .restart_in_place import restarts_in_place
from .spawn import Spawner
from .warm import WarmProcess

__all__ = [
    "SPARE_DELAY_SECS",
    "SPARE_JOBS",
    "SPARE_WAIT_SECS",
    "Keeper",
    "Kept",
    "Spares",
    "adopt",
    "env_digest",
    "listen_unix",
    "peer_uid",
    "spare_dirs",
    "spare_paths",
]

SPARE_WAIT_SECS = 20.0
"""How long a kept spare waits for the next attempt's supervisor after its own supervisor ended."""
SPARE_DELAY_SECS = 2.0
"""How long after the node's TF process started its spare is started (not to slow its start-up)."""
SPARE_JOBS = ("chief", "master", "worker")  # nodes that keep a spare for a cluster restart
VOLATILE_ENV = ("TF_CONFIG", "TFONSPARK_ATTEMPT", "TMPDIR", "TMP", "TEMP")
"""What differs between the spare's environment and the adopter's: set anew (or kept: its temp dir)."""
_POLL_SECS = 0.1
_HELLO_BYTES = 64 * 1024

log = logging.getLogger(__name__)


def spare_paths(cluster_id: str, executor_key: str, node: int) -> list[str]:
    """Where a keeper for ``node`` (the supervisor's executor id) listens on this executor, first
    (the first is where a new keeper listens); then those of the cluster's other nodes here now
    (the node may have run on another executor). Only in directories of this user (:func:`spare_dirs`)."""
    dirs = spare_dirs()
    name = f"{cluster_id[:12]}-{executor_key[:16]}-"
    own = [os.path.join(d, f"{name}{node}.sock") for d in dirs]
    found = (glob.glob(os.path.join(glob.escape(d), f"{glob.escape(name)}*.sock")) for d in dirs)
    others = sorted(p for paths in found for p in paths if p not in own)
    return [*own, *others]


def spare_dirs() -> list[str]:
    """The directories where this user's keepers listen, private to it (0700, its own, no link).

    ``$TMPDIR/tfos-spares-UID`` first, made if absent. ``$TMPDIR`` is usually ``/tmp``, where
    anyone may make that name first (a directory or a link of their own): such a one is never
    used, and the spares go to a private ``tfos-spares-UID-*`` of ours beside it instead, made
    (``mkdtemp``) the first time and found again by every later supervisor of this user, since
    nobody else can own a directory as this user. Another user's are left where they are.
    """
    usual = os.path.join(tempfile.gettempdir(), f"tfos-spares-{os.getuid()}")
    with contextlib.suppress(FileExistsError):
        os.mkdir(usual, 0o700)
    candidates = [usual, *sorted(glob.glob(f"{glob.escape(usual)}-*"))]
    dirs = [path for path in candidates if _private_dir(path)]
    if usual not in dirs:
        log.warning(
            "tfonspark: %s is not a private directory of this user (uid %d): another user made it? "
            "Spare TF processes wait in a private directory beside it instead",
            usual,
            os.getuid(),
        )
    if not dirs:
        dirs = [tempfile.mkdtemp(prefix=f"{os.path.basename(usual)}-", dir=os.path.dirname(usual))]
    return dirs


def _private_dir(path: str) -> bool:
    """Whether ``path`` is a directory (not a link to one) of this user that nobody else may enter."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o077


def env_digest(env: dict[str, str]) -> str:
    """A digest of ``env`` without :data:`VOLATILE_ENV`: a spare is adopted only where it matches."""
    kept = sorted((k, v) for k, v in env.items() if k not in VOLATILE_ENV)
    return hashlib.sha256(json.dumps(kept).encode()).hexdigest()


# ---- a supervisor's side: keeping this node's spare, adopting the last attempt's --------------
class Spares:
    """The spares of one node's supervisor: the keeper of its spare for the next attempt (while
    one may follow), and whether its TF process is the previous attempt's spare (``adopted``)."""

    def __init__(self, config: NodeConfig, executor_id: int, spawner: Spawner) -> None:
        self.config = config
        self.executor_id = executor_id
        self.spawner = spawner
        self.keeper: Keeper | None = None
        self.adopted = False
        self._lock = threading.Lock()

    def wanted(self, job_name: str) -> bool:
        """Whether this node keeps a spare TF process: a cluster restart may follow, it trains, and
        the next attempt's node can find it (an executor known by its ``SPARK_LOCAL_DIRS``: ``host.executor_key``)."""
        if not os.environ.get("SPARK_LOCAL_DIRS"):
            return False
        return self.config.keep_spare and not self.config.server_restarts and job_name in SPARE_JOBS

    def paths(self) -> list[str]:
        return spare_paths(self.config.cluster_id, executor_key(), self.executor_id)

    def keep(self, ready: m.ClusterReady, done: threading.Event) -> None:
        """A little after the TF process started, start the keeper of its spare (unless ``done``)."""
        if done.wait(SPARE_DELAY_SECS):
            return
        scratch = make_scratch(self.config.cluster_id)
        try:
            keeper: Keeper | None = Keeper.start(
                self.paths()[0], self.spawner.env(ready, scratch), self.spawner.label(ready)
            )
        except OSError as exc:  # no spare: a restart starts a new process, as without one
            log.warning("tfonspark supervisor: cannot start a spare TF process: %s", exc)
            remove_scratch(scratch)
            return
        with self._lock:
            if not done.is_set():
                self.keeper, keeper = keeper, None
        if keeper is not None:
            keeper.release(keep=False)

    def release(self, keep: bool) -> None:
        """Let go of the keeper: ``keep`` its spare for the next attempt, or discard it now."""
        with self._lock:
            keeper, self.keeper = self.keeper, None
        if keeper is not None:
            keeper.release(keep=keep)

    def adopt(self, ready: m.ClusterReady, port_sock: socket.socket) -> WarmProcess | None:
        """The previous attempt's spare on this executor, if one matches, holding our reservation.

        ``port_sock`` itself goes to the spare (``WarmProcess.give_port``) and ours is closed:
        the port is bound throughout. Where none is adopted, ``port_sock`` stays ours.
        """
        job = ready.job_name  # (a worker that restarts in place keeps its reservation: it keeps no spare either)
        if not self.config.attempt or job not in SPARE_JOBS or restarts_in_place(self.config, job):
            return None
        try:
            spare = adopt(self.paths(), env_digest(self.spawner.env(ready, "")))
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


# ---- the supervisor that starts a spare ------------------------------------------------------
@dataclass
class Keeper:
    """The keeper process as its starting supervisor holds it (its stdin: ``keep`` or EOF)."""

    proc: subprocess.Popen[bytes]

    @classmethod
    def start(cls, path: str, env: dict[str, str], label: list[str], wait: float = SPARE_WAIT_SECS) -> Keeper:
        """Start a keeper at ``path`` whose spare gets ``env`` (its ``TMPDIR`` is the spare's scratch);
        kept, it waits ``wait`` seconds for the next attempt."""
        command = [sys.executable, "-m", "tfonspark.executor.spare", path, str(wait), *label]
        # not our stdout: that is the node task's status pipe, which the keeper must not hold open
        stdin, stdout = subprocess.PIPE, subprocess.DEVNULL
        return cls(subprocess.Popen(command, stdin=stdin, stdout=stdout, env=env, start_new_session=True))

    def release(self, keep: bool, wait: float = 5.0) -> None:
        """Let go of it: ``keep`` it for the next attempt, or discard it (waiting up to ``wait`` s)."""
        stdin = self.proc.stdin
        if stdin is not None:
            with contextlib.suppress(OSError, ValueError):
                if keep:
                    stdin.write(b"keep\n")
                    stdin.flush()
                stdin.close()
        if not keep:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(wait)


# ---- the next attempt's supervisor -----------------------------------------------------------
@dataclass
class Kept:
    """An adopted spare's exit, as its keeper reports it on ``conn`` (a ``warm.Exit``): the
    keeper stays its parent, so a spare killed by a signal is reported as such. A forked TF
    process's exit too, as its fork server (``keeper``) reports it (:mod:`.forkserver`)."""

    pid: int
    conn: socket.socket
    keeper: str = "keeper"
    returncode: int | None = None
    ended: threading.Event = field(default_factory=threading.Event)
    discarded: bool = False

    def __post_init__(self) -> None:
        threading.Thread(target=self._await_exit, daemon=True, name="tfos-spare-exit").start()

    def _await_exit(self) -> None:
        """Read the spare's exit status from the keeper; if the keeper dies first, kill the spare."""
        data = b""
        with contextlib.suppress(OSError):
            while not data.endswith(b"\n") and (chunk := self.conn.recv(256)):
                data += chunk
        try:
            self.returncode = int(json.loads(data)["code"])
        except (ValueError, KeyError, TypeError):
            if not self.discarded:
                log.error("tfonspark supervisor: the %s of TF process %d is gone; killing it", self.keeper, self.pid)
            with contextlib.suppress(OSError):
                os.killpg(self.pid, signal.SIGKILL)
            while process_alive(self.pid):
                time.sleep(_POLL_SECS)
            self.returncode = -signal.SIGKILL
        self.conn.close()
        self.ended.set()

    def poll(self) -> int | None:
        return self.returncode if self.ended.is_set() else None

    def wait(self, timeout: float | None = None) -> int:
        if not self.ended.wait(timeout):
            raise subprocess.TimeoutExpired(f"spare TF process {self.pid}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def end(self) -> None:
        """Not used after all: closing the keeper connection makes the keeper kill it."""
        self.discarded = True
        with contextlib.suppress(OSError):
            self.conn.shutdown(socket.SHUT_RDWR)
        self.ended.wait(5.0)


def adopt(paths: list[str], digest: str) -> WarmProcess | None:
    """The first spare of ``paths`` whose environment matches ``digest``, handed over; None if none."""
    for path in paths:
        spare = _take(path)
        if spare is None:
            continue
        hello, adopted = spare
        if hello.get("env") == digest:
            return adopted
        log.warning("tfonspark supervisor: spare TF process %d has another environment: not used", adopted.pid)
        adopted.discard()
    return None


def _take(path: str) -> tuple[dict[str, Any], WarmProcess] | None:
    """Connect to the keeper at ``path`` and receive its spare, or None (no keeper there, or it refused)."""
    if not os.path.exists(path):
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(5.0)
        conn.connect(path)
        message, fds, _, _ = socket.recv_fds(conn, _HELLO_BYTES, 3)
        conn.settimeout(None)
    except OSError:
        conn.close()
        return None
    if len(fds) != 3 or not message:
        for fd in fds:
            os.close(fd)
        conn.close()
        return None
    hello = json.loads(message)
    stdin_fd, stdout_fd, status_r = fds
    pid = int(hello["pid"])
    adopted = WarmProcess(
        pid=pid,
        stdin=os.fdopen(stdin_fd, "wb"),
        stdout=os.fdopen(stdout_fd, "rb"),
        status_r=status_r,
        status_fd=int(hello["status_fd"]),
        port_fd=int(hello["port_fd"]),
        scratch=str(hello["scratch"]),
        exit=Kept(pid, conn),
    )
    return hello, adopted


# ---- the keeper process --------------------------------------------------------------------------
def listen_unix(path: str, backlog: int = 1) -> socket.socket:
    """A Unix socket listening at ``path``, there only once it listens (bound aside, then renamed):
    a keeper's, a fork server's (:mod:`.forkserver`).

    A socket a process that died left at ``path`` is replaced; a live one's is not (OSError).
    """
    aside = f"{path}.{os.getpid()}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(aside)
        listener.listen(backlog)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            if probe.connect_ex(path) == 0:
                raise FileExistsError(f"a spare waits at {path} already")
        os.replace(aside, path)
    except BaseException:
        listener.close()
        with contextlib.suppress(OSError):
            os.unlink(aside)
        raise
    return listener


class _Spare:
    """The keeper's side: the spare (a warm TF process, its child) and the listening socket."""

    def __init__(self, path: str, label: list[str]) -> None:
        self.path = path
        self.listener = listen_unix(path)
        try:
            self.warm = WarmProcess.start(os.environ, label, os.environ.get("TMPDIR", ""))
        except BaseException:
            self.unlisten()
            raise

    def hand_over(self, conn: socket.socket) -> None:
        """Send the spare to ``conn``'s supervisor, then drop our copies of what it now holds."""
        warm = self.warm
        hello = {
            "pid": warm.pid,
            "status_fd": warm.status_fd,
            "port_fd": warm.port_fd,
            "scratch": warm.scratch,
            "env": env_digest(dict(os.environ)),
        }
        socket.send_fds(conn, [json.dumps(hello).encode()], warm.ends())
        warm.let_go()

    def discard(self) -> None:
        """Kill the spare (its group) if it runs, reap it, remove its temp dir and our socket."""
        self.warm.discard()
        self.unlisten()

    def unlisten(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        self.listener.close()


def _owner_says(kept: float | None, wait: float) -> tuple[bool, float | None]:
    """Read the starting supervisor's word on stdin: (still there, keep-until deadline)."""
    data = os.read(0, 64)
    if b"keep" in data and kept is None:
        kept = time.monotonic() + wait
    return bool(data), kept


def _wait_for_adopter(spare: _Spare, wait: float) -> socket.socket | None:
    """Until the next attempt's supervisor connects (its connection), or the spare must go (None)."""
    owner, kept = True, None
    while spare.warm.alive():
        if not owner and (kept is None or time.monotonic() > kept):
            return None
        listening = spare.listener.fileno()
        readable, _, _ = select.select([listening, *([0] if owner else [])], [], [], _POLL_SECS)
        if 0 in readable:
            owner, kept = _owner_says(kept, wait)
        if listening in readable:
            conn, _ = spare.listener.accept()
            uid = peer_uid(conn)
            if uid == os.getuid():
                return conn
            conn.close()
    return None


def peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    return int.from_bytes(creds[4:8], sys.byteorder)


def _serve_exit(warm: WarmProcess, conn: socket.socket) -> None:
    """After the hand-over: send the spare's exit status; if the adopter goes first, kill the spare."""
    while warm.alive():
        readable, _, _ = select.select([conn], [], [], _POLL_SECS)
        if readable and not conn.recv(64):  # the adopter is gone
            warm.exit.end()
            return
    with contextlib.suppress(OSError):
        conn.sendall(json.dumps({"code": warm.poll()}).encode() + b"\n")
    conn.close()


def keeper_main(argv: list[str]) -> int:
    """``python -m tfonspark.executor.spare PATH WAIT [label...]``: keep one spare, hand it over once.

    However it ends, the spare has exited (killed if need be) and its temp dir is gone before
    the keeper exits.
    """
    path, wait, label = argv[0], float(argv[1]), argv[2:]
    try:
        spare = _Spare(path, label)
    except OSError:
        remove_scratch(os.environ.get("TMPDIR", ""))
        return 1
    try:
        conn = _wait_for_adopter(spare, wait)
        spare.unlisten()
        if conn is not None:
            spare.hand_over(conn)
            _serve_exit(spare.warm, conn)
    finally:
        spare.discard()
    return 0


if __name__ == "__main__":
    sys.exit(keeper_main(sys.argv[1:]))
