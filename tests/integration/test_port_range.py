"""Ports a firewall can allow: ``port_range`` confines every port tfonspark listens on (issue 45, item 4).

On the multi-host cluster the multi-host tests share (``hosts_fixture.py``: a driver host, a
master host, three worker hosts), ``port_range_driver.py`` runs on the driver host with
``spark.tfonspark.portRange`` set and starts, one after the other, a fed MWMS cluster with
TensorBoard on its chief, a tf.data service (dispatcher on the driver, two workers, which
serves 2,000 elements once) and a parameter-server cluster (coordinator on the driver, two
workers and a ps, which trains 50 steps): the services across hosts, checked here too. While each runs, every TCP socket in LISTEN state in every host's namespace is
read from ``/proc/net/tcp`` and ``tcp6`` there and tied to its process through the socket
inodes of ``/proc/<pid>/fd``; the sockets of tfonspark's processes (the driver program, the
supervisors, TF processes and their children: TensorBoard, its data server) must all be inside
the range. The JVMs' and PySpark's own ports (the accumulator server in the driver's Python, the
executors' ``pyspark.daemon``) are Spark's: Spark's own settings confine them. A range too
small for one fed node fails at once, before any node starts, with a ``ConfigError`` naming
``port_range``.

Where namespaces cannot be made (not root, no ``ip``/``unshare``) the tests skip, saying why.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tfonspark.testing.hosts import Host, Hosts

from .conftest import wait_until

pytestmark = [pytest.mark.hosts, pytest.mark.spark]

DRIVER = Path(__file__).with_name("port_range_driver.py")
LOW, HIGH = 20000, 20063  # below Linux's ephemeral ports (32768-60999): no random port lands inside
PORT_RANGE = f"{LOW}-{HIGH}"
SMALL = "20100"  # one port: a fed node needs two (its TF port and its feed server)
PHASES = ("main", "data", "ps")
OURS = ("tfonspark", DRIVER.name)  # in the command line of a process of ours or of an ancestor


def _listening(host: Host) -> list[tuple[str, int, int]]:
    """``(address, port, inode)`` of every TCP socket listening in ``host``'s namespace."""
    found = []
    for table in ("tcp", "tcp6"):
        text = subprocess.run(
            ["ip", "netns", "exec", host.name, "cat", f"/proc/net/{table}"], capture_output=True, text=True, check=True
        ).stdout
        for line in text.splitlines()[1:]:
            fields = line.split()
            if len(fields) < 10 or fields[3] != "0A":
                continue
            hex_address, hex_port = fields[1].split(":")
            raw = bytes.fromhex(hex_address)
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))  # words in host order
            family = socket.AF_INET6 if len(raw) == 16 else socket.AF_INET
            found.append((socket.inet_ntop(family, raw), int(hex_port, 16), int(fields[9])))
    return found


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _ours(pid: int) -> bool:
    """A process of tfonspark's: not a JVM, and it or an ancestor (below the JVMs) runs our code."""
    seen = 0
    while pid > 1 and seen < 64:
        argv = _cmdline(pid)
        if argv and os.path.basename(argv[0]) == "java":
            return False
        if any(mark in arg for arg in argv for mark in OURS):
            return True
        pid, seen = _parent(pid), seen + 1
    return False


