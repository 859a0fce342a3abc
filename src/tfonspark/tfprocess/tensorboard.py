"""TensorBoard on the chief: a child of the TF process, in its process group, so it stops with it."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time

from ..host import is_wildcard

__all__ = ["start_tensorboard"]

log = logging.getLogger(__name__)


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _free_port(bind_host: str) -> int:
    """A port free on ``bind_host`` (the address TensorBoard will bind, never a wildcard probe
    unless TensorBoard itself binds a wildcard)."""
    with socket.socket(_family(bind_host), socket.SOCK_STREAM) as s:
        s.bind((bind_host.strip("[]") or "0.0.0.0", 0))
        return int(s.getsockname()[1])


def _probe_host(bind_host: str) -> str:
    """Where to check that TensorBoard listens: its bind address, or loopback for a wildcard."""
    if is_wildcard(bind_host):
        return "::1" if ":" in bind_host else "127.0.0.1"
    return bind_host.strip("[]")


def start_tensorboard(log_dir: str, host: str, port: int = 0, timeout: float = 60.0, bind_host: str = "") -> str:
    """Start TensorBoard over ``log_dir``; return its URL (on the advertised ``host``).

    TensorBoard binds ``bind_host``, or ``host`` when that is empty, at ``port``, or a free port
    when that is 0. The caller passes the ``tensorboard_port`` setting (``NodeConfig``, which the
    supervisor has completed from the node's ``TENSORBOARD_PORT``); nothing is read here.
    """
    bind = bind_host or host
    port = port or _free_port(bind)
    if "://" not in log_dir:
        os.makedirs(log_dir, exist_ok=True)
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
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url_host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    url = f"http://{url_host}:{port}"
    probe = _probe_host(bind)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with socket.create_connection((probe, port), timeout=1):
                return url
        except OSError:
            time.sleep(0.2)
    log.warning(
        "TensorBoard did not start listening on %s port %d within %.0fs (exit code %s)",
        probe,
        port,
        timeout,
        proc.poll(),
    )
    return url
