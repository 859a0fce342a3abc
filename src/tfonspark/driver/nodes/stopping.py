"""Asking a running cluster to stop its streams, from anywhere: TFoS's ``request_stop``, authenticated.

The driver writes a *stop file* (:func:`write_stop_file`: JSON with the rendezvous address,
the cluster id and the cluster secret, mode ``0600``); whoever can read it can stop the
cluster's streams with :func:`request_stop` or ``python -m tfonspark.stop FILE``. The request
goes over the same mutual-HMAC handshake as every control connection: a peer without the
secret is dropped before anything it sends is parsed.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import AuthenticationError, ClusterError, ConfigError, ProtocolError
from ...wire import messages as m
from ...wire.framing import connect

__all__ = ["StopFile", "read_stop_file", "request_stop", "write_stop_file"]

_FORMAT = "tfonspark-stop-file/1"


@dataclass(frozen=True)
class StopFile:
    """What a stop file holds: where the driver listens, which cluster, and its secret."""

    host: str
    port: int
    cluster_id: str
    secret: bytes

    def __repr__(self) -> str:  # never show the secret
        return f"StopFile(host={self.host!r}, port={self.port}, cluster_id={self.cluster_id!r})"


def write_stop_file(path: str | os.PathLike[str] | None, stop: StopFile) -> str:
    """Write ``stop`` to ``path`` (a new private temporary file if None), mode 0600; return the path.

    The file is written under a temporary name and renamed, so a reader never sees half of it.
    """
    if path is None:
        fd, name = tempfile.mkstemp(prefix=f"tfonspark-stop-{stop.cluster_id[:12]}-", suffix=".json")
        os.close(fd)
        path = name
    target = Path(path)
    body = {
        "format": _FORMAT,
        "address": [stop.host, stop.port],
        "cluster_id": stop.cluster_id,
        "secret": stop.secret.hex(),
    }
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(body, f)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return str(target)


def read_stop_file(path: str | os.PathLike[str]) -> StopFile:
    """Parse a stop file; ConfigError naming the file and what is wrong with it."""
    try:
        body = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"stop file {str(path)!r} does not exist (has the cluster shut down already?)") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read stop file {str(path)!r}: {exc}") from None
    try:
        if body["format"] != _FORMAT:
            raise ValueError(f"format {body['format']!r}, expected {_FORMAT!r}")
        host, port = body["address"]
        return StopFile(str(host), int(port), str(body["cluster_id"]), bytes.fromhex(body["secret"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(
            f"{str(path)!r} is not a tfonspark stop file ({exc}); it must be the file Cluster.write_stop_file wrote"
        ) from None


def _target(target: Any, secret: bytes | str | None) -> StopFile:
    """A stop file path, or ``"host:port"`` / ``(host, port)`` with the secret (bytes or hex)."""
    if secret is None:
        if not isinstance(target, (str, os.PathLike)):
            raise ConfigError(
                "request_stop() takes a stop file path, or an address with secret=... "
                f"Received: {type(target).__name__} without a secret"
            )
        return read_stop_file(target)
    try:
        key = bytes.fromhex(secret) if isinstance(secret, str) else bytes(secret)
    except ValueError:
        raise ConfigError("the secret must be bytes or a hex string. Received: a string that is not hex") from None
    if isinstance(target, str) and target.rpartition(":")[2].isdigit():
        host, _, port = target.rpartition(":")
        return StopFile(host.strip("[]"), int(port), "", key)
    if isinstance(target, (tuple, list)) and len(target) == 2:
        return StopFile(str(target[0]), int(target[1]), "", key)
    raise ConfigError(f"the driver address must be 'host:port' or (host, port). Received: {target!r}")


def request_stop(
    target: str | os.PathLike[str] | tuple[str, int],
    secret: bytes | str | None = None,
    *,
    reason: str = "",
    timeout: float = 10.0,
) -> None:
    """Ask a running cluster to stop its streams, as TFoS's ``reservation.Client(addr).request_stop()``.

    ``target`` is the stop file the driver wrote (``Cluster.write_stop_file``), or the driver's
    rendezvous address (``"host:port"``) with ``secret`` (bytes or hex). ``cluster.shutdown(ssc
    or query)`` then stops the streams gracefully, ends the feed and waits for the nodes.

    Raises AuthenticationError if the driver refused the secret, ClusterError if no driver
    answers there (the cluster has shut down?) or it rejected the request.

    Parameters
    ----------
    target : str, os.PathLike or (str, int)
        The stop file's path; or, with ``secret``, the driver's address as ``"host:port"`` or
        ``(host, port)``.
    secret : bytes or str, optional
        The cluster secret (bytes or hex), needed with an address only: a stop file holds it.
    reason : str, optional
        Why, for the driver's log and ``Cluster.stop_condition`` (default: ``request_stop()
        from pid <pid>``).
    timeout : float, default 10.0
        Seconds to wait for the driver to answer.

    Examples
    --------
    On the driver, ``path = cluster.write_stop_file()``; then, from any process that can read
    the file (a scheduler, another notebook):

    >>> import tfonspark
    >>> tfonspark.request_stop(path, reason="nightly window closed")  # doctest: +SKIP
    """
    stop = _target(target, secret)
    where = f"{stop.host}:{stop.port}"
    try:
        conn = connect((stop.host, stop.port), stop.secret, timeout=timeout)
    except (AuthenticationError, ConnectionResetError, BrokenPipeError, EOFError) as exc:
        raise AuthenticationError(
            f"the driver at {where} refused the stop request: the secret does not match its cluster's "
            f"({type(exc).__name__}). Use the stop file the driver of the running cluster wrote."
        ) from None
    except ProtocolError as exc:
        raise ClusterError(f"{where} is not a tfonspark driver of this version: {exc}") from None
    except OSError as exc:
        raise ClusterError(
            f"no tfonspark driver answered at {where} within {timeout:g}s ({exc}); has the cluster shut down?"
        ) from None
    with conn:
        try:
            conn.settimeout(timeout)
            m.send_message(conn, m.StopRequest(stop.cluster_id, reason or f"request_stop() from pid {os.getpid()}"))
            reply = m.recv_message(conn, m.Ack, m.Reject)
        except (OSError, ProtocolError) as exc:
            raise ClusterError(f"the stop request to {where} got no answer: {exc}") from None
    if isinstance(reply, m.Reject):
        raise ClusterError(f"the driver at {where} rejected the stop request: {reply.reason}")
