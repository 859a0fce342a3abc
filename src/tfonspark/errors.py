"""Every error tfonspark raises, in one tree.

::

    TFoSError
    ├── ConfigError (ValueError)            bad argument or setting, found before any work starts
    │   └── ExecutorEnvironmentError         the executors' Python lacks tfonspark, or has another version
    ├── InputError (ValueError)             bad data: ragged rows, wrong dtypes, missing columns
    ├── ClusterError                        the TensorFlow cluster as a whole went wrong
    │   ├── ReservationTimeout (TimeoutError)   too few nodes registered in time
    │   ├── NodeFailed                       a TF node exited with an error or was killed
    │   └── ShutdownTimeout (TimeoutError)   nodes did not finish within the shutdown timeout
    ├── FeedError                           feeding data to, or reading results from, a node
    │   └── FeedTimeout (TimeoutError)       a node did not take or return data in time
    ├── ProtocolError                       a peer broke the wire protocol
    │   └── AuthenticationError              a peer failed the per-cluster secret check
    ├── DataFormatError (ValueError)        a corrupt file (TFRecord, idx): names file and offset
    └── CheckpointTimeout (TimeoutError)    the sidecar evaluator saw no checkpoint within its timeout

All exceptions are picklable (they travel from Spark executors to the driver) and carry the
values that explain them as attributes.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AuthenticationError",
    "CheckpointTimeout",
    "ClusterError",
    "ConfigError",
    "DataFormatError",
    "ExecutorEnvironmentError",
    "FeedError",
    "FeedTimeout",
    "InputError",
    "NodeFailed",
    "ProtocolError",
    "ReservationTimeout",
    "ShutdownTimeout",
    "TFoSError",
]


class TFoSError(Exception):
    """Base of every tfonspark error."""

    def __reduce__(self) -> tuple[Any, ...]:  # keep subclasses with keyword attributes picklable
        return (_rebuild, (type(self), self.args, self.__dict__))


def _rebuild(cls: type[TFoSError], args: tuple[Any, ...], state: dict[str, Any]) -> TFoSError:
    err: TFoSError = cls.__new__(cls, *args)  # not Exception.__new__: OSError (TimeoutError) has its own
    Exception.__init__(err, *args)
    err.__dict__.update(state)
    return err


def restore(cls: type[TFoSError], message: str, attrs: dict[str, Any]) -> TFoSError:
    """An instance of ``cls`` with exactly this message and these attributes (from another process)."""
    return _rebuild(cls, (message,), attrs)


class ConfigError(TFoSError, ValueError):
    """An argument or setting is invalid; the message says what was received and what is valid."""


class ExecutorEnvironmentError(ConfigError):
    """The Python the executors run cannot start a node: no tfonspark there, or another version.

    Found by the node task's first step, before any of tfonspark is imported on the executor
    (``executor/preflight.py``), and raised on the driver at once, without Spark's task retries.
    ``python`` is the executor's interpreter (its ``sys.executable``), ``host`` its host,
    ``driver_version`` the driver's tfonspark and ``executor_version`` the executor's (``""``:
    none importable). The message also says how Spark chose that Python and how to ship one.
    """

    def __init__(
        self, message: str, *, python: str = "", host: str = "", driver_version: str = "", executor_version: str = ""
    ) -> None:
        super().__init__(message)
        self.python = python
        self.host = host
        self.driver_version = driver_version
        self.executor_version = executor_version


class InputError(TFoSError, ValueError):
    """Data handed to tfonspark cannot be turned into tensors.

    ``column``, ``partition`` and ``row`` locate the bad value where known.
    """

    def __init__(
        self,
        message: str,
        *,
        column: str | int | None = None,
        partition: int | None = None,
        row: int | None = None,
    ) -> None:
        where = ", ".join(
            f"{k}={v!r}" for k, v in (("column", column), ("partition", partition), ("row", row)) if v is not None
        )
        super().__init__(f"{message} ({where})" if where else message)
        self.column = column
        self.partition = partition
        self.row = row


class ClusterError(TFoSError):
    """The TensorFlow cluster failed as a whole."""


class ReservationTimeout(ClusterError, TimeoutError):
    """Fewer nodes than needed registered within ``reservation_timeout``."""

    def __init__(self, message: str, *, registered: int = 0, required: int = 0) -> None:
        super().__init__(message)
        self.registered = registered
        self.required = required


class NodeFailed(ClusterError):
    """TensorFlow nodes failed; ``role``/``index`` name the first, ``traceback`` holds its last lines.

    ``failures`` maps every failed node (``"worker:1"``) to its traceback tail (or how it ended).
    ``attempts`` holds one line per failed attempt of a cluster that was restarted
    (``max_restarts``), oldest first; the last is this failure.
    """

    def __init__(
        self,
        message: str,
        *,
        role: str = "",
        index: int = -1,
        exit_code: int | None = None,
        traceback: str = "",
        failures: dict[str, str] | None = None,
        attempts: list[str] | None = None,
    ) -> None:
        first = f"{role}:{index}"
        failures = dict(failures) if failures else ({first: traceback} if traceback else {})
        text = message
        for name, tail in failures.items():
            if tail and tail not in message:  # how a node without output ended is said once, above
                text += f"\n--- last output of {name} ---\n{tail}"
        super().__init__(text)
        self.role = role
        self.index = index
        self.exit_code = exit_code
        self.traceback = traceback
        self.failures = failures
        self.attempts = list(attempts) if attempts else []


class ShutdownTimeout(ClusterError, TimeoutError):
    """Nodes were still running when the shutdown timeout expired (they have been stopped)."""


class FeedError(TFoSError):
    """Feeding a partition to a node, or reading its results back, failed."""


class FeedTimeout(FeedError, TimeoutError):
    """A node accepted no data (or returned no result) within ``feed_timeout`` seconds."""


class ProtocolError(TFoSError):
    """A peer sent bytes that do not follow the tfonspark wire protocol."""


class AuthenticationError(ProtocolError):
    """A peer could not prove it holds this cluster's secret."""


class DataFormatError(TFoSError, ValueError):
    """A data file is corrupt or not of the expected format; names the file and byte offset."""

    def __init__(self, message: str, *, path: str = "", offset: int | None = None) -> None:
        where = f"{path}" + (f" at byte {offset}" if offset is not None else "")
        super().__init__(f"{message}: {where}" if where else message)
        self.path = path
        self.offset = offset


class CheckpointTimeout(TFoSError, TimeoutError):
    """No checkpoint appeared within the sidecar evaluator's ``timeout`` (``tfonspark.keras.sidecar_evaluate``)."""
