"""Typed events: one class per thing the TF process, its supervisor and the driver tell each other.

Three streams carry them, each a :class:`~tfonspark.wire.messages.Message` (JSON, fields
type-checked on decode, never pickled):

* **TF process -> supervisor** (its status pipe, one line each, :func:`to_line`): :class:`FeedSocket`
  as soon as the feed socket exists, :class:`ProcessUp` once ``map_fun`` is about to run,
  :class:`ProcessError` with the traceback if it raised, and every :class:`NodeEvent`;
* **node -> driver** (the supervisor relays each :class:`NodeEvent` on its authenticated
  connection): :class:`Reported` (``ctx.report``), :class:`FeedStalled`, :class:`FeedTerminated`,
  :class:`FeedRefused`, :class:`EpochRead`, the feed's waits (:class:`FeedHeld`,
  :class:`FeedStarved`, :class:`FeedWaiting`); and the supervisor's own :class:`ServerRestarted`;
* **supervisor -> Spark node task** (its stdout, after ``STATUS_PREFIX``): :class:`TaskUp`,
  :class:`TaskExit`, :class:`TaskFailed`, :class:`TaskRejected`.

Receivers dispatch on the class (``match``), never on a name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..errors import ProtocolError
from . import messages as m

__all__ = [
    "MAX_FEED_ID",
    "EpochRead",
    "FeedHeld",
    "FeedRefused",
    "FeedSocket",
    "FeedStalled",
    "FeedStarved",
    "FeedTerminated",
    "FeedWaiting",
    "NodeEvent",
    "ProcessError",
    "ProcessUp",
    "Reported",
    "ServerRestarted",
    "TaskExit",
    "TaskFailed",
    "TaskRejected",
    "TaskStatus",
    "TaskUp",
    "from_line",
    "is_node_event",
    "to_line",
]

MAX_FEED_ID = 256
"""The longest ``feed_id`` an event may name (tfonspark's own are at most ~60 characters)."""


def _feed_id_refusal(feed_id: str) -> str:
    if len(feed_id) > MAX_FEED_ID:
        return f"its feed_id is a str of {len(feed_id)} characters, and must be at most {MAX_FEED_ID} (MAX_FEED_ID)"
    return ""


# ---- TF process -> supervisor ----------------------------------------------------------------
@dataclass
class FeedSocket(m.Message):
    """The feed server's Unix socket exists: the supervisor removes it however the TF process dies."""

    TYPE: ClassVar[str] = "feed_socket"
    data_path: str


@dataclass
class ProcessUp(m.Message):
    """The node is ready (``map_fun`` starts): where its feed server listens, its TensorBoard."""

    TYPE: ClassVar[str] = "process_up"
    host: str
    data_port: int
    data_path: str = ""
    tensorboard_url: str = ""


@dataclass
class ProcessError(m.Message):
    """``map_fun`` (or the start of the TF process) raised: the traceback, with a hint if one fits."""

    TYPE: ClassVar[str] = "process_error"
    traceback: str


# ---- node -> driver (relayed by the supervisor) ------------------------------------------------
@dataclass
class NodeEvent(m.Message):
    """Base of what a node tells the driver while it runs; the driver refuses one with a reason."""

    def refusal(self) -> str:
        """Why the driver must refuse this event (``""``: it need not), beyond its field types."""
        return ""


@dataclass
class Reported(NodeEvent):
    """``ctx.report(metrics)``: JSON metrics for ``on_report`` and ``cluster.reports``."""

    TYPE: ClassVar[str] = "reported"
    metrics: dict[str, Any] = field(default_factory=dict)


@dataclass
class FeedStalled(NodeEvent):
    """A feeder sent nothing for ``timeout`` seconds: its partition's ``received`` rows were dropped."""

    TYPE: ClassVar[str] = "feed_stalled"
    feed_id: str
    partition: int
    received: int = 0
    timeout: float = 0.0
    train: bool = True

    def refusal(self) -> str:
        return _feed_id_refusal(self.feed_id)


@dataclass
class FeedTerminated(NodeEvent):
    """The node's ``DataFeed.terminate()``: it takes no more data."""

    TYPE: ClassVar[str] = "feed_terminated"


@dataclass
class FeedRefused(NodeEvent):
    """The feed server refused a partition (e.g. delivered already): ``reason`` says why."""

    TYPE: ClassVar[str] = "feed_refused"
    feed_id: str
    partition: int
    reason: str = ""

    def refusal(self) -> str:
        return _feed_id_refusal(self.feed_id)


@dataclass
class FeedHeld(NodeEvent):
    """The node holds the Ack of ``partition`` of the train feed ``feed_id`` until map_fun has read
    what was queued before it (the feed's pacing): the driver releases it once holding can only stall."""

    TYPE: ClassVar[str] = "feed_held"
    feed_id: str
    partition: int

    def refusal(self) -> str:
        return _feed_id_refusal(self.feed_id)


@dataclass
class FeedStarved(NodeEvent):
    """map_fun has waited ``waited`` seconds for training data of ``qname``, with nothing queued
    and no partition arriving: the driver releases the Acks other nodes hold (``FeedRelease``)."""

    TYPE: ClassVar[str] = "feed_starved"
    qname: str
    waited: float


@dataclass
class FeedWaiting(NodeEvent):
    """A wait of the feed on this node has lasted ``waited`` seconds: the driver logs a warning.

    ``what`` it waits for, ``setting`` what bounds the wait (and so what to change), and the
    partition of ``feed_id`` it is about (``partition`` -1: none, e.g. map_fun waiting for data).
    """

    TYPE: ClassVar[str] = "feed_waiting"
    what: str
    waited: float
    setting: str = ""
    feed_id: str = ""
    partition: int = -1

    def refusal(self) -> str:
        return _feed_id_refusal(self.feed_id)


@dataclass
class EpochRead(NodeEvent):
    """The node's reader got past the end mark of ``epoch`` of the train feed ``feed_id``."""

    TYPE: ClassVar[str] = "epoch_read"
    feed_id: str
    epoch: int

    def refusal(self) -> str:
        if not 0 <= self.epoch < 2**31:
            return f"its epoch is {self.epoch}, and must be an int from 0 to 2**31 - 1"
        return _feed_id_refusal(self.feed_id)


@dataclass
class ServerRestarted(NodeEvent):
    """The supervisor restarted a worker's TF server in place (same address) after it died.

    ``restart`` of at most ``limit``; ``exit_code`` is how the server died (``-9``: SIGKILL);
    ``down_s`` the seconds from its death to the new server accepting connections, or to giving
    up on that (``accepting`` False).
    """

    TYPE: ClassVar[str] = "server_restarted"
    restart: int
    limit: int
    exit_code: int
    down_s: float
    accepting: bool = True


# ---- supervisor -> Spark node task -------------------------------------------------------------
@dataclass
class TaskStatus(m.Message):
    """Base of the supervisor's status lines to the task that spawned it."""


@dataclass
class TaskUp(TaskStatus):
    """The TF process runs (pid ``tf_pid``)."""

    TYPE: ClassVar[str] = "task_up"
    tf_pid: int


@dataclass
class TaskExit(TaskStatus):
    """The TF process ended (``stopped``: by the driver); its failure is the driver's to report."""

    TYPE: ClassVar[str] = "task_exit"
    exit_code: int
    stopped: bool = False
    traceback: str = ""


@dataclass
class TaskFailed(TaskStatus):
    """The supervisor could not start the node: ``reason`` says why."""

    TYPE: ClassVar[str] = "task_failed"
    reason: str


@dataclass
class TaskRejected(TaskStatus):
    """The driver refused the node's registration: ``reason`` says why."""

    TYPE: ClassVar[str] = "task_rejected"
    reason: str


# ---- lines -----------------------------------------------------------------------------------
def to_line(message: m.Message) -> str:
    """``message`` as one line of text (JSON escapes every newline and non-ASCII character)."""
    return m.encode(message).decode("ascii") + "\n"


def from_line(line: str, *expected: type[m.Message]) -> m.Message:
    """The message of one :func:`to_line` line; ProtocolError if malformed or not ``expected``."""
    try:
        payload = line.strip().encode("ascii")
    except UnicodeEncodeError:
        raise ProtocolError("a status line must be ASCII JSON") from None
    message = m.decode(payload)
    if expected and not isinstance(message, expected):
        raise ProtocolError(f"expected {', '.join(e.TYPE for e in expected)}, received {message.TYPE}")
    return message


def is_node_event(payload: bytes | memoryview) -> str:
    """The type name if ``payload`` claims to be a :class:`NodeEvent` (for refusing a malformed one)."""
    try:
        name = json.loads(bytes(payload)[1:]).get("type")
    except (ValueError, AttributeError, RecursionError):
        return ""
    cls = m.message_class(name) if isinstance(name, str) else None
    return name if cls is not None and issubclass(cls, NodeEvent) else ""
