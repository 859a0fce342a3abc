"""This node's TF server and its port: ``ctx.start_cluster_server()`` (TFoS's ``TFNode.start_cluster_server``)
and the hand-over of the port reserved for it.

Only programs that drive TensorFlow's servers themselves need ``start_cluster_server`` (parameter
servers, TF 1-style graphs). ``MultiWorkerMirroredStrategy`` and ``ParameterServerStrategy``
start their own from ``TF_CONFIG``, which the node already has.

**The hand-over.** The supervisor reserves the node's port (``host.py``: bound, not
listening, no ``SO_REUSEADDR``: nobody else can bind it on any address). Releasing it before
``map_fun`` runs, as TFoS did, left it free for seconds (unpickling, imports, model set-up)
until TF's server bound it, and another local user spinning on ``bind()`` took it. TF cannot
take over a bound socket, and it turns ``SO_REUSEPORT`` off for its gRPC server
(``NoReusePortOption`` in ``grpc_server_lib.cc``): TF 2.21 binds ``[::]:port`` with
``SO_REUSEADDR`` only (checked with strace). So :func:`hand_over_port` keeps the reservation
and hooks the calls where TF starts a server (``TF_NewServer``: ``tf.distribute.Server``;
``TFE_EnableCollectiveOps``: ``MultiWorkerMirroredStrategy``; ``TFE_ContextSetServerDef*`` and
``TFE_ContextUpdateServerDef*``: ``connect_to_cluster``, ``ParameterServerStrategy``'s
coordinator), plus ``socket.bind`` of the port from Python. Right before such a call it sets
``SO_REUSEADDR`` on the reservation, so the server's socket (which sets it too) can bind the
port while the reservation still holds it, and closes the reservation once the call returns.

What that leaves, on Linux: a socket *without* ``SO_REUSEADDR`` can never bind the port
before the server has it (no gap; it could for 7-12 s before, from the release ahead of
``map_fun`` to TF's bind). A socket *with* ``SO_REUSEADDR``, any user's, can in one window,
which no code of ours can close: from the start of that TF call to the server's ``listen()``,
TF's own set-up before it binds (TF binds the wildcard ``0.0.0.0:port``, which gRPC makes
``[::]:port``, with no option for another address; our reservation cannot stay exclusive, nor
listen, and still let TF's socket bind beside it). Measured with strace (TF 2.21 on CPU, 2
shared cores at load 2-5): 6-64 ms from our ``SO_REUSEADDR`` to TF's ``listen`` for
``tf.distribute.Server`` and for MWMS (on a GPU node ``tf.distribute.Server`` also creates its
GPU devices in it). Another user spinning on ``bind()`` + ``listen()`` with the option, at the
node's own priority, one process per address, gets in nearly every time: in 7 of 8 starts
(4 ``tf.distribute.Server``, 4 MWMS) and in 8 of 8 in a second series
(``tests/integration/test_port_handover.py``). What it got, before: TF's server failed ("Could
not start gRPC server": 6 of 8, no word of who holds the port), or, on ``[::1]`` (an address
TF's ``[::]`` socket then leaves to it: gRPC falls back to ``0.0.0.0``), TF started beside it
and it had the ``::1`` peers (1 of 8). Now, right after the call, :func:`_refuse_intruders`
reads who listens on the port (``host.foreign_listeners``) and fails the node with a
``ClusterError`` that names each other listener and its user: 8 of 8, none served beside one.
Peers that connected to the intruder before the node's failure stopped the cluster still
reached it; only running each job where no other user has processes closes that
(docs/architecture.md, "Ports and binds"). Once TF listens the reservation is sealed again
(``host.seal_port``) and closed. The reservation never sets ``SO_REUSEPORT``, so outside that
window no socket of another user gets in; a process of the *same* user can always take the
port (it could also ptrace the node). The first TF server started in the process takes the
port, whatever port it binds, and so does a Python ``bind()`` of the port; a server started any
other way (a child process, a library outside Python and TF) needs ``ctx.release_port(now=True)``.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

from ..errors import ClusterError, ReservationTimeout
from ..host import Listener, foreign_listeners, seal_port, share_port
from ..importhook import AfterImport

__all__ = [
    "SERVER_STARTS",
    "ChiefCoordinator",
    "PortHandover",
    "ServeBesideEvaluator",
    "ServerNode",
    "coordinator_spec",
    "hand_over_port",
    "leave_out_evaluator",
    "pending_handovers",
    "release_handovers",
    "run_evaluator",
    "serve",
    "servers_accepting",
    "start_cluster_server",
    "wait_for_servers",
]

_log = logging.getLogger(__name__)

#: where TF 2.x starts a gRPC server, by module: every call TF's Python makes to one of these
#: goes through the module attribute (``pywrap_tfe.X(...)``, ``c_api.X(...)``), so replacing the
#: attribute sees it. The first name of each module must exist, else the hand-over cannot see
#: that TF's server start and the port is released at once (the old behaviour) with a warning.
SERVER_STARTS: dict[str, tuple[str, ...]] = {
    "tensorflow.python.client.pywrap_tf_session": ("TF_NewServer",),
    "tensorflow.python.pywrap_tfe": (
        "TFE_EnableCollectiveOps",
        "TFE_ContextSetServerDef",
        "TFE_ContextSetServerDefWithTimeout",
        "TFE_ContextSetServerDefWithTimeoutAndRetries",
        "TFE_ContextUpdateServerDef",
        "TFE_ContextUpdateServerDefWithTimeout",
    ),
}


class PortHandover:
    """A node's reserved port, held until a server in this process binds it (see the module doc)."""

    def __init__(self, sock: socket.socket) -> None:
        self.port: int = sock.getsockname()[1]
        self._sock: socket.socket | None = sock
        self._lock = threading.Lock()

    def share_with_server(self) -> None:
        """Let a socket that sets ``SO_REUSEADDR`` bind the port too (a server about to bind it)."""
        with self._lock:
            if self._sock is not None:
                share_port(self._sock)

    def release(self, listening: bool = False) -> None:
        """Close the reservation (idempotent); the last one released removes the hooks.

        ``listening``: the server that took the port listens now, so the reservation is sealed
        first (``host.seal_port``): where the supervisor holds it too (a worker that restarts in
        place), nobody else binds the port once the server is gone. Not after a Python
        ``bind()``: its socket listens only later, and could not beside a sealed reservation.
        """
        with self._lock:
            sock, self._sock = self._sock, None
        if sock is None:
            return
        if listening:
            seal_port(sock)
        sock.close()
        _forget(self)


