"""Where a node runs: its executor's identity, its reachable address, its scratch directories
and its processes (its port: :mod:`tfonspark.ports`)."""

from __future__ import annotations

import hashlib
import ipaddress
import os
import shutil
import socket
import tempfile

__all__ = [
    "SCRATCH_PREFIX",
    "bind_address",
    "process_alive",
    "executor_key",
    "executor_pid",
    "is_wildcard",
    "local_ip_towards",
    "make_scratch",
    "remove_scratch",
]


def is_wildcard(host: str) -> bool:
    """True for an address that means "every interface": never one to advertise to peers."""
    address = host.strip().removeprefix("[").removesuffix("]")
    try:
        return not address or ipaddress.ip_address(address).is_unspecified
    except ValueError:  # a host name
        return False


def executor_key() -> str:
    """A key shared by all Python workers of one Spark executor, distinct between executors.

    Spark gives every executor JVM its own block-manager directory and passes it to its Python
    workers as ``SPARK_LOCAL_DIRS``; together with the host name it identifies the executor even
    when several executors share a host. Outside Spark, the process id stands in.
    """
    local_dirs = os.environ.get("SPARK_LOCAL_DIRS") or f"pid-{os.getpid()}"
    raw = f"{socket.gethostname()}|{local_dirs}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def local_ip_towards(peer_host: str) -> str:
    """The local address this host uses to reach ``peer_host`` (no packet is sent).

    ``SPARK_LOCAL_IP`` wins when it names one address; a wildcard there is a bind setting, not
    an address peers can reach, so it is ignored.
    """
    configured = os.environ.get("SPARK_LOCAL_IP", "")
    if configured and not is_wildcard(configured):
        return configured
    family = socket.AF_INET6 if ":" in peer_host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((peer_host, 9))
            found = str(probe.getsockname()[0])
            if not is_wildcard(found):
                return found
        except OSError:
            pass
    return socket.gethostbyname(socket.gethostname())


def bind_address(bind_host: str, advertised: str) -> str:
    """Where a node's servers bind: ``bind_host`` (``NodeConfig.bind_host``) or, when that is
    empty, the node's advertised address. Peers are always told ``advertised``."""
    return bind_host or advertised


#: prefix of a TF process's private temp directory (its TMPDIR), made by its supervisor
SCRATCH_PREFIX = "tfos-node-"


def make_scratch(cluster_id: str) -> str:
    """A new private temp directory for a TF process of ``cluster_id`` (its TMPDIR): every temp
    file of it (its feed socket, checkpoint scratch, TensorFlow's and the user's own) lands there,
    and :func:`remove_scratch` removes it when the process is gone. Named by the cluster: whose it is."""
    return tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{cluster_id[:12]}-")


def remove_scratch(path: str) -> None:
    """Remove a TF process's private temp directory (only one named by SCRATCH_PREFIX)."""
    if path and os.path.basename(path.rstrip(os.sep)).startswith(SCRATCH_PREFIX):
        shutil.rmtree(path, ignore_errors=True)


def _proc_field(pid: int, name: str) -> str:
    """``/proc/<pid>/<name>`` as text ("" where unreadable or not Linux)."""
    try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _stat_fields(pid: int) -> list[str]:
    """``/proc/<pid>/stat`` after "pid (comm)": state, ppid, ... ([] where unreadable)."""
    return _proc_field(pid, "stat").rsplit(")", 1)[-1].split()


def _parent_of(pid: int) -> int:
    fields = _stat_fields(pid)
    return int(fields[1]) if len(fields) > 1 else 0


def executor_pid() -> int:
    """The pid of the Spark JVM this Python worker serves (its parent, or pyspark.daemon's), else 0.

    A node's processes run in their own session so a finished Spark task does not take them
    down; the supervisor watches this pid instead, so that they go when their executor goes.
    """
    pid = os.getppid()
    for _ in range(2):
        if pid <= 1:
            return 0
        cmdline = _proc_field(pid, "cmdline")
        if "java" in cmdline and "org.apache.spark" in cmdline:
            return pid
        pid = _parent_of(pid)
    return 0


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie, killed but not yet reaped, does not): the
    supervisor's Spark executor, an adopted spare TF process."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return _stat_fields(pid)[:1] != ["Z"]
