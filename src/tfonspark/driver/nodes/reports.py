"""What ``ctx.report({...})`` sends from a node, kept and shown on the driver."""

from __future__ import annotations

import collections
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["KEEP_BYTES", "KEEP_REPORTS", "Report", "ReportLog"]

log = logging.getLogger("tfonspark.report")

KEEP_REPORTS = 10_000
"""How many reports a cluster keeps (``cluster.reports``): the latest."""
KEEP_BYTES = 32 * 1024 * 1024
"""The most bytes of reports (as JSON) a cluster keeps: the latest that fit (at least one)."""


@dataclass(frozen=True)
class Report:
    """One ``ctx.report(metrics)`` call: which node sent it, what it said, when it arrived."""

    role: str
    index: int
    metrics: Mapping[str, Any]
    time: float = field(default_factory=time.time)

    @property
    def node(self) -> str:
        """``"worker:0"``: the role and index of the node that reported."""
        return f"{self.role}:{self.index}"


class ReportLog:
    """The latest reports of a cluster; hands each to ``on_report`` (or logs it at INFO).

    It keeps the last ``keep`` reports, fewer where they hold more than ``keep_bytes`` as JSON,
    so its memory is bounded however many reports a long job makes.
    """

    def __init__(
        self, on_report: Callable[[Report], Any] | None = None, keep: int = KEEP_REPORTS, keep_bytes: int = KEEP_BYTES
    ) -> None:
        self._on_report = on_report
        self._keep, self._keep_bytes = keep, keep_bytes
        self._reports: collections.deque[tuple[Report, int]] = collections.deque()
        self._bytes = 0
        self._lock = threading.Lock()

    def add(self, role: str, index: int, metrics: Mapping[str, Any]) -> Report:
        report = Report(role, index, dict(metrics))
        size = len(json.dumps(report.metrics, separators=(",", ":"), default=str))
        with self._lock:
            self._reports.append((report, size))
            self._bytes += size
            while len(self._reports) > self._keep or (self._bytes > self._keep_bytes and len(self._reports) > 1):
                self._bytes -= self._reports.popleft()[1]
        if self._on_report is None:
            log.info("%s: %s", report.node, _one_line(report.metrics))
            return report
        try:
            self._on_report(report)
        except Exception:  # a broken callback must not stop the cluster's watcher
            log.exception("on_report callback failed for a report from %s", report.node)
        return report

    def all(self) -> list[Report]:
        with self._lock:
            return [report for report, _ in self._reports]

    def latest(self) -> dict[str, Report]:
        """The newest report of each node, keyed ``"role:index"``."""
        return {r.node: r for r in self.all()}


def _one_line(metrics: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items())
