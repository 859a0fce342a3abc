"""Several hosts on one Linux machine: each a network namespace with its own address and hostname.

What a multi-host Spark cluster looks like to tfonspark (every process with its host's own
address, peers reached over TCP, no same-host shortcut between hosts), built from Linux network
namespaces on a private bridge, so the tests and a user trying tfonspark across hosts need one
machine and no network. ``python -m tfonspark.testing.hosts up`` builds them,
``python -m tfonspark.testing.hosts down`` removes everything it made.

The hosts:

* ``<prefix>-driver``: the driver program's host (nothing else runs there);
* ``<prefix>-master``: a Spark standalone master (:meth:`Hosts.spark`);
* ``<prefix>-h1`` ... ``-hN``: one Spark worker each.

Each host has one interface, ``eth0``, with an address of ``<subnet>.0/24`` on the bridge
``<prefix>-br``, and loopback; the machine's own namespace has no address on the bridge, so
only the hosts' own addresses and loopback are used. Every host resolves every other's name
(``ip netns exec`` puts ``/etc/netns/<host>/hosts`` over ``/etc/hosts``), and a process started
with :meth:`Hosts.command` has its host's name as hostname (``unshare --uts``). Cutting a host
off (:meth:`Hosts.cut`) takes its bridge port down: its processes live on and hear nothing.

Needs root, ``ip`` (iproute2) and ``unshare`` (util-linux): :func:`unavailable` says what is
missing. The filesystem is shared by all hosts (one virtualenv, one checkout).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from ..errors import ClusterError, ConfigError
from .spark import StandaloneCluster, spark_conf, wait_for_executors

__all__ = ["Host", "Hosts", "spark_context_here", "unavailable"]

_NETNS_ETC = Path("/etc/netns")
_WORKER_BASE = 21  # h1 is <subnet>.21
_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789-")


def unavailable() -> str:
    """Why hosts cannot be made here (``""``: they can): not root, or a tool is missing."""
    if os.name != "posix" or not sys.platform.startswith("linux"):
        return f"network namespaces need Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns, a bridge, veth pairs)"
    missing = [tool for tool in ("ip", "unshare") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not found on PATH (iproute2, util-linux)"
    return ""


@dataclass(frozen=True)
class Host:
    """One host: its name (hostname and network namespace), its address, its bridge port."""

    name: str  #: ``tfos-h1``: hostname, namespace, and the name every host resolves
    address: str  #: ``10.231.0.21``
    link: str  #: the bridge's end of its veth pair, in the machine's namespace (down: cut off)

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run on this host: in its namespace, with its hostname."""
        shell = 'hostname "$0" && exec "$@"'  # $0: the host's name, "$@": argv
        return ["ip", "netns", "exec", self.name, "unshare", "--uts", "sh", "-c", shell, self.name, *argv]


