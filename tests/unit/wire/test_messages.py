"""wire/messages.py: typed JSON messages, their round trip over a connection, and what decoding refuses."""

from __future__ import annotations

import os
import pickle
import shlex
from pathlib import Path

import pytest

from tfonspark.errors import ProtocolError
from tfonspark.wire import events as ev
from tfonspark.wire import messages as m


def _evil_payload(target: Path) -> bytes:
    """A pickle that runs ``touch target`` when (and only when) it is unpickled."""

    class Evil:
        def __reduce__(self):
            return os.system, (f"touch {shlex.quote(str(target))}",)

    return pickle.dumps(Evil())


EXAMPLES = [
    m.Register(executor_id=3, host="10.0.0.1", port=2222, executor_key="abcd", pid=42, cluster_id="c1"),
    m.ClusterReady(job_name="worker", task_index=1, cluster_spec={"ps": ["h:1"], "worker": ["h:2", "h:3"]}),
    m.Reject(reason="no such executor: ünïcødé"),
    m.Heartbeat(),
    ev.FeedStalled(feed_id="f1", partition=3, received=16, timeout=2.5, train=False),
    ev.Reported(metrics={"loss": 0.5, "step": 3, "tags": ["a"]}),
    ev.EpochRead(feed_id="f1", epoch=2),
    ev.ServerRestarted(restart=1, limit=3, exit_code=-9, down_s=7.3),
    ev.TaskExit(exit_code=-9, stopped=True, traceback="tb"),
    ev.FeedTerminated(),
    ev.FeedRefused(feed_id="f1", partition=2, reason="delivered already"),
    ev.FeedHeld(feed_id="f1", partition=5),
    ev.FeedStarved(qname="input", waited=31.5),
    ev.FeedWaiting(what="data", waited=30.0, setting="feed_timeout", feed_id="f1", partition=2),
    ev.FeedSocket(data_path="/tmp/tfos-feed-x/feed.sock"),
    ev.ProcessUp(host="10.0.0.7", data_port=5555, data_path="", tensorboard_url="http://x"),
    ev.ProcessError(traceback="Traceback (most recent call last):\n  ..."),
    ev.TaskUp(tf_pid=99),
    ev.TaskFailed(reason="stopped (SIGTERM) before the TF process started"),
    ev.TaskRejected(reason="executor id 7 is not part of this cluster"),
    m.NodeUp(
        executor_id=1,
        tf_pid=99,
        data_host="127.0.0.1",
        data_port=5000,
        tensorboard_url="http://x",
        data_path="/tmp/tfos-feed-x/feed.sock",
    ),
    m.NodeExit(executor_id=1, exit_code=-9, traceback="Traceback...\n", output_tail="tail", stopped=True),
    m.Stop(grace_secs=2.5),
    m.StopRequest(cluster_id="c1", reason="operator"),
    m.Ack(count=7),
    m.FeedStart(qname="input", train=False, partition=4, columns=["a", "b"]),
    m.FeedEnd(count=100),
    m.FeedClose(qname="input"),
    m.FeedRelease(qname="input", feed_id="f1", final=True),
    m.FeedClaim(node="worker:1", feed_id="f1", partition=2),
    m.FeedClaimed(first=False, owner="worker:0"),
    m.FeedClaimed(first=False, refusal="feed f0 ended before this node asked"),
    m.Terminate(),
    m.Pending(),
    m.ResultsEnd(count=100),
]


def test_examples_cover_every_message_type():
    assert {type(e) for e in EXAMPLES} == set(m._REGISTRY.values())


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda e: type(e).__name__)
def test_messages_round_trip(message):
    payload = m.encode(message)
    assert payload[:1] == m.JSON_KIND
    assert m.decode(payload) == message
    assert m.decode(memoryview(payload)) == message


def test_messages_round_trip_over_a_connection(pair):
    server, client = pair
    for message in EXAMPLES:
        m.send_message(client, message)
        assert m.recv_message(server) == message


def test_recv_message_enforces_the_expected_types(pair):
    server, client = pair
    m.send_message(client, m.Ack(1))
    with pytest.raises(ProtocolError, match="expected register, received ack"):
        m.recv_message(server, m.Register)
    m.send_message(client, m.Stop())
    assert isinstance(m.recv_message(server, m.Register, m.Stop), m.Stop)


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"Jnot json",
        b'J{"type":"no_such_type"}',
        b'J{"count":1}',  # no type
        b'J{"type":"ack","count":1,"admin":true}',  # unknown field
        b'J{"type":"feed_end"}',  # missing field
        b'J{"type":"","count":1}',  # the base class is not a message
        b'J{"type":["ack"]}',
        b"J[1, 2]",
        b'J"ack"',  # JSON that is not an object
        b"J1",
        b"J" + b"[" * 100_000 + b"]" * 100_000,  # nesting deep enough to blow the stack
        b"J\xff\xfe",  # not UTF-8
        b'B{"type":"ack"}',  # a batch frame where a message belongs
        b'{"type":"ack","count":1}',  # no kind byte
    ],
    ids=repr,
)
def test_decode_rejects_malformed_messages(payload):
    with pytest.raises(ProtocolError):
        m.decode(payload)


def test_decode_never_unpickles(tmp_path):
    live = tmp_path / "proof-the-payload-is-live"
    pickle.loads(_evil_payload(live))  # the gadget really runs code when unpickled ...
    assert live.exists()

    target = tmp_path / "pwned"
    evil = _evil_payload(target)
    for payload in (evil, b"J" + evil, b"B" + evil, memoryview(evil)):
        with pytest.raises(ProtocolError):
            m.decode(payload)
    assert not target.exists()  # ... but decode never unpickles it


def test_recv_message_never_unpickles(pair, tmp_path):
    server, client = pair
    target = tmp_path / "pwned"
    client.send(_evil_payload(target))  # an authenticated peer, still no pickle on the control plane
    with pytest.raises(ProtocolError):
        m.recv_message(server)
    assert not target.exists()
