"""Connection floods for tests: idle and slow (slowloris) peers that never authenticate.

:func:`flood` runs the attacker in a process of its own, so it shares neither the GIL nor the
file-descriptor limit with the code under test. It keeps ``n_idle`` idle connections and
``n_slow`` connections trickling one byte every ``slow_every`` seconds open, reopening each
one the server closes, until the ``with`` block ends::

    with flood(server.address, n_idle=200, n_slow=20) as attacker:
        ...                                  # a legitimate client must still get served
    print(attacker.stats)                    # opened, closed_by_server, open_at_end

:func:`rendezvous_scenario` is the whole acceptance check against a RendezvousServer whose
process may hold only a few file descriptors; ``python tests/unit/attack.py scenario
[--pythonpath DIR]`` runs it (against another copy of the code with ``--pythonpath``) and
prints its figures as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import selectors
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

SECRET_HEX = "5e" * 32
CLUSTER = "flooded-cluster"
_TRICKLE = b"TFoS\x02"  # what a slow peer sends, one byte at a time


# ---- the attacker --------------------------------------------------------------------------------


@dataclass
class Flood:
    """A running flood; ``stats`` is filled in when it ends."""

    proc: subprocess.Popen
    stats: dict[str, Any] = field(default_factory=dict)


def _targets(address: Any) -> list[str]:
    """``host:port`` or ``unix:PATH`` for one address (a pair or a Unix socket path) or a list."""
    if isinstance(address, str):
        return [f"unix:{address}"]
    if len(address) == 2 and isinstance(address[0], str) and isinstance(address[1], int):
        return [f"{address[0]}:{address[1]}"]
    return [t for a in address for t in _targets(a)]


@contextlib.contextmanager
def flood(
    address: Any,
    n_idle: int,
    n_slow: int = 0,
    duration: float | None = None,
    slow_every: float = 5.0,
    reconnect: bool = True,
) -> Iterator[Flood]:
    """Flood ``address`` while the block runs: ``(host, port)``, a Unix socket path, or a list."""
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "flood",
        "--idle",
        str(n_idle),
        "--slow",
        str(n_slow),
        "--slow-every",
        str(slow_every),
    ]
    cmd += ["--duration", str(duration)] if duration is not None else []
    cmd += [] if reconnect else ["--no-reconnect"]
    cmd += _targets(address)
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    attacker = Flood(proc)
    try:
        assert proc.stdout is not None
        ready = proc.stdout.readline()  # once every first connection is established
        if not ready:
            raise RuntimeError("the flood process failed to start")
        yield attacker
    finally:
        attacker.stats = _finish(proc)


class _Attacker:
    """The flood process: keeps its connections open, reopening those the server closes."""

    def __init__(self, targets: list[str], n_idle: int, n_slow: int, slow_every: float, reconnect: bool) -> None:
        self.targets = targets
        self.slow_every = slow_every
        self.reconnect = reconnect
        self.selector = selectors.DefaultSelector()
        self.conns: dict[socket.socket, bool] = {}  # socket -> is slow
        self.stats = {"opened": 0, "closed_by_server": 0, "open_failed": 0}
        self.wanted = [False] * n_idle + [True] * n_slow
        self.next_target = 0

    def open(self, slow: bool) -> None:
        target = self.targets[self.next_target % len(self.targets)]
        self.next_target += 1
        unix = target.startswith("unix:")
        host, _, port = target.rpartition(":")
        try:
            family = socket.AF_UNIX if unix else socket.AF_INET6 if ":" in host else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            self.stats["open_failed"] += 1
            return
        sock.setblocking(False)
        sock.connect_ex(target[5:] if unix else (host, int(port)))
        self.selector.register(sock, selectors.EVENT_READ, slow)
        self.conns[sock] = slow
        self.stats["opened"] += 1

    def on_readable(self, sock: socket.socket) -> None:
        try:
            data = sock.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            return
        slow = self.conns.pop(sock)
        self.selector.unregister(sock)
        sock.close()
        self.stats["closed_by_server"] += 1
        if self.reconnect:
            self.open(slow)

    def trickle(self, step: int) -> None:
        for sock, slow in list(self.conns.items()):
            if slow:
                with contextlib.suppress(OSError):
                    sock.send(_TRICKLE[step % len(_TRICKLE) :][:1])

    def run(self, duration: float | None) -> None:
        for slow in self.wanted:
            self.open(slow)
        time.sleep(0.2)  # the kernel completes the connects (the server's backlog holds them)
        print("ready", flush=True)
        self.selector.register(sys.stdin, selectors.EVENT_READ, "stdin")
        end = None if duration is None else time.monotonic() + duration
        next_trickle, step = time.monotonic() + self.slow_every, 0
        while end is None or time.monotonic() < end:
            for key, _ in self.selector.select(max(0.0, next_trickle - time.monotonic())):
                if key.data == "stdin":
                    return
                self.on_readable(key.fileobj)  # type: ignore[arg-type]
            if time.monotonic() >= next_trickle:
                self.trickle(step)
                step, next_trickle = step + 1, next_trickle + self.slow_every
            while len(self.conns) < len(self.wanted) and self.reconnect:  # reopen failed opens
                before = self.stats["opened"]
                self.open(sum(self.conns.values()) < self.wanted.count(True))
                if self.stats["opened"] == before:
                    break

    def close(self) -> None:
        self.stats["open_at_end"] = len(self.conns)
        for sock in self.conns:
            sock.close()


def _raise_nofile(wanted: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, wanted), hard))


def _flood_main(args: argparse.Namespace) -> None:
    _raise_nofile(args.idle + args.slow + 64)
    attacker = _Attacker(args.targets, args.idle, args.slow, args.slow_every, not args.no_reconnect)
    try:
        attacker.run(args.duration)
    finally:
        attacker.close()
        print(json.dumps(attacker.stats), flush=True)


# ---- a rendezvous server short of file descriptors -------------------------------------------------


@contextlib.contextmanager
def rendezvous_process(
    nofile: int, servers: int = 2, pythonpath: str | None = None
) -> Iterator[tuple[list[tuple[str, int]], dict]]:
    """RendezvousServers (one node each) in a process limited to ``nofile`` descriptors.

    Yields their addresses and a dict that receives the process's final report.
    """
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([pythonpath, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    cmd = [sys.executable, os.path.abspath(__file__), "serve", "--nofile", str(nofile), "--servers", str(servers)]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    report: dict = {}
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError("the rendezvous process failed to start")
        yield [tuple(a) for a in json.loads(line)["addresses"]], report  # type: ignore[misc]
    finally:
        report.update(_finish(proc))


def _finish(proc: subprocess.Popen) -> dict:
    """Close a helper process's stdin (its signal to stop); the JSON of its last line of output."""
    try:
        out = proc.communicate(timeout=30)[0]  # closes stdin
    except subprocess.TimeoutExpired:
        proc.kill()
        out = proc.communicate()[0]
    lines = (out or "").strip().splitlines()
    return json.loads(lines[-1]) if lines else {}


