"""The multi-host cluster every multi-host test shares: made once per test session, always torn down.

All files of ``hosts``-marked tests run in one pytest(-xdist) worker, one after the other
(``tests/conftest.py``: ``pytest_xdist_make_scheduler`` and the collection order), so one
cluster serves them all: a driver host, a master host and three worker hosts (one core, 1 GiB
each), Spark's standalone master and workers up. Starting it costs about 26 s on 2 idle cores,
more under load: once, not once per file. A test that needs two executors asks for two cores
(``spark.cores.max``); the test that kills a host's Spark worker runs after all the others
(the ``breaks_host`` marker).

Its hosts are named ``tfh<worker>-*`` on ``10.<232 + worker>.0.0/24``, ``<worker>`` the xdist
worker's number (0 without xdist): a second worker that is given a hosts file (another
``--dist`` mode) makes hosts of its own, never the same names.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tfonspark.testing.hosts import Hosts, unavailable

__all__ = ["ALL_HOSTS", "GPUS_PER_HOST", "GPU_DISCOVERY", "hosts", "on_request"]

#: set to 1 to run the multi-host variants make test leaves out (each says what it adds)
ALL_HOSTS = "TFONSPARK_ALL_HOSTS"


def _worker_number() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(worker[2:]) if worker[2:].isdigit() else 0


#: each worker host's GPU discovery script prints two fake GPUs whose addresses name the host
#: (``h2``: 20 and 21), so a test can tell which host's GPUs a node was given
GPU_DISCOVERY = """#!/bin/sh
n="$(hostname)"; n="${n##*-h}"
echo "{\\"name\\": \\"gpu\\", \\"addresses\\": [\\"${n}0\\", \\"${n}1\\"]}"
"""
GPUS_PER_HOST = 2


@pytest.fixture(scope="session")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hosts]:
    """A driver host, a master host and three worker hosts with Spark up, each worker with two fake
    GPUs (:data:`GPU_DISCOVERY`; only a job that asks for GPUs gets any); skips where namespaces
    cannot be made. At the end nothing is left: no namespace, link or /etc/netns entry."""
    why = unavailable()
    if why:
        pytest.skip(f"no multi-host cluster here: {why}")
    script = tmp_path_factory.mktemp("gpus") / "discover.sh"
    script.write_text(GPU_DISCOVERY)
    script.chmod(0o755)
    gpus = f"-Dspark.worker.resource.gpu.amount={GPUS_PER_HOST} -Dspark.worker.resource.gpu.discoveryScript={script}"
    number = _worker_number()
    made = Hosts(workers=3, prefix=f"tfh{number}", subnet=f"10.{232 + number}.0").up()
    try:
        made.spark(memory="1g", worker_env={"SPARK_WORKER_OPTS": gpus})
        yield made
    finally:
        made.down()
    assert made.leftovers() == {"namespaces": [], "links": [], "etc": []}


def on_request(adds: str) -> pytest.MarkDecorator:
    """Leave a multi-host variant out of ``make test`` unless ``TFONSPARK_ALL_HOSTS=1``; ``adds``:
    what it checks beyond the variants that always run, and what it costs."""
    return pytest.mark.skipif(
        os.environ.get(ALL_HOSTS) != "1", reason=f"{adds}; make test leaves it out: {ALL_HOSTS}=1 runs it"
    )
