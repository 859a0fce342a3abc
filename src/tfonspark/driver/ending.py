"""How a cluster ends: :func:`finish` (``Cluster.shutdown``: wait for the work, then stop) and
:func:`stop_now` (``Cluster.stop``: stop every node at once, for clusters whose nodes only serve)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..errors import FeedError, NodeFailed, ShutdownTimeout
from ..wire.errors import reraise, summary
from .feeds.streaming import Streams
from .nodes.restarts import Attempts
from .nodes.sidecars import finish_evaluators

__all__ = ["finish", "stop_now"]


def finish(
    attempts: Attempts, streams: Streams, close_feed: Callable[[], None], ssc: Any, grace_secs: float, timeout: float
) -> None:
    """``Cluster.shutdown``: the streams, then the feed's end, then every chief/worker, then the rest.

    ``close_feed()`` ends the feed (SPARK mode) before the wait for the workers, on every attempt.
    """
    deadline = time.monotonic() + (timeout if timeout and timeout > 0 else 1e9)
    if attempts.gang.closed:
        streams.join(30)
        if ssc is not None and attempts.failure is not None:
            raise attempts.failure  # the stream's node failure, torn down while feeding a micro-batch
        return
    in_time, stream_error = streams.finish(ssc, max(deadline - time.monotonic(), 0))
    if not attempts.can_restart():
        attempts.gang.check()  # else the wait for the workers checks, and restarts
    if not in_time:
        attempts.gang.teardown(grace_secs=0, final=True)
        streams.join(30)
        raise ShutdownTimeout(
            f"the stream was still running after timeout={timeout}s; it and the TensorFlow nodes have "
            "been stopped. Request a stop (cluster.request_stop(), python -m tfonspark.stop) or raise "
            "shutdown(timeout=...)."
        )

    def workers_done() -> bool:
        close_feed()  # a restarted cluster's data was fed: end it again
        return attempts.gang.wait_for_trainers(deadline - time.monotonic())

    if not attempts.run(workers_done):
        attempts.gang.teardown(grace_secs=0, final=True)
        raise ShutdownTimeout(
            f"TensorFlow workers were still running after timeout={timeout}s; they have been stopped. "
            "Raise shutdown(timeout=...) if training needs longer."
        )
    _stop_the_rest(attempts, streams, grace_secs)
    if stream_error is not None:
        reraise(stream_error)
        raise FeedError(f"the stream ended with an error: {summary(stream_error)}") from stream_error


def _stop_the_rest(attempts: Attempts, streams: Streams, grace_secs: float) -> None:
    """After every chief/worker exited: ps/evaluator nodes get ``grace_secs`` between SIGTERM and
    SIGKILL (TFoS slept it unconditionally); a failure names every attempt (nothing to restart for)."""
    try:
        attempts.gang.check()
    except NodeFailed as error:
        raise attempts.give_up(error) from None
    finish_evaluators(attempts.gang, grace_secs)  # first, with its own grace: its last evaluation
    attempts.gang.teardown(grace_secs=max(grace_secs, 2.0), final=True)
    streams.join(30)


def stop_now(attempts: Attempts, streams: Streams, grace_secs: float) -> None:
    """``Cluster.stop``: tear every node down now (no restart); a node that had failed is raised after."""
    gang = attempts.gang
    try:
        gang.check()  # a failure: torn down at once, and raised
        finish_evaluators(gang, grace_secs)  # a sidecar evaluator's last evaluation, with its grace
    finally:
        gang.teardown(grace_secs=grace_secs, final=True)
        streams.join(30)
