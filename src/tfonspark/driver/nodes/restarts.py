"""Restarting a failed cluster (``max_restarts``): the attempt loop, each restart's record, the last error.

:class:`Attempts` holds the running :class:`~tfonspark.driver.nodes.gang.Gang`; after a node failure it
forms the next one (a fresh rendezvous server and secret, executors reserved again, ``map_fun``
started again with ``ctx.attempt`` one higher) while ``max_restarts`` lasts.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from ...errors import ConfigError, NodeFailed
from .gang import Gang

__all__ = ["Attempts", "Restart", "cause_line", "check_max_restarts", "exhausted", "log_restart"]

_T = TypeVar("_T")

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


class Attempts:
    """The running gang, and the restarts after node failures (``max_restarts``).

    ``reform(attempt)`` forms the gang of the next attempt (not started); ``reserve()`` waits for
    the executors a barrier node job needs; ``restartable()`` says whether a failure now may be
    restarted (not while a stream runs).
    """

    def __init__(
        self,
        first: Gang,
        max_restarts: int,
        reform: Callable[[int], Gang] | None,
        reserve: Callable[[], None] | None,
        restartable: Callable[[], bool],
    ) -> None:
        self.gang = first
        self.max_restarts = check_max_restarts(max_restarts)
        if self.max_restarts and reform is None:
            raise ConfigError("max_restarts > 0 needs a way to re-form the cluster (tfonspark.run passes one)")
        self.log: list[Restart] = []  # one record per restart, oldest first
        self._reform, self._reserve, self._restartable = reform, reserve, restartable
        self._causes: list[NodeFailed] = []  # each failed attempt's error, oldest first
        self._final: NodeFailed | None = None
        self._payload = b""

    @property
    def failure(self) -> NodeFailed | None:
        """The node failure that tore the cluster down (naming every attempt once they ran out)."""
        return self._final or self.gang.failure

    def can_restart(self) -> bool:
        return self._reform is not None and self._restartable()

    def begin(self, payload: bytes) -> None:
        """Start the first gang; a node failing while it starts uses a restart like any other failure."""
        self._payload = payload
        try:
            if self._reserve is not None:
                self._reserve()
            self._mark_spares(0)
            self.gang.start(payload)
        except NodeFailed as error:
            self.restart(error)  # which starts the next attempt, or raises

    def run(self, action: Callable[[], _T]) -> _T:
        """``action()``; after a node failure, restart the cluster and call it again while restarts last."""
        while True:
            try:
                return action()
            except NodeFailed as error:
                self.restart(error)

    def restart(self, error: NodeFailed) -> None:
        """Start the next attempt after ``error`` (the gang is torn down), or raise, naming every attempt."""
        self._causes.append(error)
        while len(self._causes) <= self.max_restarts and self.can_restart():
            attempt = len(self._causes)
            log_restart(self._causes[-1], attempt, self.max_restarts)
            gang = self.gang
            record = Restart(attempt, self._causes[-1], gang.failed_at, gang.detect_s, gang.teardown_s)
            self.log.append(record)
            try:
                self._start(attempt, record)
                return
            except NodeFailed as again:
                self._causes.append(again)
        raise self.give_up(None) from None

    def give_up(self, error: NodeFailed | None) -> NodeFailed:
        """The error that ends the job after ``error`` (if any): the last one, naming every attempt."""
        if error is not None:
            self._causes.append(error)
        self._final = exhausted(self._causes, self.max_restarts)
        return self._final

    def _mark_spares(self, attempt: int) -> None:
        """Nodes of ``attempt`` keep a warm spare TF process while a restart may follow (executor/spare.py)."""
        keep = self._reform is not None and attempt < self.max_restarts
        if keep != self.gang.config.keep_spare:
            self.gang.config = dataclasses.replace(self.gang.config, keep_spare=keep)

    def _start(self, attempt: int, record: Restart) -> None:
        """A fresh gang (rendezvous server, secret), executors reserved again, ``map_fun`` started again."""
        assert self._reform is not None
        started = time.monotonic()
        self.gang = self._reform(attempt)
        try:
            if self._reserve is not None:
                self._reserve()
        except BaseException:
            self.gang.teardown(grace_secs=0)
            raise
        reserved = time.monotonic() - started
        self._mark_spares(attempt)
        self.gang.start(self._payload)
        record.reserve_s = reserved + self.gang.phases[0]
        record.startup_s = self.gang.phases[1]
        record.total_s = time.time() - record.failed_at
        _log.info(
            "TensorFlow cluster restarted (attempt %d): %.1fs after the failure (teardown %.1fs, "
            "reservation %.1fs, start-up %.1fs)",
            attempt,
            record.total_s,
            record.teardown_s,
            record.reserve_s,
            record.startup_s,
        )
