"""``ctx.report({...})``: metrics from a TF node to the driver, over the supervisor's channel.

The path: :class:`Reporter` writes a :class:`~tfonspark.wire.events.Reported` status line to
the supervisor (``tfprocess/entry.py``), the supervisor relays that event to the driver on its
authenticated connection, and the driver
hands it to ``tfonspark.run(..., on_report=...)`` and keeps it in ``cluster.reports``
(:mod:`tfonspark.driver.nodes.reports`). So a report costs no extra connection, port or secret.

Two rules shape this module:

* **Bad input fails at the call, in the caller's thread** (:func:`report_payload`): the metrics
  must be a mapping with ``str`` keys and JSON values, at most :data:`MAX_REPORT_BYTES` encoded.
  numpy scalars and arrays (and eager tensors, through their ``numpy()``) become Python numbers
  and lists, so ``ctx.report({"loss": np.float32(0.5)})`` just works. Every failure is a
  ``ConfigError``; a value too large is refused as soon as its size shows it (an array's
  element count), before it is converted, so a 10M-element array costs no more than a small one.
* **Reporting never stalls or breaks training**: reports are written by a background thread
  (:class:`Reporter`), so a slow or frozen supervisor cannot block ``map_fun``; when more than
  ``max_pending`` wait, the oldest are dropped (with one warning); a supervisor that is gone
  drops them silently (the node is being stopped anyway).
"""

from __future__ import annotations

import collections
import json
import logging
import sys
import threading
import types
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import ConfigError

__all__ = ["MAX_REPORT_BYTES", "Reporter", "report_payload"]

log = logging.getLogger(__name__)

MAX_REPORT_BYTES = 64 * 1024
"""The largest report, JSON-encoded: progress and summaries, not data (the control channel
carries heartbeats and Stop too, and the driver keeps the last 10,000 reports)."""

_MAX_DEPTH = 32  # nesting of lists/dicts; deeper is almost surely a cycle
#: ints with more digits are refused: CPython converts at most 4,300 digits between int and str
#: by default (``sys.get_int_max_str_digits``), in ``json.dumps`` here and ``json.loads`` on the
#: driver alike
_MAX_INT_DIGITS = 4300
_INT_BOUND = 10**_MAX_INT_DIGITS
#: Stands in for numpy while it is not loaded: no value can be a numpy one then, and the TF
#: process does not pay ~0.1 s of start-up importing numpy for a ``map_fun`` that never uses it.
_NO_NUMPY = types.SimpleNamespace(generic=(), ndarray=())
_JSON_TYPES = "str, int, float, bool, None, lists and str-keyed dicts of them, numpy scalars and arrays"


