"""Driver side of ``InputMode.SPARK``: run feed jobs, close feeds, turn task errors into ours."""

from __future__ import annotations

import functools
import re
import uuid
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import errors
from ..errors import ConfigError, FeedError, FeedTimeout
from ..executor.feeder import Feeder, FeedTarget
from ..wire import messages as m
from ..wire.framing import connect
from .jobs import run_in_group
from .plan import DATA_ROLES

if TYPE_CHECKING:
    from .cluster import Cluster

__all__ = ["close_feeds", "inference", "train"]

_TYPED = re.compile(r"tfonspark\.errors\.(\w+): (.*?)(?:\n\s*\n|\n\tat |\nCaused by|\Z)", re.S)


def _targets(cluster: Cluster) -> list[FeedTarget]:
    out = []
    for node in cluster.server.nodes.values():
        if node.role.job_name in DATA_ROLES and node.up is not None and node.up.data_port and not node.finished:
            out.append(
                FeedTarget(node.role.name, node.executor_key, node.up.data_host, node.up.data_port, node.up.data_path)
            )
    return out


def _feeder(cluster: Cluster, qname: str, feed_timeout: float) -> Feeder:
    if not feed_timeout or feed_timeout <= 0:
        raise ConfigError(f"feed_timeout must be > 0 seconds. Received: {feed_timeout!r}")
    return Feeder(_targets(cluster), cluster.config.secret_hex, qname, feed_timeout)


def _is_dataframe(data: Any) -> bool:
    return hasattr(data, "mapInArrow") and hasattr(data, "schema")


def _raise_typed(cluster: Cluster, exc: BaseException) -> None:
    """Re-raise a failed feed job as NodeFailed, a stalled feed, or the error the task raised."""
    cluster.check()
    if cluster.feed_errors:
        raise cluster.feed_errors.pop(0) from exc
    match = _TYPED.search(str(exc))
    if match:
        cls = getattr(errors, match.group(1), None)
        if isinstance(cls, type) and issubclass(cls, errors.TFoSError):
            raise errors.from_message(cls, match.group(2).strip()) from exc
    raise FeedError(f"the feed job failed: {str(exc).strip().splitlines()[0] if str(exc) else exc!r}") from exc


def _run_feed_job(cluster: Cluster, description: str, action: Any) -> Any:
    group = f"tfonspark-feed-{uuid.uuid4().hex[:12]}"
    cluster.feed_groups.add(group)
    try:
        return run_in_group(cluster.sc, group, description, action)
    except Exception as exc:
        _raise_typed(cluster, exc)
    finally:
        cluster.feed_groups.discard(group)


def train(cluster: Cluster, data: Any, num_epochs: int, feed_timeout: float, qname: str) -> int:
    """Feed every row of ``data`` ``num_epochs`` times; return how many rows the nodes received.

    If every data node stops taking data (``terminate()``, or ``map_fun`` returned) the rest of
    the feed is skipped, as in TFoS, and the rows delivered so far are returned.
    """
    if not isinstance(num_epochs, int) or num_epochs < 1:
        raise ConfigError(f"num_epochs must be a positive integer. Received: {num_epochs!r}")
    feeder = _feeder(cluster, qname, feed_timeout)
    cluster.feed_errors.clear()  # stalls reported for an earlier feed are not this one's
    delivered = cluster.sc.accumulator(0)

    def count(n: int) -> int:
        delivered.add(n)
        return n

    if _is_dataframe(data):
        epochs = functools.reduce(lambda a, b: a.unionAll(b), [data] * num_epochs)
        counted = epochs.mapInArrow(feeder.train_arrow, "rows long")
        action = lambda: sum(r[0] for r in counted.collect())  # noqa: E731
    elif hasattr(data, "mapPartitionsWithIndex"):
        rdd = data.context.union([data] * num_epochs) if num_epochs > 1 else data
        action = lambda: sum(rdd.mapPartitionsWithIndex(feeder.train_rdd).map(count).collect())  # noqa: E731
    else:
        raise ConfigError(f"train() takes a Spark RDD or DataFrame. Received: {type(data).__name__}")
    cluster.feeding = feeder.feed_id
    try:
        result = _run_feed_job(cluster, f"tfonspark train {cluster.cluster_id[:8]}", action)
    except FeedError:
        if not _all_data_nodes_done(cluster):
            raise
        return int(delivered.value)
    finally:
        cluster.feeding = ""
    cluster.check()
    return int(result)


def _all_data_nodes_done(cluster: Cluster) -> bool:
    """True once no data node takes data any more (each terminated its feed or exited cleanly)."""
    cluster.check()
    nodes = [n for n in cluster.server.nodes.values() if n.role.job_name in DATA_ROLES]
    return all(n.finished for n in nodes)


def inference(cluster: Cluster, data: Any, feed_timeout: float, qname: str, output_schema: Any) -> Any:
    """One result per input row: an RDD for an RDD, a DataFrame for a DataFrame (lazy)."""
    feeder = _feeder(cluster, qname, feed_timeout)
    if not _is_dataframe(data):
        if not hasattr(data, "mapPartitionsWithIndex"):
            raise ConfigError(f"inference() takes a Spark RDD or DataFrame. Received: {type(data).__name__}")
        return data.mapPartitionsWithIndex(feeder.infer_rdd)
    schema = _output_schema(cluster, data, feeder, output_schema)
    return data.mapInArrow(feeder.infer_arrow(schema.json()), schema)


def _output_schema(cluster: Cluster, df: Any, feeder: Feeder, output_schema: Any) -> Any:
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
    probe = df.limit(1).rdd.map(tuple).mapPartitionsWithIndex(feeder.infer_rdd)
    rows = _run_feed_job(cluster, "tfonspark inference schema probe", probe.collect)
    if not rows:
        raise FeedError("cannot infer the inference output schema from an empty DataFrame; pass output_schema=...")
    return _schema_of(rows[0])


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


def close_feeds(cluster: Cluster, qnames: tuple[str, ...] = ("input",)) -> None:
    """Tell every data node that no more data will come (their ``should_stop()`` turns True)."""
    for node in cluster.server.nodes.values():
        up = node.up
        if node.role.job_name not in DATA_ROLES or up is None or not up.data_port or node.finished:
            continue
        for qname in qnames:
            try:
                with connect((up.data_host, up.data_port), cluster.config.secret, timeout=10) as conn:
                    m.send_message(conn, m.FeedClose(qname))
                    conn.settimeout(30)
                    m.recv_message(conn, m.Ack)
            except TimeoutError as exc:  # before OSError: TimeoutError is an OSError
                raise FeedTimeout(f"node {node.role.name} did not accept the end of feed within 30s: {exc}") from exc
            except OSError:
                pass  # the node already exited; shutdown() reports how it ended
