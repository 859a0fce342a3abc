"""Restarting a failed cluster (``max_restarts``): the budget, the record of each restart, the last error.

The :class:`~tfonspark.driver.cluster.Cluster` does the restarting (tear down, re-reserve, start
``map_fun`` again with ``ctx.attempt`` one higher); this module holds what is said about it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ..errors import ConfigError, NodeFailed

__all__ = ["Restart", "cause_line", "check_max_restarts", "exhausted", "log_restart"]

_log = logging.getLogger(__name__)
_LOGGED_TAIL_LINES = 5


@dataclass
class Restart:
    """One restart of the cluster: why, and where the time went (seconds; ``failed_at`` is time.time()).

    ``detect_s``: from the driver learning of the node failure (``failed_at``) to tearing down
    (other nodes get up to 1 s to report theirs, so the cause names them all); ``teardown_s``: stopping every node and job;
    ``reserve_s``: executors reserved and every node registered again; ``startup_s``: from then
    to every TF process started (``map_fun`` running); ``total_s``: ``failed_at`` to started.
    ``refeed_epoch``: for a restart during ``Cluster.train``, the epoch (from 0) fed again first.
    """

    attempt: int
    cause: NodeFailed
    failed_at: float
    detect_s: float = 0.0
    teardown_s: float = 0.0
    reserve_s: float = 0.0
    startup_s: float = 0.0
    total_s: float = 0.0
    refeed_epoch: int | None = None


def check_max_restarts(value: object) -> int:
    """``max_restarts`` as given, if it is a whole number >= 0."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(
            f"max_restarts must be a whole number >= 0 (0: a node failure ends the job). Received: {value!r}"
        )
    return value


def cause_line(error: NodeFailed) -> str:
    """One line for a failed attempt: how the first node failed and the last line of its traceback."""
    head = str(error).splitlines()[0] if str(error) else "a TensorFlow node failed"
    last = next((line.strip() for line in reversed(error.traceback.splitlines()) if line.strip()), "")
    return f"{head}: {last}" if last and last not in head else head


def log_restart(error: NodeFailed, attempt: int, max_restarts: int) -> None:
    """Say on the driver that the cluster restarts, and why (role, index, traceback tail)."""
    tail = "\n".join(error.traceback.splitlines()[-_LOGGED_TAIL_LINES:])
    _log.warning(
        "restarting the TensorFlow cluster (attempt %d of %d, max_restarts=%d) because node %s:%d failed: %s%s",
        attempt,
        max_restarts + 1,
        max_restarts,
        error.role,
        error.index,
        str(error).splitlines()[0],
        f"\n{tail}" if tail else "",
    )


def exhausted(causes: list[NodeFailed], max_restarts: int) -> NodeFailed:
    """The error of the last failed attempt, naming every attempt's cause (``NodeFailed.attempts``)."""
    last = causes[-1]
    if len(causes) == 1:
        return last
    lines = [f"attempt {i}: {cause_line(c)}" for i, c in enumerate(causes)]
    head = str(last).splitlines()[0]
    message = (
        f"{head}\nevery attempt failed (the cluster was restarted {len(causes) - 1} time(s), "
        f"max_restarts={max_restarts}):\n  " + "\n  ".join(lines)
    )
    return NodeFailed(
        message,
        role=last.role,
        index=last.index,
        exit_code=last.exit_code,
        traceback=last.traceback,
        failures=last.failures,
        attempts=lines,
    )