def report_payload(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """``metrics`` as plain JSON values (a new dict), or ConfigError naming what cannot be sent.

    Floats that are not finite (a diverging loss) are kept: Python's ``json`` on both ends
    writes and reads ``NaN`` and ``Infinity``.
    """
    if not isinstance(metrics, Mapping):
        raise ConfigError(f"ctx.report takes a mapping of metric name -> value. Received: {type(metrics).__name__}")
    payload = _Converter().object(metrics, "", 0)
    try:
        size = len(json.dumps(payload, separators=(",", ":")).encode())
    except ValueError as exc:  # an int over a limit lowered with sys.set_int_max_str_digits
        raise ConfigError(f"ctx.report could not encode the metrics as JSON. Received: {exc}") from None
    if size > MAX_REPORT_BYTES:
        biggest = max(payload, key=lambda k: len(json.dumps(payload[k])), default="")
        raise ConfigError(
            f"a report may be at most {MAX_REPORT_BYTES} bytes as JSON; report metrics and "
            f"summaries, and write larger results to files. Received: {size} bytes "
            f"(largest key: {biggest!r})"
        )
    return payload


def _too_large(where: str, what: str) -> ConfigError:
    return ConfigError(
        f"a report may be at most {MAX_REPORT_BYTES} bytes as JSON; report metrics and summaries, and "
        f"write larger results to files. Received: more than that by {where!r} ({what})"
    )


class _Converter:
    """Converts one report, counting bytes its JSON surely takes as it goes (every value at
    least its shortest encoding, brackets, commas, quoted keys): past :data:`MAX_REPORT_BYTES`
    it stops, and a container or array whose length alone shows it cannot fit in what is left
    is refused before it is converted. So a 10M-element array or a list of large lists costs
    time in proportion to the limit, not to its size. :func:`report_payload` still measures the
    real encoding."""

    def __init__(self) -> None:
        self.left = MAX_REPORT_BYTES

    def need(self, nbytes: int, where: str, what: str) -> None:
        """Refuse a value that surely takes more than ``nbytes`` when fewer are left."""
        if nbytes > self.left:
            raise _too_large(where, what)

    def spend(self, nbytes: int, where: str, what: str) -> None:
        self.need(nbytes, where, what)
        self.left -= nbytes

    def object(self, mapping: Mapping[Any, Any], where: str, depth: int) -> dict[str, Any]:
        """A str-keyed mapping with every value converted."""
        n, what = len(mapping), f"a mapping of {len(mapping):,} keys"
        self.need(5 * n + 1 if n else 2, where or "the metrics", what)  # {"":0,...}
        self.spend(n + 1 if n else 2, where or "the metrics", what)  # braces and commas
        out: dict[str, Any] = {}
        for key, value in mapping.items():
            if not isinstance(key, str):
                raise ConfigError(
                    f"ctx.report keys must be str. Received: key {key!r} ({type(key).__name__})"
                    + (f" in {where!r}" if where else "")
                )
            inner = f"{where}.{key}" if where else key
            self.spend(len(key) + 3, inner, f"a key of {len(key):,} characters")
            out[key] = self.value(value, inner, depth + 1)
        return out

    def sequence(self, items: list[Any] | tuple[Any, ...], where: str, depth: int, what: str) -> list[Any]:
        n = len(items)
        self.need(2 * n + 1 if n else 2, where, what)  # [0,...]
        self.spend(n + 1 if n else 2, where, what)  # brackets and commas
        return [self.value(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(items)]

    def value(self, value: Any, where: str, depth: int) -> Any:
        """One value as JSON: scalars kept, numpy values and containers converted."""
        if depth > _MAX_DEPTH:
            raise ConfigError(f"ctx.report values nest more than {_MAX_DEPTH} levels deep. Received: at {where!r}")
        if value is None or isinstance(value, bool):
            self.spend(4, where, "null, true or false")
            return value
        if isinstance(value, str):
            self.spend(len(value) + 2, where, f"a str of {len(value):,} characters")
            return str(value)  # str subclasses (np.str_) as plain str
        if isinstance(value, int):
            self.spend(1, where, "an int")
            return _int(int(value), where)
        if isinstance(value, float):
            self.spend(3, where, "a float")  # 0.0, NaN
            return float(value)  # np.float64 is a float
        np = sys.modules.get("numpy", _NO_NUMPY)
        if isinstance(value, np.generic):
            if isinstance(value, (np.bool_, np.integer, np.floating)):
                self.spend(1, where, "a number")
                return value.item()  # 64 bits at most: within the int digit limit
        elif isinstance(value, np.ndarray):
            n, what = value.size, f"an array of {value.size:,} values"
            if value.dtype.kind in "biuf":  # checked from its size, before converting it
                self.spend(2 * n + 1 if n else 2, where, what)
                return value.tolist()
            if value.dtype == object:
                if value.ndim == 0:
                    return self.value(value.item(), where, depth)
                self.need(2 * n + 1 if n else 2, where, what)
                return self.sequence(value.tolist(), where, depth, what)
        elif isinstance(value, Mapping):
            return self.object(value, where, depth)
        elif isinstance(value, (list, tuple)):
            return self.sequence(value, where, depth, f"a {type(value).__name__} of {len(value):,} values")
        elif callable(getattr(value, "numpy", None)):  # an eager tf.Tensor / Variable
            import numpy

            return self.value(numpy.asarray(value.numpy()), where, depth)
        raise ConfigError(
            f"ctx.report values must be JSON-able ({_JSON_TYPES}). "
            f"Received: {where}={type(value).__name__}"
            + (f" of dtype {value.dtype}" if hasattr(value, "dtype") else "")
        )


def _int(value: int, where: str) -> int:
    """``value`` if JSON on both ends can carry it (at most ``_MAX_INT_DIGITS`` digits)."""
    if -_INT_BOUND < value < _INT_BOUND:
        return value
    raise ConfigError(
        f"ctx.report ints may have at most {_MAX_INT_DIGITS:,} digits (Python's int/str conversion limit, "
        f"which the driver applies too when it reads the report). Received: {where!r}, an int of about "
        f"{value.bit_length() * 0.30103:,.0f} digits; report it as a float or a str"
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