def _sockets_of(pids: list[int]) -> dict[int, int]:
    """inode -> pid of every socket the processes ``pids`` hold."""
    held = {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                held.setdefault(int(target[8:-1]), pid)
    return held


def _scan(hosts: Hosts, spark_ports: set[int], driver_pid: int) -> list[dict]:
    """Every listening socket of every host, with its process and whether it is tfonspark's."""
    rows = []
    for host in hosts.all:
        owners = _sockets_of(hosts.processes(host))
        for address, port, inode in _listening(host):
            pid = owners.get(inode, 0)
            argv = _cmdline(pid) if pid else []
            ours = bool(pid) and _ours(pid) and not (pid == driver_pid and port in spark_ports)
            rows.append(
                {
                    "host": host.name,
                    "address": address,
                    "port": port,
                    "pid": pid,
                    "process": " ".join(argv)[:160],
                    "ours": ours,
                    "inside": LOW <= port <= HIGH,
                }
            )
    return rows


@pytest.fixture(scope="module")
def outcome(hosts, tmp_path_factory):
    """Run the driver program once; while each of its clusters runs, read every listening socket."""
    out = tmp_path_factory.mktemp("port-range")
    master = f"spark://{hosts.master.address}:7077"
    argv = [sys.executable, str(DRIVER), master, str(out), PORT_RANGE, SMALL]
    scans: dict[str, list[dict]] = {}
    started = time.monotonic()
    with open(out / "driver.log", "wb") as log:
        driver = hosts.popen(hosts.driver, argv, log=log)
        try:
            for phase in PHASES:
                ready = out / f"ready-{phase}.json"
                assert wait_until(lambda r=ready: r.exists() or driver.poll() is not None, 240), phase
                assert driver.poll() is None, (out / "driver.log").read_text()[-4000:]
                info = json.loads(ready.read_text())
                scans[phase] = _scan(hosts, set(info["spark_ports"]), info["pid"])
                (out / f"go-{phase}").touch()
            driver.wait(timeout=180)
        finally:
            if driver.poll() is None:
                driver.kill()
            driver.wait()
    seconds = time.monotonic() - started
    assert driver.returncode == 0, (out / "driver.log").read_text()[-4000:]
    return {
        "scans": scans,
        "small": json.loads((out / "small.json").read_text()),
        "driver": json.loads((out / "driver.json").read_text()),
        "seconds": seconds,
    }


def test_every_port_tfonspark_listens_on_is_inside_the_range(hosts, outcome):
    outside, workers = [], {h.name for h in hosts.workers}
    for phase, rows in outcome["scans"].items():
        print(f"--- {phase}: listening sockets (ours, inside {PORT_RANGE}?) ---")
        for row in rows:
            mark = ("ours" if row["ours"] else "spark/other") + (" inside" if row["inside"] else " OUTSIDE")
            print(f"{row['host']:13} {row['address']}:{row['port']:<6} {mark:20} pid {row['pid']} {row['process']}")
            if row["ours"] and not row["inside"]:
                outside.append((phase, row["host"], row["address"], row["port"], row["process"]))
    print(f"driver: {outcome['driver']}, whole run {outcome['seconds']:.1f}s")
    assert not outside, f"tfonspark listens outside {PORT_RANGE}: {outside}"
    spread = {"main": 2, "data": 2, "ps": 3}  # worker hosts with a process of ours: nodes, workers, ps
    for phase, rows in outcome["scans"].items():  # and it did listen: the scan saw the cluster
        on = {r["host"] for r in rows if r["ours"]}
        assert hosts.driver.name in on and len(on & workers) == spread[phase], (phase, on)
    main = [r for r in outcome["scans"]["main"] if r["ours"] and r["host"] != hosts.driver.name]
    assert len(main) >= 5, main  # per node its TF port and feed server; TensorBoard on the chief
    assert any("tensorboard.main" in r["process"] for r in main), main
    assert outcome["driver"]["fed"] == 1000


def test_the_coordinator_and_the_dispatcher_serve_from_the_driver_host(hosts, outcome):
    """ps_cluster's chief (the coordinator) and the tf.data dispatcher run in the driver program,
    on the driver host; the ps, workers and data workers on the worker hosts. Every address is
    the hosts' own, training converges and every element is read once."""
    out, addresses = outcome["driver"], {h.address for h in hosts.workers}
    spec = out["ps_spec"]
    print(
        f"ps_cluster {spec}: loss {out['losses'][0]:.3f} -> {out['losses'][-1]:.4f}; data service "
        f"{out['dispatcher']} with {out['data_workers']}"
    )
    assert [a.rsplit(":", 1)[0] for a in spec["chief"]] == [hosts.driver.address]
    assert {a.rsplit(":", 1)[0] for role in ("ps", "worker") for a in spec[role]} <= addresses
    assert len(out["losses"]) == 50 and out["losses"][-1] < out["losses"][0] / 4
    assert out["dispatcher"].removeprefix("grpc://").rsplit(":", 1)[0] == hosts.driver.address
    assert len(out["data_workers"]) == 2 and {a.rsplit(":", 1)[0] for a in out["data_workers"]} <= addresses
    assert out["elements"] == list(range(2000))


def test_a_range_too_small_fails_at_once_naming_port_range(outcome):
    small = outcome["small"]
    print(f"too small a range: {small}")
    assert small["type"] == "ConfigError", small
    assert "port_range" in small["error"] and SMALL in small["error"], small["error"]
    assert "feed server" in small["error"], small["error"]  # what needed the port it lacks
    assert small["seconds"] < 5, small
