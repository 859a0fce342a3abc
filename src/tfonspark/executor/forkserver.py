"""A fork server per executor: TF processes forked from one that has imported TensorFlow once.

Importing TensorFlow is most of a TF process's start: 5-6 s of CPU on an idle host, 10 s and
more on a busy one, for every node of every cluster. On a long-lived executor (a notebook's
session, a job that starts several clusters, a test suite) that import is the same each time.
So the first supervisor of an executor that wants one starts a *fork server*
(``python -m tfonspark.executor.forkserver PATH EXECUTOR_PID IDLE_SECS``), and every later TF process of
that executor is forked from it instead of spawned:

* the server listens on the Unix socket ``PATH`` at once (in the spares' directory, private to
  this user: ``spare._spare_dirs``), imports what a warm TF process imports (:data:`.warm.WARM_CODE`:
  TensorFlow, with ``tfimport``'s hook), and only then accepts. ``PATH`` names the executor
  (``host.executor_key``) and a digest of the environment TensorFlow was imported with
  (:func:`import_digest`: everything but what differs per node, attempt or cluster), so a
  supervisor whose environment differs (another ``PYTHONPATH``, Keras 2) gets a server of its own;
* a supervisor connects (the server checks the peer is this user: ``SO_PEERCRED``) and sends its
  request (JSON: the label for ``ps``, its working directory) with three descriptors
  (``SCM_RIGHTS``): the TF process's stdin (a Unix socket), output and status pipe. The server
  forks; the child starts a session of its own, takes those as its stdin, stdout/stderr and
  status pipe, relabels its command line (``ps`` shows ``tfonspark.tfprocess.entry --cluster ...
  --node ...``, as for a spawned one) and then waits as a warm TF process does
  (:func:`.warm.await_bootstrap`): the node's port, its environment, its bootstrap. The server
  answers with the child's pid and descriptor numbers, and later, on the same connection, its exit
  status. The supervisor holds it as a :class:`~.warm.WarmProcess` whose exit is that connection
  (:class:`~.spare.Kept`): if the server goes, the child is killed; if the supervisor goes, the
  child sees its stdin close and ends by itself, as a spawned one does;
* the server never starts a thread (it forks), reaps its children, and exits when its executor's
  JVM is gone, when it has had no child for :data:`IDLE_SECS`, or when another server took its
  path. It holds no port.

Every TF process still starts from a fresh state: the server only imported TensorFlow (no eager
context, no device, no thread pool yet); ``random`` reseeds itself in the child and NumPy's global
generator is reseeded here. What is shared is read-only memory (copy-on-write): a forked TF
process costs less memory than a spawned one, and the server one idle TF process's (about
700 MiB RSS) per executor while it waits. A node with GPUs is always spawned (CUDA and fork do not
mix), and so is every node where the ``fork_server`` setting is off, outside a Spark executor, or
when the server cannot be reached within :data:`START_SECS`: then the node is spawned as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from ..host import executor_key, process_alive
from ..settings import BYTES_PER_PACK_ENV, COLLECTIVE_ENV, COLLECTIVE_TIMEOUT_ENV
from . import spare
from .warm import WarmProcess, await_bootstrap

__all__ = ["IDLE_SECS", "START_SECS", "fork", "import_digest", "server_path"]

IDLE_SECS = 300.0
"""How long a fork server with no child waits for the next request before it exits."""
START_SECS = 90.0
"""How long a supervisor waits for a fork server (its import of TensorFlow) before spawning instead."""
VOLATILE_ENV = (*spare.VOLATILE_ENV, COLLECTIVE_ENV, COLLECTIVE_TIMEOUT_ENV, BYTES_PER_PACK_ENV)
"""What may differ between the server's environment and a child's: read after the import, per node."""
_POLL_SECS = 0.2
_REQUEST_BYTES = 64 * 1024
_PAD = "#" * 160  # room in the server's command line for a child's label (see _relabel)

log = logging.getLogger(__name__)


def import_digest(env: Mapping[str, str]) -> str:
    """A digest of what TensorFlow is imported with: ``env`` but :data:`VOLATILE_ENV`, this
    interpreter and tfonspark's version; a server serves only supervisors whose digest matches."""
    from ..config import this_version

    kept = {k: v for k, v in env.items() if k not in VOLATILE_ENV}
    kept["\0python"], kept["\0tfonspark"] = sys.executable, this_version()
    return spare.env_digest(kept)


