"""Typed control messages: one dataclass per message, JSON on the wire.

A payload starts with one kind byte: ``J`` a JSON message from this module, ``B`` a columnar
batch (see :mod:`.codec`). Unknown kinds, types or fields are a :class:`ProtocolError`; nothing
on the control plane is ever unpickled. The events nodes send are in :mod:`.events`.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..errors import ProtocolError
from .framing import Connection

__all__ = [
    "Ack",
    "ClusterReady",
    "FeedClaim",
    "FeedClaimed",
    "FeedClose",
    "FeedEnd",
    "FeedRelease",
    "FeedStart",
    "Heartbeat",
    "Message",
    "NodeExit",
    "NodeUp",
    "Register",
    "Reject",
    "ResultsEnd",
    "Stop",
    "StopRequest",
    "Terminate",
    "decode",
    "encode",
    "message_class",
    "recv_message",
    "send_message",
]

JSON_KIND = b"J"
BATCH_KIND = b"B"
_REGISTRY: dict[str, type[Message]] = {}


@dataclass
class Message:
    """Base of all control messages; subclasses register themselves by ``TYPE``."""

    TYPE: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "TYPE" in cls.__dict__ and cls.TYPE:  # a base class without its own TYPE is never sent
            _REGISTRY[cls.TYPE] = cls


@dataclass
class Register(Message):
    """Supervisor -> driver: this executor slot has reserved ``port`` and wants its role."""

    TYPE: ClassVar[str] = "register"
    executor_id: int
    host: str
    port: int
    executor_key: str
    pid: int
    cluster_id: str


@dataclass
class ClusterReady(Message):
    """Driver -> supervisor: every node registered; here is the whole cluster."""

    TYPE: ClassVar[str] = "cluster_ready"
    job_name: str
    task_index: int
    cluster_spec: dict[str, list[str]]


@dataclass
class Reject(Message):
    """Driver -> peer: the request cannot be served; ``reason`` says why."""

    TYPE: ClassVar[str] = "reject"
    reason: str


@dataclass
class NodeUp(Message):
    """Supervisor -> driver: the TF process runs; where its data server listens."""

    TYPE: ClassVar[str] = "node_up"
    executor_id: int
    tf_pid: int
    data_host: str
    data_port: int
    tensorboard_url: str = ""
    data_path: str = ""  # the data server's Unix socket, for feeders on the same executor
    gpus: list[str] = field(default_factory=list)  # the GPU addresses the TF process was given


@dataclass
class NodeExit(Message):
    """Supervisor -> driver: the TF process ended with ``exit_code`` (negative: signal)."""

    TYPE: ClassVar[str] = "node_exit"
    executor_id: int
    exit_code: int
    traceback: str = ""
    output_tail: str = ""
    stopped: bool = False


@dataclass
class Heartbeat(Message):
    """Either way on a supervisor's driver connection, every ``heartbeat_secs``: I am alive.

    A side that hears nothing for ``heartbeat_timeout`` treats its peer as gone.
    """

    TYPE: ClassVar[str] = "heartbeat"


@dataclass
class Stop(Message):
    """Driver -> supervisor: stop the TF process (SIGTERM, then SIGKILL after ``grace_secs``).

    ``final``: no restart follows (``Cluster.stop``, the cluster's end): the node's warm spare goes now.
    """

    TYPE: ClassVar[str] = "stop"
    grace_secs: float = 5.0
    final: bool = False


@dataclass
class StopRequest(Message):
    """Anyone holding the cluster secret -> driver: stop the cluster's streams (TFoS ``request_stop``).

    ``cluster_id`` ("" for any) guards against a stop file of another run; ``reason`` is logged.
    The driver answers ``Ack``, or ``Reject`` naming why.
    """

    TYPE: ClassVar[str] = "stop_request"
    cluster_id: str = ""
    reason: str = ""


@dataclass
class Ack(Message):
    TYPE: ClassVar[str] = "ack"
    count: int = 0


@dataclass
class FeedStart(Message):
    """Feeder -> node: a partition follows, for queue ``qname``, to train on or infer."""

    TYPE: ClassVar[str] = "feed_start"
    qname: str
    train: bool
    partition: int
    columns: list[str] = field(default_factory=list)
    feed_id: str = ""  # one train()/inference() call: with ``partition`` it names a partition
    attempt: int = 0  # Spark's task attempt number (a retry replaces a failed attempt)
    timeout: float = 600.0  # feed_timeout: how long either end waits for the other


@dataclass
class FeedEnd(Message):
    """Feeder -> node: the partition is complete with ``count`` rows."""

    TYPE: ClassVar[str] = "feed_end"
    count: int


@dataclass
class FeedClaim(Message):
    """Node -> driver: may ``node`` commit ``partition`` of the train feed ``feed_id``?

    Sent by a node's feed server once a training partition has fully arrived, before its rows
    are queued for map_fun. The driver remembers which node delivered each partition, so an
    attempt that Spark ran again on another executor, and that reached another node, is
    recognised there too (:mod:`tfonspark.tfprocess.feedclaims`). Answered by ``FeedClaimed``.
    """

    TYPE: ClassVar[str] = "feed_claim"
    node: str
    feed_id: str
    partition: int


@dataclass
class FeedClaimed(Message):
    """Driver -> node: ``first`` if no attempt of the partition was delivered before (it is now
    this node's); else ``owner`` is the node that delivered it and this attempt is dropped.
    ``refusal`` (with ``first`` False): the feed is too old for the driver to know, the
    partition must not be delivered (its text says why)."""

    TYPE: ClassVar[str] = "feed_claimed"
    first: bool
    owner: str = ""
    refusal: str = ""


@dataclass
class FeedClose(Message):
    """Driver -> node: no more data will come for ``qname`` (end of the feed).

    With ``epoch`` >= 0 it only marks the end of that epoch of the train feed ``feed_id``: every
    row of it is already queued on the node, which reports when its reader gets past the mark.
    """

    TYPE: ClassVar[str] = "feed_close"
    qname: str
    epoch: int = -1
    feed_id: str = ""


@dataclass
class FeedRelease(Message):
    """Driver -> node: stop holding the Acks of the train feed ``feed_id``'s partitions (pacing).

    ``final``: every partition of the feed has been handed to a Spark task, so holding a feed
    task's core can no longer leave a partition to another node: Ack every held partition now
    and hold none of this feed again. Otherwise a data node starves while this one holds: Ack
    the partitions held now, so their cores can take the partitions that node waits for.
    """

    TYPE: ClassVar[str] = "feed_release"
    qname: str
    feed_id: str
    final: bool = False


@dataclass
class Pending(Message):
    """Node -> feeder: the partition arrived and is queued; its Ack waits until map_fun has read
    the partitions queued before it. Sent while map_fun reads, so the feeder waits on."""

    TYPE: ClassVar[str] = "pending"


@dataclass
class Terminate(Message):
    """Node -> feeder: the TF process called ``terminate()``; send nothing more."""

    TYPE: ClassVar[str] = "terminate"


@dataclass
class ResultsEnd(Message):
    """Node -> feeder: all ``count`` results for the partition have been sent."""

    TYPE: ClassVar[str] = "results_end"
    count: int


def message_class(type_name: str) -> type[Message] | None:
    """The message class sent as ``type_name``, if there is one."""
    return _REGISTRY.get(type_name)


def encode(message: Message) -> bytes:
    body = {"type": message.TYPE, **dataclasses.asdict(message)}  # the type first: a cut line still says it
    return JSON_KIND + json.dumps(body, separators=(",", ":")).encode()


def decode(payload: memoryview | bytes) -> Message:
    """Parse a ``J`` payload into its message class, validating type and fields."""
    data = bytes(payload)
    if data[:1] != JSON_KIND:
        raise ProtocolError(f"expected a control message, got payload kind {data[:1]!r}")
    try:
        body = json.loads(data[1:])
        cls = _REGISTRY[body.pop("type")]
        message = cls(**body)
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        # AttributeError: JSON that is not an object (``J1``); RecursionError: deeply nested JSON
        raise ProtocolError(f"malformed control message: {exc}") from None
    _check_types(message)
    return message


_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "str": (str,),
    "bool": (bool,),
    "float": (int, float),
    "dict": (dict,),
    "list": (list,),
}


def _check_types(message: Message) -> None:
    """Reject fields whose JSON value has the wrong type (e.g. a list where an int belongs)."""
    for f in dataclasses.fields(message):
        expected = _TYPES.get(str(f.type).split("[", 1)[0])
        value = getattr(message, f.name)
        bad_bool = isinstance(value, bool) and bool not in (expected or ())
        if expected is not None and (not isinstance(value, expected) or bad_bool):
            raise ProtocolError(
                f"malformed control message {message.TYPE}: field {f.name} must be "
                f"{f.type}. Received: {type(value).__name__}"
            )


def send_message(conn: Connection, message: Message) -> None:
    conn.send(encode(message))


def recv_message(conn: Connection, *expected: type[Message]) -> Message:
    """Receive one control message; if ``expected`` is given, anything else is an error."""
    message = decode(conn.recv())
    if expected and not isinstance(message, expected):
        names = ", ".join(e.TYPE for e in expected)
        raise ProtocolError(f"expected {names}, received {message.TYPE}")
    return message
