"""The TF process's data server: feed tasks connect here and stream columnar batches in.

Each connection carries one partition (``FeedStart`` .. batches .. ``FeedEnd``), a
:class:`Stream`. Batches go into a per-queue buffer bounded in bytes (:mod:`.feedqueue`): when
it is full the receiving thread stops reading, TCP flow control stalls the sender, and memory
stays bounded whatever the partition size. A training partition is delivered once
(:mod:`.delivered` remembers which were) and its Ack is paced to map_fun's reading, here. For
inference the connection stays open and results flow back on it, in order. Every wait runs
inside :class:`~.feedwaits.Waits`, which tells the driver of long ones.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable

from ..errors import FeedError, ProtocolError
from ..settings import (
    DEFAULT_FEED_BUFFER_BYTES,
    FEED_FIRST_MESSAGE_SECS,
    feed_hold_limit,
    pace_interval,
    pace_quiet_limit,
)
from ..wire import events as ev
from ..wire import messages as m
from ..wire.buffers import RecvBuffers
from ..wire.codec import BATCH_KIND, ColumnBatch, batch_count, decode_batch, encode_batch
from ..wire.framing import Connection, listen_unix, remove_unix_socket
from ..wire.listener import Listener
from .delivered import Delivered
from .feedclaims import Claim
from .feedqueue import END_FEED, ByteQueue, ConsumerStalled, EpochMark, Staging
from .feedwaits import Waits

__all__ = ["PARTITIONS_AHEAD", "FeedServer", "Stream"]

log = logging.getLogger(__name__)
#: of how many recent feeds the driver's releases of held Acks are remembered (``FeedRelease``)
_REMEMBERED_RELEASES = 64
#: a training partition's Ack waits until map_fun has read every partition committed before
#: it (the feeder is told Pending while map_fun reads, so it never times out on it). The driver
#: releases held Acks once holding can only stall: every partition of the feed has been handed
#: to a task (no core left to keep free), or another data node starves while map_fun here may
#: be waiting for it in a collective; after half of feed_timeout in which map_fun read nothing
#: the Ack goes anyway (settings.pace_quiet_limit). The feed task holds
#: its Spark core meanwhile, as TFoS's did until its partition was consumed, so the nodes take
#: partitions as fast as each reads them: a node whose executor frees first does not get more.
#: MultiWorkerMirrored programs that derive their steps from rows / num_workers (every TFoS
#: example) need that split; a starved node is handed empty batches. One partition stays
#: queued beyond the one being read, so map_fun does not wait for the next feed task.
PARTITIONS_AHEAD = 1


class Stream:
    """One partition attempt arriving over one connection."""

    def __init__(self, conn: Connection, start: m.FeedStart) -> None:
        self.conn = conn
        self.qname = start.qname
        self.partition = start.partition
        self.train = start.train
        self.columns = start.columns
        self.timeout = float(start.timeout)
        #: names the partition across attempts; "" (an old feeder) means no de-duplication
        self.key = (start.feed_id, start.partition) if start.feed_id else None
        self.received = 0
        self.answered = 0
        self.ended = False
        self.committed = False  # a training partition handed to the queue (no longer arriving)
        self.closed = threading.Event()
        self._lock = threading.Lock()

    def end(self) -> None:
        """Every row has arrived (``FeedServer._end`` checked the count)."""
        with self._lock:
            self.ended = True
        self.maybe_finish()

    def answer(self, results: ColumnBatch) -> None:
        """Send results back to the feeder of this partition (within the feed's timeout)."""
        if self.closed.is_set():
            return  # the feeder is gone; Spark reports or retries its task
        try:
            self.conn.send(*encode_batch(results))
        except OSError as exc:
            # the feed task failed, was cancelled, its executor died, or it stopped reading for
            # feed_timeout; map_fun must keep serving the other partitions
            log.warning(
                "feed server: results for partition %s dropped, its feeder is gone or stopped reading for %.0fs (%s)",
                self.partition,
                self.timeout,
                exc,
            )
            self.abandon()
            return
        with self._lock:
            self.answered += results.count
        self.maybe_finish()

    def abandon(self) -> None:
        """The feeder is gone: drop what is left of this attempt (see ``DataFeed``)."""
        self.closed.set()
        self.conn.close()

    def maybe_finish(self) -> None:
        """After the last result of an inference partition, tell the feeder and close."""
        with self._lock:
            done = not self.train and self.ended and self.answered == self.received
            if not done or self.closed.is_set():
                return
            self.closed.set()
        try:
            m.send_message(self.conn, m.ResultsEnd(self.answered))
        except OSError:
            pass
        finally:
            self.conn.close()  # the partition is complete; nothing more travels on it


class FeedServer:
    """Accepts authenticated feed connections and fills one ByteQueue per queue name.

    It listens on TCP (signed frames, for feeders on other executors) and, where the platform
    allows, on a Unix socket in a private directory (``unix_path``; unsigned frames after the
    handshake, for feeders on this executor: see :mod:`..wire.framing`).

    Training partitions are delivered exactly once per partition: a partition's rows reach the
    queue only when its end marker arrived, and only the first complete attempt of a partition
    (``feed_id``, ``partition``) is kept; a retried or speculative attempt of a partition that
    was already delivered is read and dropped, then acknowledged.

    What was delivered is kept by :class:`Delivered` in bounded memory; an attempt of a feed
    too old for it to know is read, dropped and refused (``Reject``: the feeder raises
    ``FeedError``), never delivered a second time.
    """

    def __init__(
        self,
        secret: bytes,
        buffer_bytes: int = DEFAULT_FEED_BUFFER_BYTES,
        host: str = "127.0.0.1",
        on_event: Callable[[ev.NodeEvent], None] | None = None,
        ahead: int | None = PARTITIONS_AHEAD,
        claim: Claim | None = None,
    ) -> None:
        self.secret = secret
        #: the driver's ledger of delivered partitions (:mod:`.feedclaims`), asked before a
        #: training partition is committed; None: this node's own memory (:attr:`delivered`)
        self.claim = claim
        self.buffer_bytes = buffer_bytes
        self.ahead = ahead  # None: acknowledge partitions on arrival (tests that read afterwards)
        self.on_event = on_event or (lambda event: None)
        self.terminated = False
        self._queues: dict[str, ByteQueue] = {}
        self._streams: set[Stream] = set()
        self.delivered = Delivered()  # partitions delivered, by feed
        self.waits = Waits(self.on_event)  # the feed's waits here; long ones are told to the driver
        # the driver's releases of held Acks (FeedRelease), by feed: how many, and the final ones
        self._releases: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._final: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._lock = threading.Lock()
        # frame memory is reused once consumed; the pool holds the queue's bytes + frames in flight
        self._buffers = RecvBuffers(buffer_bytes + 8 * 1024 * 1024)
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        from ..ports import bind_within  # the first free port of this TF process's port_range, else any

        bind_within(sock, host, "the feed server")
        sock.listen(256)
        name = sock.getsockname()
        self.address: tuple[str, int] = (str(name[0]), int(name[1]))
        self.port = self.address[1]
        unix = listen_unix("tfos-feed-")
        self.unix_path = unix.getsockname() if unix is not None else ""
        # feeders on other executors: signed TCP; on this executor: the private Unix socket
        self._listeners = [Listener(sock, secret, self._serve, name="tfos-feed")]
        if unix is not None:
            self._listeners.append(Listener(unix, secret, self._serve, signed=False, name="tfos-feed-unix"))

    def queue(self, qname: str) -> ByteQueue:
        with self._lock:
            if qname not in self._queues:
                self._queues[qname] = ByteQueue(self.buffer_bytes)
            return self._queues[qname]

    def _serve(self, conn: Connection) -> bool:
        """Serve one authenticated connection; True if it must stay open (inference results)."""
        conn.buffers = self._buffers
        try:
            conn.settimeout(FEED_FIRST_MESSAGE_SECS)
            msg = m.recv_message(conn, m.FeedStart, m.FeedClose, m.FeedRelease)
            if isinstance(msg, m.FeedRelease):
                self.release(msg)
                m.send_message(conn, m.Ack())
                return False
            if isinstance(msg, m.FeedClose):
                mark = EpochMark(msg.feed_id, msg.epoch) if msg.epoch >= 0 else END_FEED
                self.queue(msg.qname).put(None, mark)
                m.send_message(conn, m.Ack())
                return False
            assert isinstance(msg, m.FeedStart)
            conn.settimeout(msg.timeout)  # every later read and send waits at most feed_timeout
            return self._receive(conn, msg)
        except ConsumerStalled:
            return False  # the feeder times out too and names this node (FeedTimeout)
        except (OSError, ProtocolError) as exc:
            log.warning("feed server: feed connection failed: %s", exc)
            return False

    def _receive(self, conn: Connection, start: m.FeedStart) -> bool:
        """Read one partition; True if the connection must stay open for results."""
        stream = Stream(conn, start)
        queue = self.queue(start.qname)
        with self._lock:
            # streams stay here until done, so terminate() reaches their feeders
            self._streams = {s for s in self._streams if not s.closed.is_set()}
            self._streams.add(stream)
        keep_open = False
        try:
            keep_open = self._receive_train(stream, queue) if start.train else self._receive_inference(stream, queue)
            return keep_open
        except TimeoutError as exc:
            if isinstance(exc, ConsumerStalled):
                raise
            self._stalled(stream)
            return False
        finally:
            if not keep_open:
                stream.closed.set()  # an inference attempt cut short: DataFeed skips its rows
                with self._lock:
                    self._streams.discard(stream)

    def _read_partition(self, stream: Stream, take: Callable[[memoryview], bool]) -> int | None:
        """Frames of one partition until its end marker, each batch to ``take``; the row count,
        or None once the feed was terminated (``take`` returning False means the same)."""
        while True:
            payload = stream.conn.recv()
            if self.terminated:
                self._drain(stream, payload)
                return None
            if bytes(payload[:1]) != BATCH_KIND:
                return self._end(stream, payload)
            if not take(payload):
                self._drain(stream, None)
                return None

    def _receive_train(self, stream: Stream, queue: ByteQueue) -> bool:
        staging = Staging(queue, self._buffers)
        limit = feed_hold_limit(stream.timeout)  # derived from feed_timeout (settings)

        def take(payload: memoryview) -> bool:
            stream.received += batch_count(payload)
            with self._room_wait(stream, limit):
                return staging.add(payload, limit)

        try:
            try:
                count = self._read_partition(stream, take)
                if count is None:
                    return False
                first = self._first_delivery(stream)
            except FeedError as refused:  # rows lost on the way, or a feed too old to know
                self._refuse(stream, refused)
                return False
            if first and staging.commit(stream):
                stream.committed = True
                if self.ahead is not None:
                    self._pace(stream, queue, self.ahead)
                if self.terminated:  # terminate() came while this waited: tell the feeder from
                    # here too, as _stop_taking may find this stream already closed by then
                    self._send_terminate(stream)
                    return False
            m.send_message(stream.conn, m.Ack(count))
            return False
        finally:
            staging.discard()

    def _pace(self, stream: Stream, queue: ByteQueue, ahead: int) -> None:
        """Hold a committed partition's Ack until map_fun has read all but ``ahead`` of the
        partitions committed before it, so that feed tasks keep pace with map_fun and the nodes
        share partitions as they read them.

        While map_fun reads rows the feeder is told ``Pending`` every quarter of
        ``feed_timeout`` (its wait for the Ack starts over), however slow its steps. The hold
        ends early when the driver releases it (:meth:`release`): holding a feed task's core only
        helps while the feed has partitions left for other executors to take, and must never
        keep a starving node's partitions from running while map_fun here waits for that node
        in a collective. Once map_fun has read nothing for half of ``feed_timeout`` the Ack goes
        anyway (a stalled map_fun is caught by the waits that detect stalls, not here).
        """
        feed_id = stream.key[0] if stream.key else ""
        if queue.partitions <= ahead or self._released(feed_id, None):
            return
        interval, quiet = pace_interval(stream.timeout), pace_quiet_limit(stream.timeout)
        releases = self._releases_of(feed_id)
        self.on_event(ev.FeedHeld(feed_id, stream.partition))
        what = (
            f"map_fun to read the partitions queued before partition {stream.partition}, whose Ack is held "
            "to pace the feed (map_fun reads nothing: is it waiting for another node in a collective?)"
        )
        setting = f"feed_timeout={stream.timeout:.0f}s: the Ack goes after feed_timeout/2 = {quiet:.0f}s without a read"
        with self.waits.waiting(what, setting, feed_id=feed_id, partition=stream.partition):
            reads, progress = queue.reads, time.monotonic()
            while not queue.wait_behind(ahead, interval, lambda: self.terminated or self._released(feed_id, releases)):
                now = time.monotonic()
                if queue.reads != reads:
                    reads, progress = queue.reads, now
                if now - progress >= quiet:
                    log.warning(
                        "feed server: partition %s: map_fun read nothing for %.0fs (feed_timeout/2); "
                        "its Ack goes without waiting further",
                        stream.partition,
                        quiet,
                    )
                    return
                m.send_message(stream.conn, m.Pending())

    def release(self, msg: m.FeedRelease) -> None:
        """The driver releases the Acks held for ``msg.feed_id`` (all of this feed's, if final)."""
        with self._lock:
            self._releases[msg.feed_id] = self._releases.pop(msg.feed_id, 0) + 1
            if msg.final:
                self._final[msg.feed_id] = None
            for remembered in (self._releases, self._final):
                while len(remembered) > _REMEMBERED_RELEASES:
                    remembered.popitem(last=False)
            queue = self._queues.get(msg.qname)
        if queue is not None:
            queue.wake()

    def _releases_of(self, feed_id: str) -> int:
        with self._lock:
            return self._releases.get(feed_id, 0)

    def _released(self, feed_id: str, since: int | None) -> bool:
        """True if the driver released ``feed_id`` for good, or (``since``: the count of its
        releases when the hold began) released its held Acks since."""
        with self._lock:
            if feed_id in self._final:
                return True
            return since is not None and self._releases.get(feed_id, 0) != since

    def _room_wait(self, stream: Stream, limit: float) -> contextlib.AbstractContextManager[None]:
        """A feeder's wait for room in the feed buffer, told to the driver if it lasts."""
        return self.waits.waiting(
            f"room in the feed buffer for partition {stream.partition} (map_fun is not reading what is queued)",
            f"feed_buffer_bytes={self.buffer_bytes} and feed_timeout={stream.timeout:.0f}s: the partition is "
            f"dropped after {limit:.0f}s, once its feeder has raised FeedTimeout",
            feed_id=stream.key[0] if stream.key else "",
            partition=stream.partition,
        )

    def receiving(self, qname: str) -> bool:
        """True while a training partition for ``qname`` is arriving (not yet committed)."""
        with self._lock:
            return any(
                s.train and s.qname == qname and not s.committed and not s.closed.is_set() for s in self._streams
            )

    def _receive_inference(self, stream: Stream, queue: ByteQueue) -> bool:
        limit = feed_hold_limit(stream.timeout)  # derived from feed_timeout (settings)

        def take(payload: memoryview) -> bool:
            batch = decode_batch(payload)
            stream.received += batch.count
            with self._room_wait(stream, limit):
                return queue.put(stream, batch, len(payload), limit)

        try:
            if self._read_partition(stream, take) is None:
                return False
        except FeedError as refused:  # rows lost on the way: the batches queued are skipped
            self._refuse(stream, refused)
            return False
        queue.put(stream, None)  # partition boundary marker
        stream.end()
        return True

    @staticmethod
    def _end(stream: Stream, payload: memoryview) -> int:
        """The partition's end marker: its row count (the rows the feed task took from Spark)
        must match what arrived, else ``FeedError``: rows were lost, never silently."""
        end = m.decode(payload)
        if not isinstance(end, m.FeedEnd):
            raise ProtocolError(f"expected a batch or feed_end, received {end.TYPE}")
        if end.count != stream.received:
            raise FeedError(
                f"partition {stream.partition}: its feed task took {end.count} rows from Spark, but "
                f"{stream.received} arrived; the partition was dropped (a packing error lost rows)"
            )
        return end.count

    def _first_delivery(self, stream: Stream) -> bool:
        """True for the first complete attempt of a partition, on any node; later ones are
        dropped (False). ``FeedError`` for an attempt of a feed too old to know (see
        :class:`Delivered`), or when the driver, which knows what every node delivered
        (:attr:`claim`), cannot be asked."""
        if stream.key is None:
            return True
        if self.claim is not None:
            owner = self.claim(*stream.key)  # a round trip to the driver, outside the lock
        else:
            with self._lock:
                owner = self.delivered.claim(*stream.key)
        if owner is not None:
            log.info(
                "feed server: partition %s was already delivered%s; dropped a repeated "
                "attempt (a Spark retry or speculative task)",
                stream.partition,
                f" by {owner}" if owner else "",
            )
        return owner is None

    def _refuse(self, stream: Stream, refused: FeedError) -> None:
        """Tell the feeder (and the driver) why its partition was dropped."""
        log.warning("feed server: %s", refused)
        stream.closed.set()  # an inference attempt's queued rows are skipped (DataFeed)
        self.on_event(ev.FeedRefused(stream.key[0] if stream.key else "", stream.partition, str(refused)))
        m.send_message(stream.conn, m.Reject(str(refused)))

    def _stalled(self, stream: Stream) -> None:
        """A feeder sent nothing for its feed_timeout: drop its attempt and tell the driver."""
        log.warning(
            "feed server: partition %s: the feeder sent nothing for feed_timeout=%.0fs; its rows were dropped",
            stream.partition,
            stream.timeout,
        )
        feed_id = stream.key[0] if stream.key else ""
        self.on_event(ev.FeedStalled(feed_id, stream.partition, stream.received, stream.timeout, stream.train))

    @staticmethod
    def _drain(stream: Stream, payload: memoryview | None) -> None:
        """After terminate(): tell the feeder to stop, discard what it already sent."""
        try:
            m.send_message(stream.conn, m.Terminate())
            while payload is None or bytes(payload[:1]) == BATCH_KIND:
                payload = stream.conn.recv()
        except (OSError, ProtocolError):
            pass

    def terminate(self) -> None:
        """Stop accepting data: queued batches are dropped, feeders told to stop sending.

        The driver hears of it (``feed_terminated``): it stops feeding epochs and micro-batches
        once every data node has terminated, as once every one has exited.
        """
        if not self.terminated:
            self.on_event(ev.FeedTerminated())
        self._stop_taking()

    @staticmethod
    def _send_terminate(stream: Stream) -> None:
        """Tell the stream's feeder to stop; one already gone is no error. The feeder reads one
        Terminate and closes: a second, from another thread, goes unread."""
        with contextlib.suppress(OSError):
            m.send_message(stream.conn, m.Terminate())

    def _stop_taking(self) -> None:
        self.terminated = True
        with self._lock:
            queues = list(self._queues.values())
            streams = [s for s in self._streams if not s.closed.is_set()]
        for q in queues:
            q.abort()
        for stream in streams:
            self._send_terminate(stream)

    def close(self) -> None:
        """Stop taking data and close every connection; remove the Unix socket's directory."""
        self._stop_taking()  # the node is going: its exit tells the driver
        self.waits.close()
        for listener in self._listeners:
            listener.close()
        with self._lock:
            streams = list(self._streams)
        for stream in streams:
            stream.conn.close()
        remove_unix_socket(self.unix_path)
