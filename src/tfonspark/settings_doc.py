"""docs/settings.md's two tables, made from the code: the settings, and the waits derived from them.

``tests/unit/test_settings_doc.py`` keeps the page equal to :func:`markdown_table` and
:func:`derived_waits_table`; the rows come from :data:`tfonspark.settings.SETTINGS` and
:data:`DERIVED_WAITS` below, the one list of waits that are not a setting of their own.
"""

from __future__ import annotations

from dataclasses import dataclass

from .settings import FEED_FIRST_MESSAGE_SECS, FEED_STARVED_SECS, FEED_WAIT_WARNING_SECS, SETTINGS

__all__ = ["DERIVED_WAITS", "DerivedWait", "derived_waits_table", "markdown_table"]


def markdown_table() -> str:
    """The settings table of docs/settings.md, made from :data:`SETTINGS` (a test keeps them equal)."""
    rows = [
        "| keyword argument | Spark conf key | environment variable | default | meaning |",
        "| --- | --- | --- | --- | --- |",
    ]
    for s in SETTINGS:
        env = " (or ".join(f"`{name}`" for name in s.env) + ")" * (len(s.env) - 1)
        rows.append(f"| `{s.name}` | `{s.conf_key}` | {env} | {s.describe_default()} | {s.meaning} |")
    return "\n".join(rows) + "\n"


@dataclass(frozen=True)
class DerivedWait:
    """A wait that is not a setting of its own: what it is, and how it follows from a setting."""

    name: str
    rule: str
    meaning: str


DERIVED_WAITS: tuple[DerivedWait, ...] = (
    DerivedWait(
        "feed connect",
        f"min({FEED_FIRST_MESSAGE_SECS:.0f} s, `feed_timeout`)",
        "a feed task's wait to connect to its node and authenticate",
    ),
    DerivedWait(
        "first feed message",
        f"{FEED_FIRST_MESSAGE_SECS:.0f} s",
        "a node's wait for a new feed connection's first message",
    ),
    DerivedWait(
        "pacing: `Pending`",
        "`feed_timeout` / 4",
        "while a node holds a training partition's Ack, how often it tells the feeder to wait on (`pace_interval`)",
    ),
    DerivedWait(
        "pacing: quiet limit",
        "`feed_timeout` / 2",
        "a held Ack goes anyway after this long without map_fun reading (`pace_quiet_limit`); "
        "before that, the driver releases it once every partition of the feed is handed out or "
        "another data node starves",
    ),
    DerivedWait(
        "room in the feed buffer",
        "1.5 x `feed_timeout` + 5 s",
        "a node's wait for room in its `feed_buffer_bytes` before it drops the feeder's partition, "
        "after the feeder's own `feed_timeout` has reported it (`feed_hold_limit`)",
    ),
    DerivedWait(
        "starving reader",
        f"{FEED_STARVED_SECS:.0f} s",
        "map_fun waiting this long for training data, with nothing queued or arriving, tells the "
        "driver, which releases the Acks other nodes hold",
    ),
    DerivedWait(
        "warning",
        f"{FEED_WAIT_WARNING_SECS:.0f} s",
        "any wait of the feed on a node this long is logged as a WARNING on the driver naming the "
        "node, what it waits for and the setting",
    ),
    DerivedWait(
        "heartbeat",
        "min(5 s, `heartbeat_timeout` / 4)",
        "how often the driver and each supervisor tell each other they are alive",
    ),
)
"""Every wait derived from a setting (or fixed), as docs/settings.md lists them."""


def derived_waits_table() -> str:
    """The table of derived waits in docs/settings.md, made from :data:`DERIVED_WAITS`."""
    rows = ["| wait | how long | what it is |", "| --- | --- | --- |"]
    rows += [f"| {w.name} | {w.rule} | {w.meaning} |" for w in DERIVED_WAITS]
    return "\n".join(rows) + "\n"
