"""TensorBoard on the chief: a child of the TF process, in its process group, so it stops with it."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time

__all__ = ["start_tensorboard"]

log = logging.getLogger(__name__)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def start_tensorboard(log_dir: str, host: str, port: int = 0, timeout: float = 60.0) -> str:
    """Start TensorBoard over ``log_dir``; return its URL.

    The port is the executor's ``TENSORBOARD_PORT``, else ``port`` (the driver's
    ``TENSORBOARD_PORT``), else a free one.
    """
    port = int(os.environ.get("TENSORBOARD_PORT") or port or _free_port())
    if "://" not in log_dir:
        os.makedirs(log_dir, exist_ok=True)
    cmd = [sys.executable, "-m", "tensorboard.main", "--logdir", log_dir, "--port", str(port),
           "--host", "0.0.0.0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return f"http://{host}:{port}"
        except OSError:
            time.sleep(0.2)
    log.warning("TensorBoard did not start listening on port %d within %.0fs (exit code %s)",
                port, timeout, proc.poll())
    return f"http://{host}:{port}"
