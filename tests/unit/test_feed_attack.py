"""A FeedServer short of file descriptors keeps taking legitimate feeds through a connection flood.

The server runs in a process of its own limited to 64 descriptors (``RLIMIT_NOFILE``), with a
consumer draining its queue; :func:`tests.unit.attack.flood` holds 200 idle and 20 slow
(1 byte / 5 s) unauthenticated connections open against it. A real feeder must deliver a
partition in under 2 s during the flood and after it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import pytest

from tfonspark.executor.feeder import Feeder, FeedTarget

from .attack import SECRET_HEX, flood

pytestmark = pytest.mark.timeout(120)

_SERVER = textwrap.dedent("""
    import json, resource, sys, threading, time
    from tfonspark.tfprocess.datafeed import DataFeed
    from tfonspark.tfprocess.feedserver import FeedServer

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
    server = FeedServer(bytes.fromhex(sys.argv[1]))
    rows = []

    def consume():
        feed = DataFeed(server)
        while True:
            batch = feed.next_columns(1000)
            if batch is None:
                return
            rows.append(batch.count)

    threading.Thread(target=consume, daemon=True).start()
    print(json.dumps({"port": server.port}), flush=True)
    sys.stdin.read()
    # an Ack means the rows are queued here, not yet read: give the consumer a bounded moment
    deadline = time.monotonic() + 10
    while sum(rows) < 10000 and time.monotonic() < deadline:
        time.sleep(0.01)
    listeners = sum(t.name.startswith("tfos-feed") for t in threading.enumerate())
    print(json.dumps({"rows": sum(rows), "listener_threads": listeners}), flush=True)
    server.close()
""")


def _feed(port: int, partition: int) -> float:
    target = FeedTarget("worker:0", "another-executor", "127.0.0.1", port)  # TCP, signed frames
    feeder = Feeder([target], SECRET_HEX, "input", 10.0, feed_id="flooded")
    start = time.monotonic()
    assert list(feeder.train_rdd(partition, iter(range(5000)))) == [5000]
    return time.monotonic() - start


def test_feeds_get_through_a_descriptor_flood_during_and_after():
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVER, SECRET_HEX], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        port = json.loads(proc.stdout.readline())["port"]
        with flood(("127.0.0.1", port), n_idle=200, n_slow=20) as attacker:
            time.sleep(1.0)  # the server is out of descriptors by now
            during = _feed(port, 0)
        time.sleep(1.0)
        after = _feed(port, 1)
        report = json.loads(proc.communicate(timeout=30)[0].strip().splitlines()[-1])
    finally:
        proc.kill()
    print(
        f"\n[measured] feed through a flood: {during:.3f}s during, {after:.3f}s after; "
        f"attacker {attacker.stats}; server {report}"
    )
    assert during < 2 and after < 2
    assert attacker.stats["closed_by_server"] > 0  # the flood really hit the descriptor limit
    assert report["rows"] == 10000
    assert report["listener_threads"] >= 1  # the accept loop is still alive
