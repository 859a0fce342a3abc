"""``tf.debugging`` per node: check numerics, Debugger V2 dumps, device-placement logging.

One implementation for ``run(..., debug=Debug(...))`` (applied by :mod:`.entry` around
``map_fun``) and for :class:`tfonspark.tensorfx.ModelTrainer`. All off by default; when off
nothing here runs and TensorFlow is not imported (this module imports it only when a feature is
turned on).

* ``check_numerics``: ``tf.debugging.enable_check_numerics()``; the first op that makes a NaN or
  an Inf fails the node with :class:`NumericsError` naming the op, the node's role and index;
* ``dump_dir``: ``tf.debugging.experimental.enable_dump_debug_info`` (``CONCISE_HEALTH``) under
  ``<dump_dir>/<role>-<index>``, which TensorBoard's Debugger V2 reads;
* ``log_device_placement``: ``tf.debugging.set_log_device_placement(True)``.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, TFoSError

__all__ = ["Debug", "NumericsError", "debugged", "debugging", "numerics_error"]


@dataclass(frozen=True)
class Debug:
    """``tf.debugging`` on every node of a cluster, all off by default (no cost when off).

    Parameters
    ----------
    check_numerics : bool
        Fail the node at the first op that makes a NaN or an Inf, naming the op, role and index.
    dump_dir : str, optional
        Write Debugger V2 dumps under ``<dump_dir>/<role>-<index>`` (a directory every node can
        write; TensorBoard's Debugger V2 reads them). None: no dumps.
    log_device_placement : bool
        Log the device of each op the node runs.

    Examples
    --------
    >>> Debug(check_numerics=True).enabled
    True
    >>> Debug().enabled
    False
    """

    check_numerics: bool = False
    dump_dir: str | None = None
    log_device_placement: bool = False

    def __post_init__(self) -> None:
        for name in ("check_numerics", "log_device_placement"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"Debug.{name} must be True or False. Received: {getattr(self, name)!r}")
        if self.dump_dir is not None and (not isinstance(self.dump_dir, str) or not self.dump_dir):
            raise ConfigError(f"Debug.dump_dir must be None or a directory path. Received: {self.dump_dir!r}")
        if self.check_numerics and self.dump_dir is not None:
            raise ConfigError(
                "Debug: check_numerics and dump_dir cannot be on together (TensorFlow 2.21 fails to trace a "
                "tf.function under both op callbacks); the dumps' CONCISE_HEALTH already counts each tensor's "
                f"NaNs and Infs. Received: check_numerics=True, dump_dir={self.dump_dir!r}"
            )

    @property
    def enabled(self) -> bool:
        """Whether any feature is on."""
        return self.check_numerics or self.dump_dir is not None or self.log_device_placement

    def to_dict(self) -> dict[str, Any] | None:
        """The JSON-friendly form :class:`~tfonspark.config.NodeConfig` carries; None when all off."""
        return dataclasses.asdict(self) if self.enabled else None

    @classmethod
    def from_dict(cls, fields: Mapping[str, Any] | None) -> Debug:
        """The inverse of :meth:`to_dict` (None: all off)."""
        return cls(**(fields or {}))


class NumericsError(TFoSError):
    """``check_numerics`` found a NaN or an Inf: the op, the node's role and index are named."""


@contextmanager
def debugging(options: Debug, role: str, index: int) -> Iterator[None]:
    """Turn ``options`` on for this process while the block runs; a check_numerics failure in it
    becomes a :class:`NumericsError` naming the op, ``role`` and ``index``. Nothing when all off."""
    if not options.enabled:
        yield
        return
    import tensorflow as tf

    _start(tf, options, role, index)
    try:
        yield
    except tf.errors.InvalidArgumentError as err:
        found = numerics_error(err, role, index)
        if found is None:
            raise
        raise found from err
    finally:
        _stop(tf, options)


def debugged(map_fun: Callable[[Any, Any], Any], options: Debug, role: str, index: int) -> Callable[[Any, Any], Any]:
    """``map_fun`` run under :func:`debugging`; ``map_fun`` itself when every option is off."""
    if not options.enabled:
        return map_fun

    @functools.wraps(map_fun)
    def run(tf_args: Any, ctx: Any) -> Any:
        with debugging(options, role, index):
            return map_fun(tf_args, ctx)

    return run


def _start(tf: Any, options: Debug, role: str, index: int) -> None:
    """Turn on the requested features."""
    if options.log_device_placement:
        tf.debugging.set_log_device_placement(True)
    if options.dump_dir is not None:
        where = os.path.join(options.dump_dir, f"{role}-{index}")
        tf.debugging.experimental.enable_dump_debug_info(
            where, tensor_debug_mode="CONCISE_HEALTH", circular_buffer_size=-1
        )
    if options.check_numerics:
        tf.debugging.enable_check_numerics()


def _stop(tf: Any, options: Debug) -> None:
    """Turn off what :func:`_start` turned on (a process may train again)."""
    if options.check_numerics:
        tf.debugging.disable_check_numerics()
    if options.dump_dir is not None:
        tf.debugging.experimental.disable_dump_debug_info()
    if options.log_device_placement:
        tf.debugging.set_log_device_placement(False)


_NAN_OP = re.compile(r'Detected Infinity or NaN in output \d+ of (?:graph|eagerly-executing) op "([^"]+)"')


def numerics_error(err: Exception, role: str, index: int) -> NumericsError | None:
    """The NumericsError naming op, role and index for a check_numerics failure; None otherwise."""
    message = str(getattr(err, "message", err))
    match = _NAN_OP.search(message)
    if match is None:
        return None
    summary = next(line for line in message.splitlines() if match.group(0) in line).strip(" !")
    return NumericsError(f"check_numerics: op {match.group(1)!r} produced NaN or Inf on {role}:{index}: {summary}")
