"""Driver side of ``InputMode.SPARK``: the feed jobs of one cluster, their stalls and their errors.

:class:`Feeds` is owned by the :class:`~tfonspark.driver.cluster.Cluster` and talks back to it
only through the narrow :class:`FeedNodes` view (which nodes take data, has one failed, are they
all done); it never reaches into the rendezvous state. A typed error raised in a feed task comes
back through :mod:`tfonspark.wire.errors` with all its attributes.
"""

from __future__ import annotations

import functools
import logging
import uuid
from typing import Any, Protocol

import numpy as np

from ...errors import ConfigError, FeedError, FeedTimeout
from ...executor.feeder import Feeder, FeedTarget, rdd_feed
from ...settings import check_timeout
from ...wire import messages as m
from ...wire.errors import captured, raise_or
from ...wire.framing import connect
from ..jobs import run_in_group
from .feed_watch import FeedWatch

__all__ = ["FeedNodes", "Feeds", "check_num_epochs"]

log = logging.getLogger(__name__)


class FeedNodes(Protocol):
    """What the feed jobs need to know about the cluster's nodes."""

    def targets(self) -> list[FeedTarget]:
        """The data nodes that take data now."""
        ...

    def check(self) -> None:
        """Raise NodeFailed if a node has failed."""
        ...

    def all_done(self) -> bool:
        """True once no data node takes data any more (each terminated or exited cleanly)."""
        ...


def check_num_epochs(num_epochs: object) -> None:
    """``num_epochs`` must be a whole number >= 1 (not a bool)."""
    if isinstance(num_epochs, bool) or not isinstance(num_epochs, int) or num_epochs < 1:
        raise ConfigError(f"num_epochs must be a positive integer. Received: {num_epochs!r}")


def _is_dataframe(data: Any) -> bool:
    return hasattr(data, "mapInArrow") and hasattr(data, "schema")