def hand_over_port(sock: socket.socket) -> PortHandover:
    """Hold ``sock``'s port until this process's TF server (or a Python ``bind``) takes it.

    Takes ownership of ``sock``: it is closed here and a private, non-inheritable duplicate
    holds the port (children forked from Python close theirs at once). Returns the hand-over;
    its ``release()`` frees the port now.
    """
    try:
        held = sock.dup()  # not inheritable: a child process would keep the port from TF's server
    except OSError:  # no descriptor to spare: hold the original
        sock.set_inheritable(False)
        held = sock
    else:
        sock.close()
    handover = PortHandover(held)
    with _state.lock:
        _state.pending.append(handover)
        _install()
    _patch_loaded_modules()
    return handover


def pending_handovers() -> list[PortHandover]:
    """The reservations this process still holds for a server."""
    with _state.lock:
        return list(_state.pending)


def release_handovers() -> None:
    """Free every port still held for a server (a server that was just started has it)."""
    for handover in pending_handovers():
        handover.release()


class ServerNode(Protocol):
    """What starting a server needs of a node (a :class:`~tfonspark.tfprocess.context.NodeContext`)."""

    cluster_spec: dict[str, list[str]]
    job_name: str
    task_index: int

    def release_port(self) -> None: ...


def start_cluster_server(ctx: ServerNode, num_gpus: int = 1, rdma: bool = False) -> tuple[Any, Any]:
    """Start this node's ``tf.distribute.Server``; return ``(tf.train.ClusterSpec, server)``.

    The port reserved for the node goes to the server as it binds it (:func:`hand_over_port`);
    whatever happens, nothing stays reserved once this returns. ps nodes typically call
    ``server.join()``; ``Cluster.shutdown()`` stops them. ``num_gpus`` is accepted for TFoS
    compatibility: GPUs are chosen when the node starts (``CUDA_VISIBLE_DEVICES``). ``rdma``
    selects the ``grpc+verbs`` protocol.
    """
    import tensorflow as tf

    cluster = tf.train.ClusterSpec(ctx.cluster_spec)
    ctx.release_port()
    try:
        server = tf.distribute.Server(
            cluster, job_name=ctx.job_name, task_index=ctx.task_index, protocol="grpc+verbs" if rdma else "grpc"
        )
    finally:
        release_handovers()
    return cluster, server


