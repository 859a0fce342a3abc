"""Another local user spinning on ``bind()`` of a node's port: the intruder of the port tests.

``python port_intruder.py PORT {plain|reuseaddr} [NICE [ADDRESS,...]]`` drops to user nobody when started as
root (another user, as in issues 21 and 43: the setuid happens after the interpreter started,
since nobody may not be able to run it from where it is installed), then spins on ``bind()`` +
``listen()`` of ``PORT`` on 0.0.0.0, 127.0.0.1, :: and ::1, with ``SO_REUSEADDR`` or without,
until its stdin closes. The first address it gets it holds, accepting (and counting) the peers
that connect to it. On stdin's EOF it writes ``{"took", "attempts", "accepted", "took_after_s",
"uid"}`` as JSON to stdout: ``took`` is "" when it never got the port, ``took_after_s`` how long
after its start it got it.

:class:`Intruder` starts one (``subprocess``: it inherits none of the test's descriptors, so no
stray copy of a reservation holds the port for us) and :meth:`Intruder.stop` returns its report.
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import time
from typing import Any

TARGETS = [
    (socket.AF_INET, "0.0.0.0"),
    (socket.AF_INET, "127.0.0.1"),
    (socket.AF_INET6, "::"),
    (socket.AF_INET6, "::1"),
]
NOBODY = 65534
READY = b"spinning\n"


def spin(
    port: int, reuseaddr: bool, stop_fd: int, nice: int = 19, addresses: list[str] | None = None
) -> dict[str, Any]:
    """Spin on bind()+listen() of ``port`` until ``stop_fd`` is readable (EOF); report what was taken."""
    targets = [(family, a) for family, a in TARGETS if addresses is None or a in addresses]
    os.nice(nice)  # 19: spins on any idle core without starving a TF import on a small machine
    if os.geteuid() == 0:  # another local user
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    started = time.monotonic()
    attempts, took, accepted, took_after = 0, "", 0, -1.0
    os.write(1, READY)
    while not took and not select.select([stop_fd], [], [], 0)[0]:
        for family, address in targets:
            try:
                sock = socket.socket(family, socket.SOCK_STREAM)
            except OSError:  # no IPv6 here
                continue
            if reuseaddr:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((address, port))
                sock.listen(16)
            except OSError:
                sock.close()
                continue
            finally:
                attempts += 1
            took, took_after = address, time.monotonic() - started
            sock.settimeout(0.1)
            while not select.select([stop_fd], [], [], 0)[0]:  # hold it; count the peers it steals
                try:
                    sock.accept()[0].close()
                    accepted += 1
                except OSError:
                    pass
            break
    return {"took": took, "attempts": attempts, "accepted": accepted, "took_after_s": took_after, "uid": os.getuid()}


class Intruder:
    """One intruder process on ``port`` (``reuseaddr``: with ``SO_REUSEADDR``), spinning once started."""

    def __init__(self, port: int, reuseaddr: bool, nice: int = 19, addresses: list[str] | None = None) -> None:
        mode = "reuseaddr" if reuseaddr else "plain"
        where = [",".join(addresses)] if addresses else []
        self.proc = subprocess.Popen(
            [sys.executable, __file__, str(port), mode, str(nice), *where],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 30)
        assert ready and self.proc.stdout.readline() == READY, "the intruder did not start"
        self.report: dict[str, Any] | None = None

    def stop(self) -> dict[str, Any]:
        """Stop it (idempotent); its report."""
        if self.report is None:
            out, _ = self.proc.communicate(timeout=30)  # closes its stdin: it stops
            self.report = json.loads(out or b"{}")
        return self.report


if __name__ == "__main__":
    nice = int(sys.argv[3]) if len(sys.argv) > 3 else 19
    report = spin(
        int(sys.argv[1]), sys.argv[2] == "reuseaddr", 0, nice, sys.argv[4].split(",") if len(sys.argv) > 4 else None
    )
    sys.stdout.write(json.dumps(report))
