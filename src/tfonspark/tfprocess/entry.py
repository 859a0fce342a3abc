"""Main of the TF process: build the context, start the feed server and TensorBoard, run map_fun.

Spawned by the supervisor as ``python -m tfonspark.tfprocess.entry --cluster ID --node ROLE:INDEX``
(labels for ``ps`` only) with the bootstrap on stdin.
Events go to the supervisor over a status pipe as JSON lines: ``up`` once the node is ready,
``error`` with the traceback if ``map_fun`` raises. EOF on stdin means the supervisor died, and
this process exits at once rather than outlive it.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import traceback
from typing import IO, Any

from ..config import InputMode, NodeConfig
from ..wire.bootstrap import read_bootstrap
from .context import NodeContext


def _watch_parent(stdin: IO[bytes]) -> None:
    """Exit when the supervisor's end of our stdin closes (it died or was killed)."""
    while stdin.read(65536):
        pass
    os._exit(70)


def _emit(status: IO[str], event: str, **fields: Any) -> None:
    status.write(json.dumps({"event": event, **fields}) + "\n")
    status.flush()


def _start_feed_server(config: NodeConfig, job_name: str) -> Any:
    if config.input_mode != InputMode.SPARK or job_name not in ("chief", "master", "worker"):
        return None
    from .feedserver import FeedServer

    return FeedServer(config.secret, buffer_bytes=config.feed_buffer_bytes)


def _start_tensorboard(config: NodeConfig, ctx: NodeContext, host: str) -> str:
    if not config.tensorboard or not ctx.is_chief:
        return ""
    from .tensorboard import start_tensorboard

    return start_tensorboard(config.log_dir or ctx.absolute_path("tensorboard"), host,
                             config.tensorboard_port)


def run(header: dict[str, Any], payload: bytes, status: IO[str]) -> int:
    from pyspark import cloudpickle

    config = NodeConfig.from_json(header["config"])
    tmp_socket = socket.socket(fileno=header["port_fd"])
    feed = _start_feed_server(config, header["job_name"])
    ctx = NodeContext(
        executor_id=header["executor_id"], job_name=header["job_name"],
        task_index=header["task_index"], cluster_spec=header["cluster_spec"],
        default_fs=config.default_fs, working_dir=header["working_dir"], mgr=feed,
        tmp_socket=tmp_socket)
    ctx.tensorboard_url = _start_tensorboard(config, ctx, header["host"])
    if config.release_port:
        ctx.release_port()
    map_fun, tf_args = cloudpickle.loads(payload)
    _emit(status, "up", host=header["host"], data_port=feed.port if feed else 0,
          data_path=feed.unix_path if feed else "", tensorboard_url=ctx.tensorboard_url)
    try:
        map_fun(tf_args, ctx)
    except BaseException:
        text = traceback.format_exc()
        sys.stderr.write(text)
        _emit(status, "error", traceback=text)
        return 1
    finally:
        if feed is not None:
            feed.close()
    return 0


def main() -> None:
    header, payload = read_bootstrap(sys.stdin.buffer)
    threading.Thread(target=_watch_parent, args=(sys.stdin.buffer,), daemon=True).start()
    status = os.fdopen(header["status_fd"], "w")
    try:
        code = run(header, payload, status)
    except BaseException:
        text = traceback.format_exc()
        sys.stderr.write(text)
        _emit(status, "error", traceback=text)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown: TF's gRPC/collective threads can hang it


if __name__ == "__main__":
    main()
