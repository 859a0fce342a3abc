"""What ``ctx.report({...})`` sends from a node, kept and shown on the driver."""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Report", "ReportLog"]

log = logging.getLogger("tfonspark.report")


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
    """The last ``keep`` reports of a cluster; hands each to ``on_report`` (or logs it at INFO)."""

    def __init__(self, on_report: Callable[[Report], Any] | None = None, keep: int = 10_000) -> None:
        self._on_report = on_report
        self._reports: collections.deque[Report] = collections.deque(maxlen=keep)
        self._lock = threading.Lock()

    def add(self, role: str, index: int, metrics: Mapping[str, Any]) -> Report:
        report = Report(role, index, dict(metrics))
        with self._lock:
            self._reports.append(report)
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
            return list(self._reports)

    def latest(self) -> dict[str, Report]:
        """The newest report of each node, keyed ``"role:index"``."""
        return {r.node: r for r in self.all()}


def _one_line(metrics: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items())
