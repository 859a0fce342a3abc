"""Exactly once across nodes: two real feed servers ask one real rendezvous server (the driver)
before committing a training partition, so a partition that Spark ran twice and that reached two
different nodes is trained once (tfprocess/feedclaims.py, driver/nodes/ledger.py)."""

from __future__ import annotations

import threading

import pytest

from tests.unit._feeds import MB, SECRET, close_feed, drain, feeder
from tfonspark.driver.nodes.rendezvous import RendezvousServer
from tfonspark.driver.nodes.roles import plan_roles
from tfonspark.errors import FeedError
from tfonspark.testing import free_ports
from tfonspark.tfprocess.datafeed import DataFeed
from tfonspark.tfprocess.feedclaims import DriverClaims
from tfonspark.tfprocess.feedserver import FeedServer


@pytest.fixture
def driver():
    server = RendezvousServer("claims-test", plan_roles(2), SECRET, "127.0.0.1")
    yield server
    server.close()


@pytest.fixture
def nodes(driver):
    """worker:0 and worker:1, each a feed server asking ``driver`` before it commits."""
    made = [
        FeedServer(SECRET, buffer_bytes=4 * MB, ahead=None, claim=DriverClaims(driver.address, SECRET, f"worker:{i}"))
        for i in range(2)
    ]
    yield made
    for server in made:
        server.close()
        server.claim.close()


def read_all(server: FeedServer) -> list:
    close_feed(server)
    return drain(DataFeed(server), 64)


def test_a_partition_that_reached_two_nodes_is_trained_by_the_first_only(driver, nodes):
    first, second = nodes
    rows = list(range(500))
    assert list(feeder(first, "feed-a:0").train_rdd(3, iter(rows))) == [500]
    # Spark ran the task again on another executor, whose feed task fed its own node
    assert list(feeder(second, "feed-a:0").train_rdd(3, iter(rows))) == [500]  # acknowledged: the task succeeds
    assert list(feeder(second, "feed-a:0").train_rdd(4, iter(rows))) == [500]  # another partition is new data
    assert read_all(first) == rows
    assert read_all(second) == rows  # partition 4 only
    assert (driver.ledger.repeats, driver.ledger.elsewhere) == (1, 1)


def test_attempts_arriving_at_once_on_both_nodes_deliver_once(driver, nodes):
    rows = list(range(2000))
    acks: list[list[int]] = []
    tasks = [
        threading.Thread(target=lambda s=s: acks.append(list(feeder(s, "feed-b:0").train_rdd(0, iter(rows)))))
        for s in nodes * 3  # three attempts on each node, all racing
    ]
    for task in tasks:
        task.start()
    for task in tasks:
        task.join(30)
    assert acks == [[2000]] * 6
    got = [read_all(s) for s in nodes]
    assert sorted(len(g) for g in got) == [0, 2000] and rows in got
    assert driver.ledger.repeats == 5


def test_a_node_that_cannot_ask_the_driver_refuses_the_partition_naming_the_driver():
    (port,) = free_ports(1)  # nothing listens there: the driver is gone
    claims = DriverClaims(("127.0.0.1", port), SECRET, "worker:0", timeout=2)
    server = FeedServer(SECRET, buffer_bytes=4 * MB, ahead=None, claim=claims)
    try:
        with pytest.raises(FeedError, match=rf"could not ask the driver at 127\.0\.0\.1:{port}"):
            list(feeder(server, "feed-c:0").train_rdd(0, iter(range(10))))
        assert read_all(server) == []  # never delivered on a guess
    finally:
        server.close()


def test_a_claim_connection_the_driver_closed_is_opened_again(driver, nodes):
    first, _ = nodes
    assert list(feeder(first, "feed-d:0").train_rdd(0, iter(range(10)))) == [10]
    driver.ledger.close()  # the driver dropped the connection (it also refuses new ones now)
    driver.ledger._closed = False  # ... but a fresh one is served again
    assert list(feeder(first, "feed-d:0").train_rdd(1, iter(range(10)))) == [10]
    assert read_all(first) == list(range(10)) * 2
