"""The driver's ledger of delivered partitions: who delivered first, repeats counted, old feeds refused."""

from __future__ import annotations

from tfonspark.driver.nodes.ledger import FeedLedger
from tfonspark.wire import messages as m


def test_the_first_node_to_claim_a_partition_delivers_it_and_later_ones_learn_who_did():
    ledger = FeedLedger()
    assert ledger.claim("worker:0", "d:1", 5) == m.FeedClaimed(True, "worker:0")
    assert ledger.claim("worker:1", "d:1", 5) == m.FeedClaimed(False, "worker:0")
    assert ledger.claim("worker:0", "d:1", 5) == m.FeedClaimed(False, "worker:0")
    assert ledger.claim("worker:1", "d:2", 5).first  # another feed
    assert (ledger.repeats, ledger.elsewhere) == (2, 1)


def test_a_feed_too_old_to_know_is_refused_with_the_reason():
    ledger = FeedLedger()
    ledger.delivered.remembered = 2
    for n in range(4):
        assert ledger.claim("worker:0", f"d:{n}", 0).first
    old = ledger.claim("worker:1", "d:0", 0)
    assert not old.first and "older" in old.refusal and "delivered twice" in old.refusal