def _serve_main(args: argparse.Namespace) -> None:
    from tfonspark.driver.nodes.rendezvous import RendezvousServer
    from tfonspark.driver.nodes.roles import plan_roles

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (args.nofile, hard))
    servers = [
        RendezvousServer(CLUSTER, plan_roles(1, 0, None, False, False), bytes.fromhex(SECRET_HEX), "127.0.0.1")
        for _ in range(args.servers)
    ]
    print(json.dumps({"addresses": [list(s.address) for s in servers]}), flush=True)
    sys.stdin.read()  # until the test closes our stdin
    report = {
        "registered": [s.registered() for s in servers],
        "rejected": [s.rejected for s in servers],
        "accept_threads_alive": sum(t.name == "tfos-rendezvous" for t in threading.enumerate()),
        "threads": threading.active_count(),
        "open_fds": len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else -1,
    }
    for s in servers:
        s.close()
    print(json.dumps(report), flush=True)


# ---- a legitimate client ---------------------------------------------------------------------------


def register_once(address: Sequence, executor_id: int = 0, timeout: float = 10.0) -> float:
    """Register like a supervisor; seconds until ClusterReady arrived (raises if it did not)."""
    from tfonspark.wire import framing as f
    from tfonspark.wire import messages as m

    start = time.monotonic()
    conn = f.connect(address, bytes.fromhex(SECRET_HEX), timeout=timeout)
    try:
        conn.settimeout(max(0.1, timeout - (time.monotonic() - start)))
        m.send_message(
            conn, m.Register(executor_id, "127.0.0.1", 20000 + executor_id, f"key-{executor_id}", os.getpid(), CLUSTER)
        )
        reply = m.recv_message(conn, m.ClusterReady, m.Reject)
    finally:
        conn.close()
    if not isinstance(reply, m.ClusterReady):
        raise RuntimeError(f"registration refused: {reply}")
    return time.monotonic() - start


def _attempt(address: Sequence, timeout: float) -> dict[str, Any]:
    try:
        return {"ok": True, "seconds": round(register_once(address, timeout=timeout), 4)}
    except Exception as exc:  # noqa: BLE001 - reported as a figure
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}


def rendezvous_scenario(
    pythonpath: str | None = None,
    nofile: int = 64,
    n_idle: int = 200,
    n_slow: int = 20,
    timeout: float = 10.0,
    settle: float = 1.0,
) -> dict:
    """Flood two fd-starved RendezvousServers; register on one during, the other after the flood."""
    result: dict[str, Any] = {"nofile": nofile, "n_idle": n_idle, "n_slow": n_slow}
    with rendezvous_process(nofile, 2, pythonpath) as (addresses, report):
        with flood(addresses, n_idle, n_slow) as attacker:
            time.sleep(settle)  # the server is out of descriptors by now
            result["during"] = _attempt(addresses[0], timeout)
        time.sleep(settle)  # the server sees the flood's sockets close
        result["after"] = _attempt(addresses[1], timeout)
    result["attacker"] = attacker.stats
    result["server"] = report
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    fl = sub.add_parser("flood")
    fl.add_argument("targets", nargs="+", help="host:port or unix:PATH")
    fl.add_argument("--idle", type=int, default=200)
    fl.add_argument("--slow", type=int, default=0)
    fl.add_argument("--slow-every", type=float, default=5.0)
    fl.add_argument("--duration", type=float, default=None)
    fl.add_argument("--no-reconnect", action="store_true")
    sv = sub.add_parser("serve")
    sv.add_argument("--nofile", type=int, default=64)
    sv.add_argument("--servers", type=int, default=2)
    sc = sub.add_parser("scenario")
    sc.add_argument("--pythonpath", default=None)
    sc.add_argument("--nofile", type=int, default=64)
    sc.add_argument("--idle", type=int, default=200)
    sc.add_argument("--slow", type=int, default=20)
    args = parser.parse_args(argv)
    if args.cmd == "flood":
        _flood_main(args)
    elif args.cmd == "serve":
        _serve_main(args)
    else:
        print(json.dumps(rendezvous_scenario(args.pythonpath, args.nofile, args.idle, args.slow), indent=1))


if __name__ == "__main__":
    main()