class Hosts:
    """The driver's host, a master's host and ``workers`` worker hosts (see the module doc).

    A context manager: ``with Hosts(3) as hosts:`` builds them and removes them on the way out,
    also on an error. :meth:`down` removes what any earlier run with the same ``prefix`` left.

    Examples
    --------
    >>> with Hosts(workers=3) as hosts:  # doctest: +SKIP
    ...     spark = hosts.spark()  # a standalone master and one worker per worker host
    ...     hosts.run(hosts.driver, [sys.executable, "train.py", spark.url])
    """

    def __init__(self, workers: int = 3, prefix: str = "tfos", subnet: str = "10.231.0") -> None:
        if not isinstance(workers, int) or isinstance(workers, bool) or not 1 <= workers <= 200:
            raise ConfigError(f"Hosts needs 1 to 200 worker hosts. Received: {workers!r}")
        if not prefix or not set(prefix) <= _NAME_CHARS or len(prefix) > 8:
            raise ConfigError(f"a hosts prefix is 1-8 of a-z, 0-9 and '-'. Received: {prefix!r}")
        parts = subnet.split(".")
        if len(parts) != 3 or not all(p.isdigit() and int(p) < 256 for p in parts):
            raise ConfigError(
                f"a hosts subnet is the first three numbers of an IPv4 /24, e.g. '10.231.0'. Received: {subnet!r}"
            )
        self.prefix, self.subnet = prefix, subnet
        self.bridge = f"{prefix}-br"
        self.driver = self._host("driver", 10)
        self.master = self._host("master", 11)
        self.workers = [self._host(f"h{i + 1}", _WORKER_BASE + i) for i in range(workers)]
        self._spawned: list[subprocess.Popen[bytes]] = []

    def _host(self, role: str, last: int) -> Host:
        return Host(f"{self.prefix}-{role}", f"{self.subnet}.{last}", f"{self.prefix}-v{last}")

    @property
    def all(self) -> list[Host]:
        """Every host: the driver's, the master's, then the workers'."""
        return [self.driver, self.master, *self.workers]

    # ---- up and down -----------------------------------------------------------------------------
    def up(self) -> Hosts:
        """Build the bridge and every host (after removing what an earlier run left); returns self.

        Raises ClusterError saying what is missing where hosts cannot be made, or which command
        failed (everything made so far is removed again).
        """
        why = unavailable()
        if why:
            raise ClusterError(f"cannot make hosts here: {why}")
        self.down()
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("link", "set", self.bridge, "up")
            for host in self.all:
                self._add(host)
        except BaseException:
            self.down()
            raise
        return self

    def _add(self, host: Host) -> None:
        _ip("netns", "add", host.name)
        _ip("link", "add", host.link, "type", "veth", "peer", "name", "eth0", "netns", host.name)
        _ip("link", "set", host.link, "master", self.bridge, "up")
        _ip("-n", host.name, "addr", "add", f"{host.address}/24", "dev", "eth0")
        _ip("-n", host.name, "link", "set", "eth0", "up")
        _ip("-n", host.name, "link", "set", "lo", "up")
        etc = _NETNS_ETC / host.name
        etc.mkdir(parents=True, exist_ok=True)
        names = "".join(f"{h.address}\t{h.name}\n" for h in self.all)
        (etc / "hosts").write_text(f"127.0.0.1\tlocalhost\n::1\tlocalhost\n{names}")

    def down(self) -> None:
        """Stop every process on the hosts and remove them, their links and the bridge (idempotent)."""
        for proc in self._spawned:
            _kill_group(proc)
        self._spawned.clear()
        for name in self.leftovers()["namespaces"]:
            for pid in _pids(name):
                _kill(pid)
            _ip("netns", "del", name, check=False)
        left = self.leftovers()  # after the namespaces: their veth ends went with them
        for link in left["links"]:
            _ip("link", "del", link, check=False)
        for etc in left["etc"]:
            shutil.rmtree(etc, ignore_errors=True)

    def leftovers(self) -> dict[str, list[str]]:
        """What of this prefix exists now: namespaces, links (bridge, veth ends), ``/etc/netns`` dirs."""
        mine = f"{self.prefix}-"
        spaces = [line.split()[0] for line in _run(["ip", "netns", "list"]).splitlines() if line.startswith(mine)]
        links = [
            line.split(":")[1].strip().split("@")[0]
            for line in _run(["ip", "-o", "link", "show"]).splitlines()
            if line.split(":")[1].strip().startswith(mine)
        ]
        etc = sorted(str(p) for p in _NETNS_ETC.glob(f"{mine}*")) if _NETNS_ETC.is_dir() else []
        return {"namespaces": spaces, "links": links, "etc": etc}

    def __enter__(self) -> Hosts:
        return self.up()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.down()

    # ---- running things on a host ----------------------------------------------------------------
    def popen(
        self, host: Host, argv: Sequence[str], env: Mapping[str, str] | None = None, log: IO[bytes] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` on ``host`` in a session of its own; :meth:`down` stops it if it still runs.

        ``SPARK_LOCAL_IP`` is the host's address unless ``env`` says otherwise.
        """
        out: Any = log if log is not None else subprocess.DEVNULL
        proc = subprocess.Popen(
            host.command(argv), env=_env(host, env), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        self._spawned.append(proc)
        return proc

    def run(
        self, host: Host, argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on ``host`` to its end (killed after ``timeout`` seconds); its output, as text."""
        return subprocess.run(
            host.command(argv),
            env=_env(host, env),
            capture_output=True,
            text=True,
            timeout=timeout,
            start_new_session=True,
        )

    # ---- faults ----------------------------------------------------------------------------------
    def cut(self, host: Host) -> None:
        """Cut ``host`` off the network (its bridge port down): its processes keep running."""
        _ip("link", "set", host.link, "down")

    def restore(self, host: Host) -> None:
        """Connect ``host`` again."""
        _ip("link", "set", host.link, "up")

    def processes(self, host: Host) -> list[int]:
        """The pids of every process in ``host``'s namespace."""
        return _pids(host.name)

    def spark(
        self, cores: int = 1, memory: str = "1g", timeout: float = 120.0, worker_env: Mapping[str, str] | None = None
    ) -> StandaloneCluster:
        """A started Spark standalone master on the master's host and a worker on each worker host.

        ``worker_env``: more environment for the workers, e.g. ``SPARK_WORKER_OPTS`` with a GPU
        discovery script (which runs on each worker's host: it can read that host's name).
        Returns the :class:`~tfonspark.testing.spark.StandaloneCluster` (``.url``:
        ``spark://<master-address>:7077``); :meth:`down` stops it too.
        """
        places = (self, self.master, self.workers)
        return StandaloneCluster(len(self.workers), cores, memory, places=places, worker_env=worker_env).start(timeout)


def _env(host: Host, env: Mapping[str, str] | None) -> dict[str, str]:
    """This process's environment for a process on ``host``: its own ``SPARK_LOCAL_IP``, then ``env``."""
    return {**os.environ, "SPARK_LOCAL_IP": host.address, **(env or {})}


def _pids(namespace: str) -> list[int]:
    """The pids of every process in ``namespace``."""
    return [int(pid) for pid in _run(["ip", "netns", "pids", namespace]).split()]


def _run(argv: Sequence[str]) -> str:
    """``argv``'s output ("" where it fails: a listing of what is not there)."""
    done = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    return done.stdout if done.returncode == 0 else ""


def _ip(*args: str, check: bool = True) -> None:
    """Run ``ip args``; ClusterError with its own message where it fails and ``check``."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise ClusterError(f"'ip {' '.join(args)}' failed: {done.stderr.strip() or done.returncode}")


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM ``proc``'s session, SIGKILL after 10 s, and reap it."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _lines(hosts: Hosts) -> Iterator[str]:
    for host in hosts.all:
        yield f"{host.name:14} {host.address:15} ip netns exec {host.name} ..."


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tfonspark.testing.hosts up|down|status [--workers N] [--prefix P]``."""
    parser = argparse.ArgumentParser(prog="python -m tfonspark.testing.hosts", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["up", "down", "status"])
    parser.add_argument("--workers", type=int, default=3, help="worker hosts (default 3)")
    parser.add_argument("--prefix", default="tfos", help="names of the hosts, links and bridge (default tfos)")
    parser.add_argument("--subnet", default="10.231.0", help="their /24 (default 10.231.0)")
    opts = parser.parse_args(argv)
    hosts = Hosts(opts.workers, opts.prefix, opts.subnet)
    if opts.action == "up":
        hosts.up()
        print("\n".join(_lines(hosts)))
    elif opts.action == "down":
        hosts.down()
    left = hosts.leftovers()
    print(f"{len(left['namespaces'])} hosts, {len(left['links'])} links of prefix {opts.prefix!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def spark_context_here(master: str, executors: int, app_name: str, timeout: float = 120.0, **conf: str) -> Any:
    """The SparkContext of a driver program that runs on a host of a :class:`Hosts` cluster.

    Its driver at this host's own address (from its ``/etc/hosts``), ``executors`` executors of
    one core and 768 MiB, returned once they registered (:func:`~tfonspark.testing.spark.wait_for_executors`,
    ClusterError after ``timeout`` seconds); ``conf``: more settings, as :func:`spark_conf` takes them.
    """
    import socket

    from pyspark import SparkContext

    address = socket.gethostbyname(socket.gethostname())
    settings = {
        "spark__driver__host": address,
        "spark__driver__bindAddress": address,
        "spark__cores__max": str(executors),
        "spark__executor__cores": "1",
        "spark__executor__memory": "768m",
        **conf,
    }
    sc = SparkContext(conf=spark_conf(master, app_name=app_name, **settings))
    sc.setLogLevel("ERROR")
    wait_for_executors(sc, executors, timeout)
    return sc
