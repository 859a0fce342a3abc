"""One TF process for test_port_handover.py: can another user take the node's port before TF has it?

``python port_handover_worker.py {start_cluster_server|mwms|explicit} OUT_JSON [through_start]``

It does what a node does: reserves the port as the supervisor does (``ports.reserve_port``),
then runs the TF process's own ``entry.run`` (which releases the port before ``map_fun`` is
unpickled when ``release_port=True``) with a ``map_fun`` that waits a second (standing for
unpickling, imports and data set-up), imports TensorFlow and starts the node's TF server:

* ``start_cluster_server``: ``ctx.start_cluster_server()`` (``tf.distribute.Server``);
* ``mwms``: ``tf.distribute.MultiWorkerMirroredStrategy()`` from ``TF_CONFIG``;
* ``explicit``: ``release_port=False``; ``map_fun`` calls ``ctx.release_port()`` itself, as
  TFoS programs do, waits, then starts ``tf.distribute.Server`` itself.

From the reservation on, intruders (``port_intruder.py``: user nobody where this runs as root)
spin on ``bind()`` + ``listen()`` of the port on 0.0.0.0, 127.0.0.1, :: and ::1: one plain,
as in issue 21, until the server is up; one with ``SO_REUSEADDR`` until just before the
server starts (TF's own start leaves such a socket a window: see server.py). With
``through_start``, four with ``SO_REUSEADDR`` instead, one per address at the node's own
priority, started right before TF's start, spin through it until the server is up or the start
failed: issue 43's row 4, what that window gives them.
Writes ``{"code", "events", "intruders", "server", "still_held", "listening", "shared_ms", "port"}`` to
OUT_JSON (``shared_ms``: how long the reservation shared the port, TF's start call).
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import socket
import sys
import time

from port_intruder import TARGETS, Intruder

INTRUDERS: dict[str, Intruder] = {}  # by name, for map_fun (it runs in this process: entry.run)


def start_window_intruders(port: int) -> None:
    """One ``SO_REUSEADDR`` intruder per address, at the nodes' own priority, to spin through TF's start."""
    for _, where in TARGETS:
        INTRUDERS[f"reuseaddr {where}"] = Intruder(port, True, nice=0, addresses=[where])


def stop_intruders(prefix: str) -> dict[str, dict]:
    """Stop the intruders whose name starts with ``prefix``; their reports by name."""
    return {name: intruder.stop() for name, intruder in INTRUDERS.items() if name.startswith(prefix)}


class _Shared(logging.Handler):
    """What server.py's hand-over logs: how long it shared the port with TF's start."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.ms: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        found = re.search(r"shared ([0-9.]+) ms", record.getMessage())
        if found:
            self.ms.append(float(found.group(1)))


def map_fun(args: dict, ctx) -> None:
    """Runs in entry.run from a cloudpickled copy: what it saw goes to ``args["seen"]`` (a file)."""
    import __main__ as worker  # this script, as a module: the intruders

    seen: dict = {"intruders": {}, "server": False, "listening": False}
    try:
        time.sleep(args["wait"])  # unpickling, imports, data set-up: the port used to be free here
        if args["mode"] == "explicit":
            ctx.release_port()  # TFoS: release_port=False programs release it themselves...
            time.sleep(args["wait"])  # ...then build their model before the server starts
        import tensorflow as tf

        if args["through_start"]:
            worker.start_window_intruders(args["port"])  # spinning as the start begins
        else:
            seen["intruders"].update(worker.stop_intruders("reuseaddr"))  # stops right before the start
        try:
            if args["mode"] == "start_cluster_server":
                ctx.start_cluster_server()
            elif args["mode"] == "mwms":
                tf.distribute.MultiWorkerMirroredStrategy()
            else:
                spec = tf.train.ClusterSpec(ctx.cluster_spec)
                seen["target"] = tf.distribute.Server(spec, job_name=ctx.job_name, task_index=ctx.task_index).target
        finally:
            seen["intruders"].update(worker.stop_intruders(""))  # they spun through the start
        seen["server"] = True
        from tfonspark.ports import pending_handovers

        seen["still_held"] = [h.port for h in pending_handovers()]  # the reservation went with the start
        with socket.create_connection(("127.0.0.1", args["port"]), timeout=5):  # TF's server answers
            seen["listening"] = True
    finally:
        with open(args["seen"], "w") as f:
            json.dump(seen, f)


def main(mode: str, out_path: str, through_start: bool) -> None:
    from pyspark import cloudpickle

    from tfonspark import ports
    from tfonspark.config import InputMode, NodeConfig
    from tfonspark.tfprocess import entry

    shared = _Shared()
    logging.getLogger("tfonspark.ports").addHandler(shared)
    logging.getLogger("tfonspark.ports").setLevel(logging.DEBUG)
    reserved = ports.reserve_port()  # what the supervisor does, then hands to the TF process
    port = reserved.getsockname()[1]
    address = f"127.0.0.1:{port}"
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": [address]}, "task": {"type": "worker", "index": 0}})
    INTRUDERS["plain"] = Intruder(port, False)
    if not through_start:
        INTRUDERS["reuseaddr"] = Intruder(port, True)
    args = {"mode": mode, "wait": 1.0, "port": port, "seen": out_path + ".seen", "through_start": through_start}
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
    seen["intruders"].update(stop_intruders(""))  # map_fun failed before stopping them
    events = [json.loads(line[1:]) for line in status.getvalue().splitlines()]  # J + a typed event
    with open(out_path, "w") as f:
        json.dump({"code": code, "events": events, "shared_ms": shared.ms, "port": port, **seen}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:] == ["through_start"])
    sys.stdout.flush()
    os._exit(0)  # TF's gRPC threads can hang interpreter teardown