class Feeds:
    """Run ``train``/``inference`` feed jobs in cancellable job groups; remember reported stalls."""

    def __init__(self, sc: Any, secret_hex: str, nodes: FeedNodes) -> None:
        self.sc = sc
        self.secret_hex = secret_hex
        self.nodes = nodes
        self.groups: set[str] = set()
        self.errors: list[FeedTimeout] = []  # stalls the nodes reported for the running train()
        self.running = ""  # feed_id of the running train(), if any
        self.watch: FeedWatch | None = None  # releases held Acks of the running train() (pacing)

    # ---- called by the cluster's watcher ---------------------------------------------------------
    def stalled(self, feed_id: str, train: bool, error: FeedTimeout) -> bool:
        """A node reported a stalled partition: cancel the running train() if it is that feed."""
        if not train or feed_id not in ("", self.running):
            return False  # inference jobs are the user's; a late report is about an earlier feed
        self.errors.append(error)
        self.cancel()
        return True

    def held(self, feed_id: str) -> None:
        """A node holds a partition's Ack of ``feed_id`` (pacing): watch whether it may stall."""
        watch = self.watch
        if watch is not None:
            watch.held(feed_id)

    def starved(self) -> None:
        """A data node waits for training data with nothing queued or arriving."""
        watch = self.watch
        if watch is not None:
            watch.starved()

    def cancel(self) -> None:
        """Cancel every running feed job."""
        for group in list(self.groups):
            self.sc.cancelJobGroup(group)

    # ---- feeding ---------------------------------------------------------------------------------
    def _feeder(self, qname: str, feed_timeout: float, feed_id: str = "") -> Feeder:
        seconds = check_timeout("feed_timeout", feed_timeout)
        return Feeder(self.nodes.targets(), self.secret_hex, qname, seconds, feed_id)

    def _run(self, description: str, action: Any, paced: tuple[str, str] | None = None) -> Any:
        """Run the feed job ``action`` in a job group of its own; ``paced`` = ``(qname, feed_id)``
        of a training feed, whose held Acks a :class:`FeedWatch` releases when they can only stall."""
        group = f"tfonspark-feed-{uuid.uuid4().hex[:12]}"
        self.groups.add(group)
        if paced is not None:
            self.watch = FeedWatch(self.sc, group, *paced, tell=self._release).start()
        try:
            return run_in_group(self.sc, group, description, action)
        except Exception as exc:
            self.nodes.check()
            if self.errors:
                raise self.errors.pop(0) from exc
            raise_or(exc, lambda line: FeedError(f"the feed job failed: {line}"))
        finally:
            self.groups.discard(group)
            watch, self.watch = self.watch, None
            if watch is not None:
                watch.stop()

    def train(
        self, data: Any, num_epochs: int, feed_timeout: float, qname: str, label: str = "", feed_id: str = ""
    ) -> int:
        """Feed every row of ``data`` ``num_epochs`` times; return how many rows the nodes received.

        If every data node stops taking data (``terminate()``, or ``map_fun`` returned) the rest
        of the feed is skipped, as in TFoS, and the rows delivered so far are returned.
        ``feed_id`` names the feed (a stream's micro-batch); a fresh one if empty.
        """
        check_num_epochs(num_epochs)
        if getattr(data, "isStreaming", False) is True:
            raise ConfigError("a streaming DataFrame is fed by Cluster.train(), which starts its query")
        feeder = self._feeder(qname, feed_timeout, feed_id)
        self.errors.clear()  # stalls reported for an earlier feed are not this one's
        delivered = self.sc.accumulator(0)

        def count(n: int) -> int:
            delivered.add(n)
            return n

        if _is_dataframe(data):
            epochs = functools.reduce(lambda a, b: a.unionAll(b), [data] * num_epochs)
            counted = epochs.mapInArrow(captured(feeder.train_arrow), "rows long")
            action = lambda: sum(r[0] for r in counted.collect())  # noqa: E731
        elif hasattr(data, "mapPartitionsWithIndex"):
            rdd = data.context.union([data] * num_epochs) if num_epochs > 1 else data
            fed = rdd_feed(
                rdd, captured(feeder.train_rdd), captured(feeder.train_pickled)
            )  # stored rows: their pickles
            action = lambda: sum(fed.map(count).collect())  # noqa: E731
        else:
            raise ConfigError(
                "train() takes an RDD, a DataFrame, a streaming DataFrame or a DStream. "
                f"Received: {type(data).__module__}.{type(data).__name__}"
            )
        self.running = feeder.feed_id
        try:
            result = self._run(f"tfonspark train {label}", action, paced=(qname, feeder.feed_id))
        except FeedError:
            self.nodes.check()
            if not self.nodes.all_done():
                raise
            return int(delivered.value)
        finally:
            self.running = ""
        self.nodes.check()
        return int(result)

    def inference(self, data: Any, feed_timeout: float, qname: str, output_schema: Any) -> Any:
        """One result per input row: an RDD for an RDD, a DataFrame for a DataFrame (lazy)."""
        feeder = self._feeder(qname, feed_timeout)
        if not _is_dataframe(data):
            if not hasattr(data, "mapPartitionsWithIndex"):
                raise ConfigError(
                    "inference() takes an RDD, a DataFrame, a streaming DataFrame or a DStream. "
                    f"Received: {type(data).__module__}.{type(data).__name__}"
                )
            return rdd_feed(data, captured(feeder.infer_rdd), captured(feeder.infer_pickled))
        schema = self._output_schema(data, feeder, output_schema)
        return data.mapInArrow(captured(feeder.infer_arrow(schema.json())), schema)

    def _output_schema(self, df: Any, feeder: Feeder, output_schema: Any) -> Any:
        """The result schema: as given, or inferred from the results of a one-row probe."""
        from pyspark.sql.types import StructType, _parse_datatype_string

        if isinstance(output_schema, StructType):
            return output_schema
        if isinstance(output_schema, str):
            parsed = _parse_datatype_string(output_schema)
            return parsed if isinstance(parsed, StructType) else StructType().add("prediction", parsed)
        if output_schema is not None:
            raise ConfigError(
                f"output_schema must be a StructType, a DDL string or None. Received: {type(output_schema).__name__}"
            )
        if getattr(df, "isStreaming", False) is True:
            raise ConfigError(
                "inference() of a streaming DataFrame needs output_schema (a StructType or a DDL string such "
                "as 'prediction double'): a stream has no rows to probe the results' schema from"
            )
        probe = df.limit(1).rdd.map(tuple).mapPartitionsWithIndex(captured(feeder.infer_rdd))
        rows = self._run("tfonspark inference schema probe", probe.collect)
        if not rows:
            raise FeedError("cannot infer the inference output schema from an empty DataFrame; pass output_schema=...")
        return _schema_of(rows[0])

    def close(self, qnames: tuple[str, ...] = ("input",)) -> None:
        """Tell every data node that no more data will come (their ``should_stop()`` turns True)."""
        for qname in qnames:
            self._tell_nodes(m.FeedClose(qname), "the end of feed")

    def mark_epoch(self, feed_id: str, epoch: int, qname: str) -> None:
        """After an epoch's feed job: queue its end mark on every data node (see ``Cluster.train``)."""
        self._tell_nodes(m.FeedClose(qname, epoch=epoch, feed_id=feed_id), f"the end of epoch {epoch}")

    def _release(self, message: m.FeedRelease) -> None:
        """Tell every data node to release the Acks it holds (best effort: a node that cannot be
        reached holds at most until its quiet limit)."""
        try:
            self._tell_nodes(message, "a release of held partitions")
        except FeedTimeout as exc:
            log.warning("feed: %s", exc)

    def _tell_nodes(self, message: m.FeedClose | m.FeedRelease, what: str) -> None:
        secret = bytes.fromhex(self.secret_hex)
        for target in self.nodes.targets():
            try:
                with connect((target.host, target.port), secret, timeout=10) as conn:
                    m.send_message(conn, message)
                    conn.settimeout(30)
                    m.recv_message(conn, m.Ack)
            except TimeoutError as exc:  # before OSError: TimeoutError is an OSError
                raise FeedTimeout(f"node {target.name} did not accept {what} within 30s: {exc}") from exc
            except OSError:
                pass  # the node already exited; shutdown() reports how it ended


