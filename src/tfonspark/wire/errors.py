"""Typed errors across the Spark task boundary: one capture on the executor, one re-raise on the driver.

Spark turns an exception in a Python task into text (the executor's traceback inside a Java
exception), so a :class:`~tfonspark.errors.TFoSError` raised on an executor would reach the
driver as a string. :func:`capture` (executor side) encodes the error, its class name and every
attribute (``column``, ``partition``, ``row``, ``path`` ...) as one JSON marker in that text;
:func:`reraise` (driver side) finds the marker and raises the same typed error again. Only
classes of :mod:`tfonspark.errors` can be rebuilt, and nothing is unpickled: the marker is JSON.

A job that must not be retried (a data error fails the same way every time) returns
:func:`encode`'s text in a result column instead of raising, and the driver hands that text to
:func:`reraise` as well.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import inspect
import json
import re
from collections.abc import Callable, Iterator
from typing import Any, NoReturn, TypeVar

from .. import errors

__all__ = ["CapturedError", "capture", "captured", "decode", "encode", "raise_or", "reraise", "summary"]

_MARK = "[tfonspark-error "
_FOUND = re.compile(re.escape(_MARK) + r"([A-Za-z0-9_=-]+)\]")
F = TypeVar("F", bound=Callable[..., Any])


class CapturedError(Exception):
    """What an executor raises for a typed error: its text carries the encoded original."""


def encode(err: errors.TFoSError) -> str:
    """The marker text that carries ``err`` (class, message, attributes) to the driver."""
    attrs = {k: v if _jsonable(v) else repr(v) for k, v in vars(err).items()}
    message = str(err.args[0]) if err.args else ""
    payload = json.dumps({"type": type(err).__name__, "message": message, "attrs": attrs})
    return _MARK + base64.urlsafe_b64encode(payload.encode()).decode() + "]"


def _jsonable(value: Any) -> bool:
    if value is None or isinstance(value, (str, int, float, bool)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_jsonable(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _jsonable(v) for k, v in value.items())
    return False


def decode(text: str) -> errors.TFoSError | None:
    """The first typed error encoded in ``text`` (e.g. a Spark task failure), or None."""
    for match in _FOUND.finditer(text):
        try:
            data = json.loads(base64.urlsafe_b64decode(match.group(1)))
            cls = getattr(errors, str(data["type"])) if data["type"] in errors.__all__ else None
        except (ValueError, KeyError, TypeError):
            continue
        if isinstance(cls, type) and issubclass(cls, errors.TFoSError):
            attrs = data.get("attrs") if isinstance(data.get("attrs"), dict) else {}
            return errors.restore(cls, str(data.get("message", "")), attrs)
    return None


@contextlib.contextmanager
def capture() -> Iterator[None]:
    """Executor side: a TFoSError raised inside becomes a :class:`CapturedError` carrying it."""
    try:
        yield
    except errors.TFoSError as err:
        raise CapturedError(f"{type(err).__name__}: {err} {encode(err)}") from err


def captured(fn: F) -> F:
    """Decorate a Spark task function (plain or generator) so its typed errors reach the driver."""
    if inspect.isgeneratorfunction(fn):

        @functools.wraps(fn)
        def gen(*args: Any, **kwargs: Any) -> Any:
            with capture():
                yield from fn(*args, **kwargs)

        return gen  # type: ignore[return-value]

    @functools.wraps(fn)
    def plain(*args: Any, **kwargs: Any) -> Any:
        with capture():
            return fn(*args, **kwargs)

    return plain  # type: ignore[return-value]


def _texts(exc: BaseException) -> Iterator[str]:
    """The text of ``exc`` and of the exceptions it was raised from (Java errors included)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield str(current)
        java = getattr(current, "java_exception", None)
        if java is not None:
            with contextlib.suppress(Exception):
                yield str(java.toString())
        current = current.__cause__ or current.__context__


def reraise(failure: BaseException | str) -> None:
    """Driver side: raise the typed error encoded in ``failure``; return if there is none.

    ``failure`` is the exception a Spark action raised (or a result column's text).
    """
    for text in [failure] if isinstance(failure, str) else _texts(failure):
        err = decode(text)
        if err is not None:
            if isinstance(failure, BaseException):
                raise err from failure
            raise err


def raise_or(failure: BaseException, fallback: Callable[[str], errors.TFoSError]) -> NoReturn:
    """Re-raise ``failure``'s typed error, or ``fallback(summary)`` when it carries none."""
    reraise(failure)
    raise fallback(summary(failure)) from failure


def summary(exc: BaseException) -> str:
    """One line for an untyped task failure: the last ``...Error: ...`` line of its traceback."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    named = [line for line in lines if re.match(r"^[\w.]*(Error|Exception)\b.*:", line)]
    return named[-1] if named else (lines[0] if lines else repr(exc))
