"""TensorBoard on the chief: a child of the TF process, in its process group, so it stops with it.

It serves on the node's advertised address (the ``bind_host`` setting overrides it), so that the
URL ``cluster.tensorboard_url()`` gives opens in a browser on the cluster's network. TensorBoard
has no authentication: anyone who reaches that address reads the log directory (summaries,
graphs, images of training data). So it binds that one address, never a wildcard unless
``bind_host`` says so, and the chief logs a WARNING saying so whenever other hosts can reach it.

Its port is the ``tensorboard_port`` setting, else the first free port of ``port_range``, else
any free one. Under a ``port_range`` TensorBoard reads its logs itself (``--load_fast=false``):
its fast loader is a second server, ``tensorboard_data_server``, on a port of its own choosing
(``[::1]``, any port), which no option confines.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import subprocess
import sys
import time

from ..host import is_wildcard
from ..ports import free_port_within

__all__ = ["start_tensorboard"]

log = logging.getLogger(__name__)


_TRIES = 3  # TensorBoard started again on another free port where another process took its port first


def _probe_host(bind_host: str) -> str:
    """Where to check that TensorBoard listens: its bind address, or loopback for a wildcard."""
    if is_wildcard(bind_host):
        return "::1" if ":" in bind_host else "127.0.0.1"
    return bind_host.strip("[]")


def _loopback(bind_host: str) -> bool:
    """Whether ``bind_host`` is a loopback address (only this host reaches it)."""
    name = bind_host.strip("[]")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:  # a host name: whatever it resolves to may be reachable
        return False


def _say_who_reaches(log_dir: str, url: str, bind: str) -> None:
    """Log where TensorBoard serves ``log_dir`` unauthenticated: WARNING unless on loopback only."""
    if _loopback(bind):
        log.info("TensorBoard serves %s at %s without authentication, to this host only", log_dir, url)
        return
    where = "every address of this host" if is_wildcard(bind) else bind.strip("[]")
    log.warning(
        "TensorBoard serves %s at %s without authentication: anyone who can reach %s can read it "
        "(summaries, graphs, images of training data). Keep that port inside a private network; "
        "the bind_host setting chooses the address it binds",
        log_dir,
        url,
        where,
    )


def start_tensorboard(
    log_dir: str, host: str, port: int = 0, timeout: float = 60.0, bind_host: str = "", port_range: str = ""
) -> str:
    """Start TensorBoard over ``log_dir``; return its URL (on the advertised ``host``).

    TensorBoard binds ``bind_host``, or ``host`` when that is empty, at ``port``, or when that is
    0 at the first port of ``port_range`` free on ``bind_host`` (any free port where the range is
    ``""``; ConfigError where none is left), started again at the next one where another process
    took the port first. It serves without authentication, which is logged (module docstring).
    The caller passes the ``tensorboard_port`` and ``port_range`` settings (``NodeConfig``, which
    the supervisor has completed from the node's ``TENSORBOARD_PORT``); nothing is read here.
    """
    bind = bind_host or host
    if "://" not in log_dir:
        os.makedirs(log_dir, exist_ok=True)
    for _ in range(_TRIES if not port else 1):
        chosen = port or free_port_within(bind, "TensorBoard", port_range)
        url, proc = _start(log_dir, host, bind, chosen, timeout, port_range)
        if proc.poll() is None or port:
            return url
        log.info("TensorBoard could not serve at port %d (taken meanwhile?): trying another", chosen)
    return url


def _start(
    log_dir: str, host: str, bind: str, port: int, timeout: float, port_range: str
) -> tuple[str, subprocess.Popen[bytes]]:
    """TensorBoard at ``bind``:``port``, once it listens (or exited, or ``timeout`` passed)."""
    cmd = [
        sys.executable,
        "-m",
        "tensorboard.main",
        "--logdir",
        log_dir,
        "--port",
        str(port),
        "--host",
        bind.strip("[]") or "0.0.0.0",
        *(["--load_fast=false"] if port_range else []),  # no data server on a port of its own
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url_host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    url = f"http://{url_host}:{port}"
    probe = _probe_host(bind)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with socket.create_connection((probe, port), timeout=1):
                _say_who_reaches(log_dir, url, bind)
                return url, proc
        except OSError:
            time.sleep(0.2)
    log.warning(
        "TensorBoard did not start listening on %s port %d within %.0fs (exit code %s)",
        probe,
        port,
        timeout,
        proc.poll(),
    )
    return url, proc
