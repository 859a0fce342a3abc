"""``ctx.report({...})``: metrics from a TF node to the driver, over the supervisor's channel.

The path: :class:`Reporter` writes a ``node_event`` status line (kind ``report``) to the
supervisor (``tfprocess/entry.py``), the supervisor relays it to the driver as a
:class:`~tfonspark.wire.messages.NodeEvent` on its authenticated connection, and the driver
hands it to ``tfonspark.run(..., on_report=...)`` and keeps it in ``cluster.reports``
(:mod:`tfonspark.driver.reports`). So a report costs no extra connection, port or secret.

Two rules shape this module:

* **Bad input fails at the call, in the caller's thread** (:func:`report_payload`): the metrics
  must be a mapping with ``str`` keys and JSON values, at most :data:`MAX_REPORT_BYTES` encoded.
  numpy scalars and arrays (and eager tensors, through their ``numpy()``) become Python numbers
  and lists, so ``ctx.report({"loss": np.float32(0.5)})`` just works.
* **Reporting never stalls or breaks training**: reports are written by a background thread
  (:class:`Reporter`), so a slow or frozen supervisor cannot block ``map_fun``; when more than
  ``max_pending`` wait, the oldest are dropped (with one warning); a supervisor that is gone
  drops them silently (the node is being stopped anyway).
"""

from __future__ import annotations

import collections
import json
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..errors import ConfigError

__all__ = ["MAX_REPORT_BYTES", "Reporter", "report_payload"]

log = logging.getLogger(__name__)

MAX_REPORT_BYTES = 64 * 1024
"""The largest report, JSON-encoded: progress and summaries, not data (the control channel
carries heartbeats and Stop too, and the driver keeps the last 10,000 reports)."""

_MAX_DEPTH = 32  # nesting of lists/dicts; deeper is almost surely a cycle
_JSON_TYPES = "str, int, float, bool, None, lists and str-keyed dicts of them, numpy scalars and arrays"


def report_payload(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """``metrics`` as plain JSON values (a new dict), or ConfigError naming what cannot be sent.

    Floats that are not finite (a diverging loss) are kept: Python's ``json`` on both ends
    writes and reads ``NaN`` and ``Infinity``.
    """
    if not isinstance(metrics, Mapping):
        raise ConfigError(f"ctx.report takes a mapping of metric name -> value. Received: {type(metrics).__name__}")
    payload = _object(metrics, "", 0)
    size = len(json.dumps(payload, separators=(",", ":")).encode())
    if size > MAX_REPORT_BYTES:
        biggest = max(payload, key=lambda k: len(json.dumps(payload[k])), default="")
        raise ConfigError(
            f"a report may be at most {MAX_REPORT_BYTES} bytes as JSON; report metrics and "
            f"summaries, and write larger results to files. Received: {size} bytes "
            f"(largest key: {biggest!r})"
        )
    return payload


def _object(mapping: Mapping[Any, Any], where: str, depth: int) -> dict[str, Any]:
    """A str-keyed mapping with every value converted."""
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        if not isinstance(key, str):
            raise ConfigError(
                f"ctx.report keys must be str. Received: key {key!r} ({type(key).__name__})"
                + (f" in {where!r}" if where else "")
            )
        out[key] = _value(value, f"{where}.{key}" if where else key, depth + 1)
    return out


def _value(value: Any, where: str, depth: int) -> Any:
    """One value as JSON: scalars kept, numpy values and containers converted."""
    if depth > _MAX_DEPTH:
        raise ConfigError(f"ctx.report values nest more than {_MAX_DEPTH} levels deep. Received: at {where!r}")
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return str(value)  # str subclasses (np.str_) as plain str
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)  # np.float64 is a float
    if isinstance(value, np.generic):
        if isinstance(value, (np.bool_, np.integer, np.floating)):
            return value.item()
    elif isinstance(value, np.ndarray):
        if value.dtype.kind in "biuf":
            return value.tolist()
        if value.dtype == object:
            return [_value(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value.tolist())]
    elif isinstance(value, Mapping):
        return _object(value, where, depth)
    elif isinstance(value, (list, tuple)):
        return [_value(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
    elif callable(getattr(value, "numpy", None)):  # an eager tf.Tensor / Variable
        return _value(np.asarray(value.numpy()), where, depth)
    raise ConfigError(
        f"ctx.report values must be JSON-able ({_JSON_TYPES}). "
        f"Received: {where}={type(value).__name__}" + (f" of dtype {value.dtype}" if hasattr(value, "dtype") else "")
    )


class Reporter:
    """Hands reports to ``send`` on a daemon thread, oldest first; the caller never waits.

    ``send`` (writing a status line to the supervisor) may block or fail: the thread swallows
    its errors. At most ``max_pending`` reports wait; beyond that the oldest is dropped (the
    newest say most). :meth:`flush` waits, with a bound, for the queue to empty: the TF process
    calls it when ``map_fun`` returns, before it exits.
    """

    def __init__(self, send: Callable[[dict[str, Any]], None], *, max_pending: int = 256) -> None:
        if max_pending < 1:
            raise ConfigError(f"max_pending must be >= 1. Received: max_pending={max_pending!r}")
        self._send = send
        self._max_pending = max_pending
        self._pending: collections.deque[dict[str, Any]] = collections.deque()
        self._cond = threading.Condition()
        self._busy = False
        self._thread: threading.Thread | None = None
        self.dropped = 0

    def __call__(self, payload: dict[str, Any]) -> None:
        """Queue one validated report (see :func:`report_payload`) for sending."""
        with self._cond:
            if len(self._pending) >= self._max_pending:
                self._pending.popleft()
                self.dropped += 1
                if self.dropped == 1:
                    log.warning(
                        "ctx.report: more than %d reports waiting to be sent; dropping the oldest", self._max_pending
                    )
            self._pending.append(payload)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True, name="tfos-report")
                self._thread.start()
            self._cond.notify_all()

    def _run(self) -> None:
        """Send queued reports in order, for the life of the process."""
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._pending))
                payload = self._pending.popleft()
                self._busy = True
            try:
                self._send(payload)
            except Exception:  # noqa: BLE001 - a report must never take the node down
                log.debug("ctx.report: a report could not be sent", exc_info=True)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def flush(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until every queued report was handed to ``send``."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending and not self._busy, timeout)