def server_path(env: Mapping[str, str]) -> str:
    """Where this executor's fork server for ``env`` listens (a private directory of this user)."""
    name = f"fork-{executor_key()[:16]}-{import_digest(env)[:16]}.sock"
    return os.path.join(spare.spare_dirs()[0], name)


# ---- a supervisor's side -----------------------------------------------------------------------
def fork(env: Mapping[str, str], label: list[str], scratch: str, executor_pid: int) -> WarmProcess | None:
    """A TF process forked from this executor's fork server for ``env`` (started here if none
    runs), waiting for its port, environment and bootstrap as a warm TF process does; None where
    no server answered within :data:`START_SECS` (the caller spawns one instead)."""
    base = {k: v for k, v in env.items() if k not in VOLATILE_ENV}
    if "TMPDIR" in os.environ:
        base["TMPDIR"] = os.environ["TMPDIR"]
    path = server_path(env)
    deadline = time.monotonic() + START_SECS
    conn = _connect(path)
    if conn is None:
        started = _start_server(path, base, executor_pid)
        while conn is None and time.monotonic() < deadline and started.poll() is None:
            time.sleep(_POLL_SECS)
            conn = _connect(path)
        _reap_later(started)  # it outlives us; its exit is read, not left a zombie of ours
    if conn is None:
        log.warning("tfonspark supervisor: no fork server at %s: the TF process is spawned", path)
        return None
    try:
        return _request(conn, label, scratch, max(deadline - time.monotonic(), 5.0))
    except (OSError, ValueError, KeyError) as exc:
        conn.close()
        log.warning(
            "tfonspark supervisor: the fork server at %s did not fork: %s; the TF process is spawned", path, exc
        )
        return None


def _reap_later(proc: subprocess.Popen[bytes]) -> None:
    """Reap ``proc`` (the server we started, which outlives us) in the background, once it exits."""
    threading.Thread(target=proc.wait, daemon=True, name="tfos-forkserver-reap").start()


def _connect(path: str) -> socket.socket | None:
    """A connection to the server at ``path``, if one listens there as this user."""
    if not os.path.exists(path):
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        if spare.peer_uid(conn) != os.getuid():
            raise PermissionError(f"{path} is served by another user")
    except OSError:
        conn.close()
        return None
    return conn


def _start_server(path: str, env: Mapping[str, str], executor_pid: int) -> subprocess.Popen[bytes]:
    """Start a fork server for ``path`` in its own session: it outlives this supervisor."""
    command = [sys.executable, "-m", "tfonspark.executor.forkserver", path, str(executor_pid), f"{IDLE_SECS:g}", _PAD]
    null = subprocess.DEVNULL
    return subprocess.Popen(command, stdin=null, stdout=null, stderr=null, env=dict(env), start_new_session=True)


