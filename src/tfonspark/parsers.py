"""The rules a setting's value follows: a raw value in, the value out, or ValueError.

A raw value is text (a Spark conf key or an environment variable) or any object (an argument
given in code). A rule returns the value normalised (``" 12 "`` is 12, ``"NCCL"`` is ``"nccl"``)
or raises ValueError (``int()`` and ``float()`` may raise TypeError or OverflowError too);
:mod:`tfonspark.settings`, whose table names the rule of each setting, turns that into a
ConfigError naming the key, what is valid and where the value came from. A rule's return type is
the type of its setting's value (``tests/unit/test_settings.py`` checks it against the table).
This module imports nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

__all__ = ["integer", "port", "seconds", "switch", "text", "word"]

_ON = ("on", "true", "yes", "1")
_OFF = ("off", "false", "no", "0")


def text(raw: object) -> str:
    """Text, stripped."""
    if not isinstance(raw, str):
        raise ValueError
    return raw.strip()


def integer(raw: object, minimum: int | None = None) -> int:
    """A whole number (an int or its text; not a bool, not ``"1.5"``), at least ``minimum`` if given."""
    if isinstance(raw, bool) or not isinstance(raw, (int, str)):
        raise ValueError
    value = int(raw)  # int(" 12 ") is 12; int("1.5") raises
    if minimum is not None and value < minimum:
        raise ValueError
    return value


def port(raw: object) -> int:
    """A port number, 0-65535 (0: any free port)."""
    value = integer(raw)
    if not 0 <= value <= 65535:
        raise ValueError
    return value


def seconds(raw: object, longest: float) -> float:
    """A wait: seconds > 0 and at most ``longest`` (nan and inf are refused)."""
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise ValueError
    value = float(raw)
    if not (value > 0 and math.isfinite(value) and value <= longest):
        raise ValueError
    return value


def switch(raw: object) -> bool:
    """On or off: a bool, or ``on``/``off``, ``true``/``false``, ``yes``/``no``, ``1``/``0``."""
    if isinstance(raw, bool):
        return raw
    name = text(raw).lower()
    if name in _ON or name in _OFF:
        return name in _ON
    raise ValueError


def word(raw: object, words: Sequence[str], synonyms: Mapping[str, str] | None = None) -> str:
    """One of ``words``, in any case; a key of ``synonyms`` stands for its value."""
    name = text(raw).lower()
    name = (synonyms or {}).get(name, name)
    if name not in words:
        raise ValueError
    return name