def serve(tf_args: Any, ctx: ServerNode) -> None:
    """A node of :func:`tfonspark.ps_cluster` (or a worker/ps of ``run(..., coordinator=True)``): start
    this task's server and serve until stopped.

    No user code runs here: the coordinator's ``ClusterCoordinator`` sends the work. The node's
    supervisor ends the process (SIGTERM, then SIGKILL) when the driver stops the cluster.
    ``tf_args`` is unused.
    """
    del tf_args
    _, server = start_cluster_server(ctx, num_gpus=0)
    _log.info("serving %s:%d until the cluster stops", ctx.job_name, ctx.task_index)
    server.join()


@dataclass(frozen=True)
class ChiefCoordinator:
    """The program of a ``run(..., coordinator=True)`` cluster: ``map_fun`` on the chief and on the
    evaluator (``eval_node=True``), :func:`serve` elsewhere.

    On the chief, ``map_fun(tf_args, ctx)`` is ``ParameterServerStrategy``'s coordinator: it
    starts once every ps and worker server accepts connections (up to ``timeout`` seconds), so
    the strategy's first connection finds them, and its cluster spec leaves out the evaluator
    (:func:`coordinator_spec`). On the evaluator, ``map_fun`` is a sidecar evaluator
    (:func:`run_evaluator`). Every other node serves until the driver stops it, after the chief
    has returned.
    """

    map_fun: Callable[[Any, Any], Any]
    timeout: float

    def __call__(self, tf_args: Any, ctx: ServerNode) -> Any:
        if ctx.job_name == "evaluator":
            return run_evaluator(self.map_fun, tf_args, ctx)
        if ctx.job_name != "chief":
            return serve(tf_args, ctx)
        wait_for_servers(ctx.cluster_spec, self.timeout)
        leave_out_evaluator(ctx)
        return self.map_fun(tf_args, ctx)


@dataclass(frozen=True)
class ServeBesideEvaluator:
    """The program of a ``ps_cluster(..., evaluator=fn)`` cluster: ``fn`` on the evaluator
    (:func:`run_evaluator`), :func:`serve` on every worker and ps."""

    evaluator: Callable[[Any, Any], Any]

    def __call__(self, tf_args: Any, ctx: ServerNode) -> Any:
        if ctx.job_name == "evaluator":
            return run_evaluator(self.evaluator, tf_args, ctx)
        return serve(tf_args, ctx)


def run_evaluator(fn: Callable[[Any, Any], Any], tf_args: Any, ctx: ServerNode) -> Any:
    """``fn(tf_args, ctx)`` on the evaluator of a parameter-server cluster: no TF server (TF's
    coordinator never connects to it), and SIGTERM, the driver's stop once training is done, a
    stop request that ``tfonspark.keras.sidecar_evaluate`` answers by evaluating the last
    checkpoint and returning (:func:`tfonspark.distribute.sidecar.stop_on_sigterm`)."""
    from ..distribute.sidecar import stop_on_sigterm

    stop_on_sigterm()
    _log.info("evaluator %s:%d: sidecar evaluation until the cluster stops", ctx.job_name, ctx.task_index)
    return fn(tf_args, ctx)


