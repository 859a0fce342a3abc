"""A warm TF process: TensorFlow imported, waiting for its port, its environment and its bootstrap.

Importing TensorFlow is most of a TF process's start (5-10 s on a busy host; 8-12 s of a
14-21 s recovery at load 12 on 2 cores). So the TF process that serves a node next is started
ahead, as one kind of process for two uses:

* the **standby** of a worker that restarts in place (:mod:`.restart_in_place`): started by its
  supervisor once the server accepts, woken when the server dies;
* the **spare** kept across a whole-cluster restart (:mod:`.spare`): started by a keeper process
  that outlives the failed attempt's supervisor, and woken by the next attempt's supervisor.

It runs :data:`WARM_CODE` (``python -c WARM_CODE PORT_FD label...``): TensorFlow and what every TF
process imports (none reads the environment when imported), then, on its stdin (a Unix socket),
the node's port (``ports.send_port``: the reservation itself, put at ``PORT_FD``, which holds
``/dev/null`` until then only to keep that number), one line of environment (JSON: what differs
from the environment it started with, e.g. a new attempt's ``TF_CONFIG``) and the bootstrap,
which the TF process's entry reads as a cold TF process does. EOF instead of any of them: it
removes its scratch dir (its ``TMPDIR``) and exits. The port passes as the socket itself,
never closed and bound again, so no other process can take it in between (issue 43).

:class:`WarmProcess` is its holder: the process, our ends of its stdin, output and status pipe,
the numbers its bootstrap names, and its scratch dir. Its exit is read from its ``Popen`` where
it is our child (a standby, a spare in its keeper) or from its keeper (an adopted spare: an
:class:`Exit` of :mod:`.spare`). Every attempt still starts from a fresh TF process state: it
only imported TensorFlow. It costs one idle TF process (about 700 MiB RSS, 300 MiB of it its own,
on CPU); the ``spare_processes`` setting off, none is started.
"""

from __future__ import annotations

import contextlib
import json
import os
import runpy
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, Protocol

from ..host import remove_scratch
from ..ports import receive_port, send_port

__all__ = ["WARM_CODE", "Child", "Exit", "WarmProcess", "await_bootstrap"]

#: what a warm TF process runs (``python -c WARM_CODE PORT_FD label...``): see the module doc
WARM_CODE = """\
import sys
import tfonspark.tfimport
tfonspark.tfimport.prepare_tensorflow_import()
import tensorflow
import tfonspark.tfprocess.context, tfonspark.tfprocess.feedserver, tfonspark.tfprocess.hints  # what the entry imports
from pyspark import cloudpickle
from tfonspark.executor.warm import await_bootstrap
sys.exit(await_bootstrap(int(sys.argv[1])))
"""


def await_bootstrap(port_fd: int) -> int:
    """A warm TF process's wait and run (``WARM_CODE``'s, and a forked one's: :mod:`.forkserver`):
    its port (put at ``port_fd``), its environment line, then the entry, as a cold TF process runs it.

    Returns 0 at EOF instead of either (its scratch dir removed); the entry's own exit otherwise.
    """
    line = sys.stdin.buffer.readline() if receive_port(port_fd) else b""
    if not line:
        remove_scratch(os.environ.get("TMPDIR", ""))
        return 0
    os.environ.update(json.loads(line))
    tempfile.tempdir = None  # gettempdir() reads the node's TMPDIR, not the one it started with
    try:
        runpy.run_module("tfonspark.tfprocess.entry", run_name="__main__", alter_sys=True)
    except BaseException:
        remove_scratch(os.environ.get("TMPDIR", ""))
        raise
    return 0


class Exit(Protocol):
    """How a warm process's exit is known, and how it is ended."""

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def end(self) -> None:
        """Make it go (it has gone once this returns, or will at once)."""


@dataclass
class Child:
    """The exit of a warm process that is our own child: its ``Popen``."""

    proc: subprocess.Popen[bytes]

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self.proc.wait(timeout)

    def end(self) -> None:
        """SIGKILL its whole process group (it runs in its own session), then reap it."""
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


@dataclass
class WarmProcess:
    """A warm TF process as its holder sees it, looking like the ``Popen`` of a TF process.

    ``stdin`` is our end of its stdin (a Unix socket: :meth:`give_port`), ``stdout`` its output,
    ``status_r`` our read end of its status pipe, ``status_fd`` the write end as numbered in it,
    ``port_fd`` where its port's socket goes in it, ``scratch`` its temp dir (its holder's to
    remove), ``exit`` how its exit is known.
    """

    pid: int
    stdin: IO[bytes]
    stdout: IO[bytes]
    status_r: int
    status_fd: int
    port_fd: int
    scratch: str
    exit: Exit

    @classmethod
    def start(cls, env: Mapping[str, str], label: list[str], scratch: str) -> WarmProcess:
        """Start one (in its own session) with ``env`` (its ``TMPDIR`` is ``scratch``), labelled
        ``label`` for ``ps``; OSError where it cannot be spawned."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        port_fd = os.open(os.devnull, os.O_RDONLY)  # keeps the number its port's socket goes to
        status_r, status_w = os.pipe()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", WARM_CODE, str(port_fd), *label],
                stdin=theirs.fileno(),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=dict(env),
                pass_fds=(port_fd, status_w),
                start_new_session=True,
            )
        except BaseException:
            os.close(status_r)
            ours.close()
            raise
        finally:
            os.close(status_w)  # their numbers in it stay (inherited as numbered here)
            os.close(port_fd)
            theirs.close()
        assert proc.stdout is not None
        stdin = os.fdopen(ours.detach(), "wb")
        return cls(proc.pid, stdin, proc.stdout, status_r, status_w, port_fd, scratch, Child(proc))

    def poll(self) -> int | None:
        return self.exit.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self.exit.wait(timeout)

    def alive(self) -> bool:
        return self.poll() is None

    def ends(self) -> list[int]:
        """Our ends of its stdin, output and status pipe, to hand to another process (``SCM_RIGHTS``)."""
        return [self.stdin.fileno(), self.stdout.fileno(), self.status_r]

    def give_port(self, sock: socket.socket) -> None:
        """Hand it ``sock``, the node's reserved port, which it then holds at its ``port_fd``.

        The socket itself passes (``ports.send_port``): still bound, with no moment where the
        port is free. Once this returns the caller may close its copy. OSError where it is gone.
        """
        with socket.socket(fileno=os.dup(self.stdin.fileno())) as channel:
            send_port(channel, sock)

    def set_env(self, env: Mapping[str, str]) -> None:
        """Give it ``env`` (one JSON line: what differs from the environment it started with);
        its bootstrap follows on the same stdin."""
        with contextlib.suppress(OSError):
            self.stdin.write(json.dumps(dict(env)).encode() + b"\n")

    def let_go(self) -> None:
        """Close our ends of its stdin, output and status pipe (handed over, or no longer needed)."""
        for stream in (self.stdin, self.stdout):
            with contextlib.suppress(OSError):
                stream.close()
        if self.status_r >= 0:
            with contextlib.suppress(OSError):
                os.close(self.status_r)
            self.status_r = -1

    def discard(self) -> None:
        """Not used after all: end it (``exit.end``), close what we hold of it, remove its scratch."""
        self.let_go()
        self.exit.end()
        remove_scratch(self.scratch)