def _spark_type(value: Any) -> Any:
    from pyspark.sql import types as T

    if isinstance(value, np.ndarray):
        if value.ndim == 0:
            return _spark_type(value.item())
        inner = _spark_type(value.reshape(-1)[0]) if value.size else T.DoubleType()
        for _ in range(value.ndim):
            inner = T.ArrayType(inner, False)
        return inner
    if isinstance(value, (bool, np.bool_)):
        return T.BooleanType()
    if isinstance(value, (np.floating,)):
        return T.FloatType() if value.dtype == np.float32 else T.DoubleType()
    if isinstance(value, (int, np.integer)):
        return T.LongType()
    if isinstance(value, float):
        return T.DoubleType()
    if isinstance(value, str):
        return T.StringType()
    if isinstance(value, (bytes, bytearray)):
        return T.BinaryType()
    if isinstance(value, (list, tuple)) and value:
        return T.ArrayType(_spark_type(value[0]), False)
    raise ConfigError(
        f"cannot map an inference result of type {type(value).__name__} to a Spark type; pass output_schema=..."
    )


def _schema_of(row: Any) -> Any:
    from pyspark.sql.types import StructType

    if isinstance(row, dict):
        fields = list(row.items())
    elif isinstance(row, tuple):
        fields = [(f"_{i + 1}", v) for i, v in enumerate(row)]
    else:
        fields = [("prediction", row)]
    schema = StructType()
    for name, value in fields:
        schema.add(name, _spark_type(value), False)
    return schema
