"""One TF process for test_port_handover.py: can another user take the node's port before TF has it?

``python port_handover_worker.py {start_cluster_server|mwms|explicit} OUT_JSON``

It does what a node does: reserves the port as the supervisor does (``host.reserve_port``),
then runs the TF process's own ``entry.run`` (which releases the port before ``map_fun`` is
unpickled when ``release_port=True``) with a ``map_fun`` that waits a second (standing for
unpickling, imports and data set-up), imports TensorFlow and starts the node's TF server:

* ``start_cluster_server``: ``ctx.start_cluster_server()`` (``tf.distribute.Server``);
* ``mwms``: ``tf.distribute.MultiWorkerMirroredStrategy()`` from ``TF_CONFIG``;
* ``explicit``: ``release_port=False``; ``map_fun`` calls ``ctx.release_port()`` itself, as
  TFoS programs do, waits, then starts ``tf.distribute.Server`` itself.

From the reservation on, two intruders (forked, and another user, nobody, where this runs as
root) spin on ``bind()`` + ``listen()`` of the port on 0.0.0.0, 127.0.0.1, :: and ::1: one
plain, as in issue 21, until the server is up; one with ``SO_REUSEADDR`` until just before the
server starts (the hand-over leaves such a socket a window of a few ms: see server.py).
Writes ``{"code", "events", "intruders", "server", "still_held", "listening"}`` to OUT_JSON.
"""

from __future__ import annotations

import io
import json
import os
import select
import socket
import sys
import time

TARGETS = [
    (socket.AF_INET, "0.0.0.0"),
    (socket.AF_INET, "127.0.0.1"),
    (socket.AF_INET6, "::"),
    (socket.AF_INET6, "::1"),
]
NOBODY = 65534


def _intruder(port: int, reuseaddr: bool, stop_fd: int, out_fd: int) -> None:
    """Spin on bind()+listen() of ``port`` until ``stop_fd`` closes; report what was taken."""
    os.nice(19)  # spins on any idle core, without starving TF's import on a small machine
    if os.geteuid() == 0:  # another local user, as in the issue
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    attempts, took, accepted = 0, "", 0
    while not took and not select.select([stop_fd], [], [], 0)[0]:
        for family, address in TARGETS:
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
            took = address
            sock.settimeout(0.1)
            while not select.select([stop_fd], [], [], 0)[0]:  # hold it; count the peers it steals
                try:
                    sock.accept()[0].close()
                    accepted += 1
                except OSError:
                    pass
            break
    os.write(out_fd, json.dumps({"took": took, "attempts": attempts, "accepted": accepted}).encode())


def _start_intruder(port: int, reuseaddr: bool, reserved_fd: int) -> tuple[int, int, int]:
    """Fork an intruder; returns (pid, the write end that stops it, the read end of its report)."""
    stop_r, stop_w = os.pipe()
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(reserved_fd)  # its copy of the reservation would hold the port for us
            os.close(stop_w)
            os.close(out_r)
            _intruder(port, reuseaddr, stop_r, out_w)
        finally:
            os._exit(0)
    os.close(stop_r)
    os.close(out_w)
    return pid, stop_w, out_r


def _stop_intruder(intruder: tuple[int, int, int]) -> dict:
    pid, stop_w, out_r = intruder
    os.close(stop_w)
    os.waitpid(pid, 0)
    with os.fdopen(out_r, "rb") as report:
        return json.loads(report.read() or b"{}")


def map_fun(args: dict, ctx) -> None:
    """Runs in entry.run from a cloudpickled copy: what it saw goes to ``args["seen"]`` (a file)."""
    seen: dict = {"intruders": {}, "server": False, "listening": False}
    try:
        time.sleep(args["wait"])  # unpickling, imports, data set-up: the port used to be free here
        if args["mode"] == "explicit":
            ctx.release_port()  # TFoS: release_port=False programs release it themselves...
            time.sleep(args["wait"])  # ...then build their model before the server starts
        import tensorflow as tf

        seen["intruders"]["reuseaddr"] = _stop_intruder(args["reuseaddr"])  # stops right before the start
        if args["mode"] == "start_cluster_server":
            ctx.start_cluster_server()
        elif args["mode"] == "mwms":
            tf.distribute.MultiWorkerMirroredStrategy()
        else:
            spec = tf.train.ClusterSpec(ctx.cluster_spec)
            seen["target"] = tf.distribute.Server(spec, job_name=ctx.job_name, task_index=ctx.task_index).target
        seen["server"] = True
        from tfonspark.tfprocess.server import pending_handovers

        seen["still_held"] = [h.port for h in pending_handovers()]  # the reservation went with the start
        seen["intruders"]["plain"] = _stop_intruder(args["plain"])  # it spun through the hand-over
        with socket.create_connection(("127.0.0.1", args["port"]), timeout=5):  # TF's server answers
            seen["listening"] = True
    finally:
        with open(args["seen"], "w") as f:
            json.dump(seen, f)


def main(mode: str, out_path: str) -> None:
    from pyspark import cloudpickle

    from tfonspark import host
    from tfonspark.config import InputMode, NodeConfig
    from tfonspark.tfprocess import entry

    reserved = host.reserve_port()  # what the supervisor does, then hands to the TF process
    port = reserved.getsockname()[1]
    address = f"127.0.0.1:{port}"
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": [address]}, "task": {"type": "worker", "index": 0}})
    intruders = {name: _start_intruder(port, name == "reuseaddr", reserved.fileno()) for name in ("plain", "reuseaddr")}
    args = {"mode": mode, "wait": 1.0, "port": port, "seen": out_path + ".seen", **intruders}
    config = NodeConfig(
        cluster_id="handover",
        driver_host="127.0.0.1",
        driver_port=1,
        secret_hex="ab" * 32,
        input_mode=InputMode.TENSORFLOW,
        release_port=mode != "explicit",
    )
    header = {
        "config": config.to_json(),
        "host": "127.0.0.1",
        "port_fd": reserved.detach(),
        "executor_id": 0,
        "job_name": "worker",
        "task_index": 0,
        "cluster_spec": {"worker": [address]},
        "working_dir": os.getcwd(),
    }
    status = io.StringIO()
    code = entry.run(header, cloudpickle.dumps((map_fun, args)), status)
    with open(args["seen"]) as f:
        seen = json.load(f)
    for name, intruder in intruders.items():  # map_fun failed before stopping it
        if name not in seen["intruders"]:
            seen["intruders"][name] = _stop_intruder(intruder)
    events = [json.loads(line[1:]) for line in status.getvalue().splitlines()]  # J + a typed event
    with open(out_path, "w") as f:
        json.dump({"code": code, "events": events, **seen}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    sys.stdout.flush()
    os._exit(0)  # TF's gRPC threads can hang interpreter teardown
