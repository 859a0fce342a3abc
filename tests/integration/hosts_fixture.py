"""The multi-host cluster the host tests share: made once per test module, always torn down."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tfonspark.testing.hosts import Hosts, unavailable


def multi_host(prefix: str, subnet: str, workers: int = 3) -> Iterator[Hosts]:
    """A driver host, a master host and ``workers`` worker hosts with Spark up; skips where
    namespaces cannot be made. At the end nothing is left: no namespace, link or /etc/netns entry."""
    why = unavailable()
    if why:
        pytest.skip(f"no multi-host cluster here: {why}")
    made = Hosts(workers=workers, prefix=prefix, subnet=subnet).up()
    try:
        made.spark(memory="1g")
        yield made
    finally:
        made.down()
    assert made.leftovers() == {"namespaces": [], "links": [], "etc": []}
