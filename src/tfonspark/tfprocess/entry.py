"""Main of the TF process: build the context, start the feed server and TensorBoard, run map_fun.

Spawned by the supervisor as ``python -m tfonspark.tfprocess.entry --cluster ID --node ROLE:INDEX``
(labels for ``ps`` only) with the bootstrap on stdin.
Events go to the supervisor over a status pipe, one typed event a line (:mod:`..wire.events`):
``FeedSocket`` as soon as the feed server's Unix socket exists (so the supervisor removes it
however this process dies), ``ProcessUp`` once the node is ready, a ``NodeEvent`` for what the
feed server reports while it runs and for ``ctx.report({...})`` (``Reported``, sent from a
background thread: :mod:`.report`), ``ProcessError`` with the traceback if ``map_fun`` raises. EOF on stdin means the supervisor died:
this process removes its feed socket and exits at once (with its process group: TensorBoard)
rather than outlive it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
import traceback
from collections.abc import Callable
from typing import IO, Any

from ..config import InputMode, NodeConfig
from ..host import bind_address, remove_scratch
from ..ports import confine
from ..tfimport import prepare_tensorflow_import
from ..wire import events as ev
from ..wire import messages as m
from ..wire.bootstrap import read_bootstrap
from ..wire.framing import remove_unix_socket
from .context import NodeContext
from .hints import hint_for
from .report import Reporter

_status_lock = threading.Lock()  # several threads emit (main, feed-server threads, reporter)
_REPORT_FLUSH_SECS = 10.0  # how long reports still queued when map_fun returns may take to go out
_cleanup_lock = threading.Lock()  # held while the feed socket is made, so _parent_gone sees it


class _State:
    feed_path = ""  # the feed server's Unix socket while it exists
    own_group = False  # this process leads its process group (spawned by the supervisor)


def _watch_parent(stdin: IO[bytes]) -> None:
    """Exit when the supervisor's end of our stdin closes (it died or was killed)."""
    while stdin.read(65536):
        pass
    _parent_gone()


def _parent_gone() -> None:
    """The supervisor is gone, so nobody else will clean up: remove the feed socket, stop our
    children (TensorBoard) and exit."""
    locked = _cleanup_lock.acquire(timeout=5)  # the main thread may be creating the socket
    try:
        remove_unix_socket(_State.feed_path)
        remove_scratch(os.environ.get("TMPDIR", ""))  # the private temp dir our supervisor made
    finally:
        if locked:
            _cleanup_lock.release()
    if _State.own_group:
        with contextlib.suppress(OSError):
            os.killpg(os.getpid(), signal.SIGKILL)  # the group is ours (we lead it), us included
    os._exit(70)


def _emit(status: IO[str], event: m.Message) -> None:
    """Write one status line; a supervisor that is gone is handled by ``_watch_parent``."""
    line = ev.to_line(event)
    with _status_lock, contextlib.suppress(OSError, ValueError):
        status.write(line)
        status.flush()


def _event_sink(status: IO[str]) -> Callable[[ev.NodeEvent], None]:
    """The feed server's ``on_event``: forwards a node event to the driver via the supervisor."""

    def on_event(event: ev.NodeEvent) -> None:
        with contextlib.suppress(Exception):  # never break a feed-server thread over a report
            _emit(status, event)

    return on_event


def _reporter(status: IO[str]) -> Reporter:
    """``ctx.report``'s sender: ``Reported`` events, written off the caller's thread."""
    on_event = _event_sink(status)
    return Reporter(lambda payload: on_event(ev.Reported(payload)))


def _start_feed_server(config: NodeConfig, header: dict[str, Any], bind_host: str, status: IO[str]) -> Any:
    job_name = header["job_name"]
    if config.input_mode != InputMode.SPARK or job_name not in ("chief", "master", "worker"):
        return None
    from .feedclaims import DriverClaims
    from .feedserver import FeedServer

    # the driver decides which node delivers a partition that Spark ran twice (feedclaims.py)
    claims = DriverClaims((config.driver_host, config.driver_port), config.secret, f"{job_name}:{header['task_index']}")
    with _cleanup_lock:
        feed = FeedServer(
            config.secret,
            buffer_bytes=config.feed_buffer_bytes,
            host=bind_host,
            on_event=_event_sink(status),
            claim=claims,
        )
        _State.feed_path = feed.unix_path
    if feed.unix_path:
        _emit(status, ev.FeedSocket(feed.unix_path))
    return feed


def _close_feed_server(feed: Any) -> None:
    with _cleanup_lock:
        try:
            feed.close()
            feed.claim.close()
        finally:
            remove_unix_socket(feed.unix_path)
            _State.feed_path = ""


def _start_tensorboard(config: NodeConfig, ctx: NodeContext, host: str, bind_host: str) -> str:
    if not config.tensorboard or not ctx.is_chief:
        return ""
    from .tensorboard import start_tensorboard

    return start_tensorboard(
        config.log_dir or ctx.absolute_path("tensorboard"),
        host,
        config.tensorboard_port,
        bind_host=bind_host,
        port_range=config.port_range,
    )


def run(header: dict[str, Any], payload: bytes, status: IO[str]) -> int:
    from pyspark import cloudpickle

    config = NodeConfig.from_json(header["config"])
    confine(config.port_range)  # every listener of this process: the feed server, a tf.data worker ...
    host = header["host"]  # advertised to peers; servers bind ``bind_host``
    bind_host = bind_address(config.bind_host, host)
    tmp_socket = socket.socket(fileno=header["port_fd"])
    reporter = _reporter(status)
    feed = None
    try:
        feed = _start_feed_server(config, header, bind_host, status)
        ctx = NodeContext.in_cluster(config, header, mgr=feed, tmp_socket=tmp_socket, reporter=reporter)
        ctx.tensorboard_url = _start_tensorboard(config, ctx, host, bind_host)
        if config.release_port:
            ctx.release_port()
        map_fun, tf_args = cloudpickle.loads(payload)
        if config.debug:  # run(debug=Debug(...)): tf.debugging around map_fun; nothing imported when off
            from .debugging import Debug, debugged

            map_fun = debugged(map_fun, Debug.from_dict(config.debug), ctx.job_name, ctx.task_index)
        up = ev.ProcessUp(host, feed.port if feed else 0, feed.unix_path if feed else "", ctx.tensorboard_url or "")
        _emit(status, up)
        try:
            map_fun(tf_args, ctx)
        except BaseException as exc:
            text = traceback.format_exc()
            hint = hint_for(exc)
            if hint:
                text += f"Hint: {hint}\n"
            sys.stderr.write(text)
            _emit(status, ev.ProcessError(text))
            return 1
        finally:
            reporter.flush(_REPORT_FLUSH_SECS)  # what map_fun reported last is often the result
        return 0
    finally:
        if feed is not None:
            _close_feed_server(feed)


def main() -> None:
    prepare_tensorflow_import()  # map_fun's (or its unpickling's) first ``import tensorflow``
    _State.own_group = os.getpgrp() == os.getpid()  # the supervisor starts us in a new session
    header, payload = read_bootstrap(sys.stdin.buffer)
    threading.Thread(target=_watch_parent, args=(sys.stdin.buffer,), daemon=True).start()
    status = os.fdopen(header["status_fd"], "w")
    try:
        code = run(header, payload, status)
    except BaseException:
        text = traceback.format_exc()
        sys.stderr.write(text)
        _emit(status, ev.ProcessError(text))
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown: TF's gRPC/collective threads can hang it


if __name__ == "__main__":
    main()