def coordinator_spec(spec: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """``spec`` as TF's coordinator must see it: without the ``evaluator`` job.

    ``ParameterServerStrategy`` connects to every task of its cluster spec and waits for each;
    the sidecar evaluator runs no server, so it is left out (TF's own layout: the evaluator
    reads checkpoints and is no part of the training cluster).
    """
    return {job: list(hosts) for job, hosts in spec.items() if job != "evaluator"}


def leave_out_evaluator(ctx: ServerNode) -> None:
    """The chief's ``ctx.cluster_spec`` and ``TF_CONFIG`` as :func:`coordinator_spec` (no-op without an evaluator)."""
    if "evaluator" not in ctx.cluster_spec:
        return
    from ..distribute.tf_config import TF_CONFIG_ENV, build_tf_config

    ctx.cluster_spec = coordinator_spec(ctx.cluster_spec)
    if TF_CONFIG_ENV in os.environ:
        os.environ[TF_CONFIG_ENV] = build_tf_config(ctx.cluster_spec, ctx.job_name, ctx.task_index)


_PROBE_SECS = 0.1  # between connection attempts while the servers start


def servers_accepting(spec: Mapping[str, Sequence[str]], jobs: Sequence[str] = ("ps", "worker")) -> dict[str, bool]:
    """For each task of ``jobs`` (``"worker:0"``), whether its address accepts a TCP connection now."""
    out = {}
    for job in jobs:
        for index, address in enumerate(spec.get(job, ())):
            host, _, port = address.rpartition(":")
            try:
                with socket.create_connection((host.strip("[]"), int(port)), timeout=2):
                    out[f"{job}:{index}"] = True
            except OSError:
                out[f"{job}:{index}"] = False
    return out


def wait_for_servers(
    spec: Mapping[str, Sequence[str]], timeout: float, failed: Callable[[], object] = lambda: False
) -> None:
    """Wait until every ps and worker server of ``spec`` listens, or until ``failed()`` says a node
    failed (the caller then raises that); raise ReservationTimeout naming the others after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not failed():
        accepting = servers_accepting(spec)
        waiting = [task for task, ok in accepting.items() if not ok]
        if not waiting:
            return
        if time.monotonic() > deadline:
            raise ReservationTimeout(
                f"the TensorFlow servers of {', '.join(waiting)} did not accept connections within {timeout:.0f}s "
                "(raise reservation_timeout, or check the executor logs)",
                registered=len(accepting) - len(waiting),
                required=len(accepting),
            )
        time.sleep(_PROBE_SECS)


# ---- the hooks: installed while a hand-over is pending, removed with the last one ----------------


class _State:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.pending: list[PortHandover] = []
        self.patched: list[tuple[Any, str, Any]] = []  # (owner, attribute, the original)
        self.finder: AfterImport | None = None
        self.bind: Callable[[socket.socket, Any], None] = socket.socket.bind  # the bind that was there
        self.at_fork = False


_state = _State()


def _install() -> None:
    """Hook Python's ``socket.bind`` and TF's modules as they load (with ``_state.lock`` held)."""
    if _state.finder is None:
        _state.finder = AfterImport(SERVER_STARTS, _patch_module)
        _state.finder.install()
        _state.bind = socket.socket.bind
        _patch(socket.socket, "bind", _python_bind)
    if not _state.at_fork:
        _state.at_fork = True
        os.register_at_fork(after_in_child=_forget_all_in_child)


def _forget(handover: PortHandover) -> None:
    with _state.lock:
        if handover in _state.pending:
            _state.pending.remove(handover)
        if not _state.pending:
            _uninstall()


def _uninstall() -> None:
    """Put back every attribute replaced (with ``_state.lock`` held), unless replaced again since."""
    for owner, name, original in reversed(_state.patched):
        current = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
        if getattr(current, "_tfos_handover", False):
            if original is _ABSENT:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
    _state.patched.clear()
    if _state.finder is not None:
        _state.finder.remove()
        _state.finder = None


def _forget_all_in_child() -> None:
    """In a child forked from Python: close its copies of the reservations (never the parent's).

    Locks another thread held at the fork stay held in the child: they are made anew first."""
    _state.lock = threading.RLock()
    for handover in _state.pending:
        handover._lock = threading.Lock()
    release_handovers()


_ABSENT = object()


def _patch(owner: Any, name: str, replacement: Callable[..., Any]) -> None:
    original = owner.__dict__.get(name, _ABSENT) if isinstance(owner, type) else getattr(owner, name)
    replacement._tfos_handover = True  # type: ignore[attr-defined]
    setattr(owner, name, replacement)
    _state.patched.append((owner, name, original))


def _python_bind(sock: socket.socket, address: Any) -> None:
    """``socket.socket.bind`` while a hand-over is pending: a bind of the held port gets it."""
    original = _state.bind
    handovers = [h for h in pending_handovers() if sock.family in _INET and _port_of(address) == h.port]
    if not handovers:
        original(sock, address)
        return
    for handover in handovers:
        handover.share_with_server()
    try:
        original(sock, address)  # co-binds where ``sock`` sets SO_REUSEADDR: no gap
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        for handover in handovers:  # a socket without SO_REUSEADDR: free the port right before
            handover.release()
        original(sock, address)
    finally:
        for handover in handovers:
            handover.release()


_INET = (socket.AF_INET, socket.AF_INET6)


def _port_of(address: Any) -> int | None:
    if isinstance(address, tuple) and len(address) >= 2 and isinstance(address[1], int):
        return address[1]
    return None


def _server_start(start: Callable[..., Any], name: str) -> Callable[..., Any]:
    """``start`` (a TF call that creates and binds a gRPC server) with the hand-over around it."""

    def handing_over(*args: Any, **kwargs: Any) -> Any:
        handovers = pending_handovers()
        for handover in handovers:
            handover.share_with_server()
        shared = time.monotonic()
        try:
            started = start(*args, **kwargs)
        except BaseException as exc:
            _refuse_intruders(handovers, name, exc)
            raise
        finally:
            for handover in handovers:
                handover.release(listening=True)
            if handovers:
                ms = (time.monotonic() - shared) * 1000
                _log.debug(
                    "port(s) %s handed over to TF's server (%s): shared %.1f ms", [h.port for h in handovers], name, ms
                )
        _refuse_intruders(handovers, name, None)
        return started

    handing_over.__name__ = getattr(start, "__name__", name)
    handing_over.__doc__ = getattr(start, "__doc__", None)
    return handing_over


def _refuse_intruders(handovers: Sequence[PortHandover], name: str, error: BaseException | None) -> None:
    """Raise ClusterError where another process listens on a port just handed to TF's server.

    TF's own start leaves a window (the module doc): a socket with ``SO_REUSEADDR`` that binds
    and listens in it either makes TF's server fail (``error``: named here, with who took the
    port) or, on an address TF's does not cover (``[::1]`` when TF falls back to ``0.0.0.0``),
    serves beside it. Either way the node must not go on: peers would reach the other process.
    """
    for handover in handovers:
        others = foreign_listeners(handover.port)
        if others:
            raise ClusterError(
                f"another process also listens on this node's port {handover.port}: {_named(others)}. It took "
                f"the port in the milliseconds of TensorFlow's own server start ({name}), where TF's "
                "SO_REUSEADDR lets any local user's SO_REUSEADDR socket bind beside ours; the node refuses to "
                "run beside it, since its peers would reach that process. Run each job's executors where no "
                "other user has processes (their own user and host, or a container with its own network "
                "namespace): see docs/architecture.md, Ports and binds"
                + (f". TensorFlow's own error: {error}" if error is not None else "")
            ) from error


def _named(listeners: Sequence[Listener]) -> str:
    """``[::1]:8470 (uid 65534), 0.0.0.0:8470 (uid 0)``."""
    where = (f"[{x.address}]" if ":" in x.address else x.address for x in listeners)
    return ", ".join(f"{address}:{x.port} (uid {x.uid})" for address, x in zip(where, listeners, strict=True))


def _patch_module(module: ModuleType) -> None:
    """Hook TF's server starts in ``module`` (one of :data:`SERVER_STARTS`)."""
    names: Sequence[str] = SERVER_STARTS.get(module.__name__, ())
    with _state.lock:
        if not _state.pending:
            return
        if any(owner is module for owner, _, _ in _state.patched):
            return
        if not names or not callable(getattr(module, names[0], None)):
            missing = True
        else:
            missing = False
            for name in names:
                start = getattr(module, name, None)
                if callable(start):
                    _patch(module, name, _server_start(start, name))
    if missing:  # a TF whose server start we cannot see: free the port rather than block its server
        _log.warning(
            "%s has no %s: cannot hand the node's port to TF's server as it binds; releasing it now",
            module.__name__,
            names[0] if names else "server start",
        )
        release_handovers()


def _patch_loaded_modules() -> None:
    for name in SERVER_STARTS:
        module = sys.modules.get(name)
        if module is not None:
            _patch_module(module)