def _request(conn: socket.socket, label: list[str], scratch: str, timeout: float) -> WarmProcess:
    """Ask the server on ``conn`` for a child; its pipes' other ends stay ours."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    out_r, out_w = os.pipe()
    status_r, status_w = os.pipe()
    try:
        request = json.dumps({"label": label, "cwd": os.getcwd()}).encode()
        socket.send_fds(conn, [request], [theirs.fileno(), out_w, status_w])
    except BaseException:
        for fd in (out_r, status_r):
            os.close(fd)
        ours.close()
        raise
    finally:
        theirs.close()
        os.close(out_w)
        os.close(status_w)
    try:
        conn.settimeout(timeout)  # the server accepts once TensorFlow is imported
        reply = json.loads(_read_line(conn))
        conn.settimeout(None)
        pid = int(reply["pid"])
    except BaseException:
        for fd in (out_r, status_r):
            os.close(fd)
        ours.close()
        raise
    stdin = os.fdopen(ours.detach(), "wb")
    exit_ = spare.Kept(pid, conn, keeper="fork server")
    return WarmProcess(
        pid, stdin, os.fdopen(out_r, "rb"), status_r, int(reply["status_fd"]), int(reply["port_fd"]), scratch, exit_
    )


def _read_line(conn: socket.socket) -> bytes:
    """One line from ``conn``, read a byte at a time: what follows it (the exit status) stays there."""
    line = b""
    while not line.endswith(b"\n"):
        byte = conn.recv(1)
        if not byte:
            raise ConnectionError("the fork server closed the connection")
        line += byte
    return line


# ---- the server ------------------------------------------------------------------------------
@dataclass
class _Child:
    """What the server forks into: the child's side of a request, run once the server's loop is left."""

    port_fd: int
    label: list[str]


class _Server:
    """The fork server's state: its listening socket, and each child's pid with its supervisor's connection."""

    def __init__(self, path: str, executor_pid: int, idle_secs: float) -> None:
        self.path = path
        self.idle_secs = idle_secs
        self.pid = os.getpid()  # the server's own (a child leaves what is the server's alone)
        self.executor_pid = executor_pid
        self.listener = spare.listen_unix(path, backlog=16)
        self.inode = os.stat(path).st_ino
        self.children: dict[int, socket.socket | None] = {}  # None: its supervisor is gone
        self.exits: dict[int, int] = {}  # a child's pid -> its pidfd (readable once it exits)
        self.idle_since = time.monotonic()

    def serve(self) -> _Child | None:
        """Fork children until it is time to go (None); in a child, return what it must run."""
        self.idle_since = time.monotonic()  # TensorFlow is imported: from now on it may serve
        while self._wanted():
            listening = [self.listener] if self.listener.fileno() >= 0 else []
            watched: list[socket.socket | int] = [*listening, *self.exits.values()]
            watched += [conn for conn in self.children.values() if conn is not None]
            readable, _, _ = select.select(watched, [], [], _POLL_SECS)
            for ready in readable:
                if ready is self.listener:
                    child = self._accept()
                    if child is not None:
                        return child
                elif isinstance(ready, socket.socket):
                    self._supervisor_gone(ready)
            self._reap()  # at once where a pidfd woke us (the driver orders failures by when it heard)
        return None

    def _wanted(self) -> bool:
        """Whether to go on: the executor lives, a child runs or one came lately, the path is ours.

        Once the executor is gone it takes no more requests but stays while a child runs: its
        supervisor stops it, and reports it stopped with its executor (gone first, we would
        kill it, through ``spare.Kept``, before its supervisor could say why).
        """
        if self.executor_pid and not process_alive(self.executor_pid):
            self.close()
            return bool(self.children)
        if not self.children and time.monotonic() - self.idle_since > self.idle_secs:
            return False
        try:
            return os.stat(self.path).st_ino == self.inode or bool(self.children)
        except OSError:
            return bool(self.children)

    def _accept(self) -> _Child | None:
        """Take one request and fork; in the child, its part (:class:`_Child`)."""
        conn, _ = self.listener.accept()
        fds: list[int] = []
        try:
            if spare.peer_uid(conn) != os.getuid():
                raise PermissionError("a request from another user")
            conn.settimeout(5.0)
            message, fds, _, _ = socket.recv_fds(conn, _REQUEST_BYTES, 3)
            conn.settimeout(None)
            request = json.loads(message)
            label, cwd = [str(a) for a in request["label"]], str(request["cwd"])
            if len(fds) != 3:
                raise ValueError(f"{len(fds)} descriptors instead of 3")
        except (OSError, ValueError, KeyError, TypeError):
            for fd in fds:
                os.close(fd)
            conn.close()
            return None
        stdin_fd, out_fd, status_fd = fds
        port_fd = os.open(os.devnull, os.O_RDONLY)  # keeps the number its port's socket goes to
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            try:
                return self._become_child(conn, (stdin_fd, out_fd, status_fd, port_fd), cwd, label)
            except BaseException:  # never back into the server's loop
                os._exit(70)
        for fd in (stdin_fd, out_fd, port_fd, status_fd):
            os.close(fd)
        self.children[pid] = conn  # the child answers on it (once relabelled); we, with its exit
        with contextlib.suppress(OSError, AttributeError):  # Linux >= 5.3; else the poll finds it
            self.exits[pid] = os.pidfd_open(pid)
        return None

    def _become_child(self, conn: socket.socket, fds: tuple[int, int, int, int], cwd: str, label: list[str]) -> _Child:
        """In the forked child: its own session, descriptors, command line and directory; then
        it tells its supervisor its pid and descriptor numbers (``status_fd``, ``port_fd`` stay
        where they are)."""
        stdin_fd, out_fd, status_fd, port_fd = fds
        os.setsid()
        self.listener.close()
        for other in self.children.values():
            if other is not None:
                other.close()
        for pidfd in self.exits.values():
            os.close(pidfd)
        os.dup2(stdin_fd, 0)
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        os.close(stdin_fd)
        os.close(out_fd)
        os.chdir(cwd)
        _relabel([sys.executable, "-m", "tfonspark.tfprocess.entry", *label])
        sys.argv = ["-c", str(port_fd), *label]
        _reseed()
        reply = {"pid": os.getpid(), "status_fd": status_fd, "port_fd": port_fd}
        conn.sendall(json.dumps(reply).encode() + b"\n")  # only now: ps shows its label already
        conn.close()
        return _Child(port_fd, label)

    def _supervisor_gone(self, conn: socket.socket) -> None:
        """A supervisor's connection closed: nobody reads the exit of its child now. The child
        sees its stdin close too and ends by itself, removing what it made (its feed socket, its
        scratch dir), as a spawned one does; it is reaped here."""
        with contextlib.suppress(OSError):
            if conn.recv(64):
                return
        for pid, held in list(self.children.items()):
            if held is conn:
                self.children[pid] = None
        conn.close()

    def _reap(self) -> None:
        """Tell each child's supervisor how it ended (``spare.Kept`` reads it)."""
        for pid in list(self.children):
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done, status = pid, 0
            if done == 0:
                continue
            conn = self.children.pop(pid)
            if pid in self.exits:
                os.close(self.exits.pop(pid))
            if conn is not None:
                with contextlib.suppress(OSError):
                    conn.sendall(json.dumps({"code": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
                conn.close()
            self.idle_since = time.monotonic()

    def close(self) -> None:
        """Stop listening (the path is removed if it is still ours); children keep running."""
        if os.getpid() != self.pid or self.listener.fileno() < 0:
            return
        with contextlib.suppress(OSError):
            if os.stat(self.path).st_ino == self.inode:
                os.unlink(self.path)
        self.listener.close()


def _relabel(args: list[str]) -> None:
    """Rewrite this process's command line as ``/proc/self/cmdline`` shows it (``ps``, psutil):
    the kernel reads it from the argv area of the process's memory, which we overwrite in place
    (truncated to the server's own command line, padded with :data:`_PAD` for this)."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (fields 48 and 49)
    except (OSError, IndexError, ValueError):
        return
    text = "\0".join(args).encode()[: end - start - 1]
    ctypes.memmove(start, text.ljust(end - start, b"\0"), end - start)


def _reseed() -> None:
    """NumPy's global generator, seeded when NumPy was imported, must differ between children
    (``random`` reseeds itself after a fork)."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def _import_tensorflow() -> None:
    """What a warm TF process imports (:data:`.warm.WARM_CODE`), before any child is forked."""
    import gc

    from .. import tfimport

    tfimport.prepare_tensorflow_import()
    import tensorflow  # noqa: F401
    from pyspark import cloudpickle  # noqa: F401

    from ..tfprocess import context, feedserver, hints  # noqa: F401  (what the entry imports)

    gc.collect()
    gc.freeze()  # shared with every child, never written by a collection


def main(argv: list[str]) -> int:
    """``python -m tfonspark.executor.forkserver PATH EXECUTOR_PID IDLE_SECS [pad]``: serve until
    the executor (pid) is gone, or no child came for IDLE_SECS."""
    path, executor_pid, idle_secs = argv[0], int(argv[1]), float(argv[2])
    try:
        server = _Server(path, executor_pid, idle_secs)
    except OSError:  # another server listens there already
        return 0
    child: _Child | None = None
    try:
        _import_tensorflow()
        child = server.serve()
    finally:
        if child is None:
            server.close()
    if child is None:
        return 0
    return await_bootstrap(child.port_fd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
