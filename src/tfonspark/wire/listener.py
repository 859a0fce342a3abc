"""The one accept loop every tfonspark server runs: authenticates peers, survives floods.

One thread accepts connections and runs the server side of the handshake (see
:mod:`.framing`) for all of them at once, non-blocking, from one selector: an unauthenticated
peer costs a socket, never a thread. Each handshake has one deadline, counted from accept, so
a peer trickling a byte every few seconds is dropped when it passes. At most ``max_pending``
peers may be mid-handshake; a newcomer beyond that evicts the oldest (a real client finishes in
about a millisecond, a flood's idle sockets do not). When accept() itself fails (out of file
descriptors, buffers or memory) the oldest pending peer is evicted to make room, or accepting
pauses with a growing back-off; the loop only ends with :meth:`Listener.close`. A peer is
evicted only once it has been pending for 50 ms: meanwhile new connections wait in the
kernel's backlog, so a flood can evict at most ``max_pending / 50 ms`` peers a second.

Authenticated connections, at most ``max_connections`` at a time, each run ``handler(conn)``
in a thread of their own.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable

from ..errors import ProtocolError
from .framing import (
    CLIENT_HELLO,
    DEFAULT_MAX_FRAME,
    Connection,
    ServerHandshake,
    prepare_server_socket,
)

__all__ = ["Listener"]

log = logging.getLogger(__name__)

#: accept() failed for want of a resource: evict a pending peer or back off
_RESOURCE_ERRORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
#: accept() failed for that one connection only: carry on with the next
_PEER_ERRORS = frozenset(
    {
        errno.ECONNABORTED,
        errno.ECONNRESET,
        errno.EPROTO,
        errno.EPERM,
        errno.ENETDOWN,
        errno.ENETUNREACH,
        errno.EHOSTUNREACH,
        errno.ETIMEDOUT,
    }
)
_ACCEPT_BATCH = 64  # accepts per loop turn, so handshakes in progress are served in between
_MIN_BACKOFF = 0.01
_MAX_BACKOFF = 1.0
_EVICT_GRACE = 0.05  # a pending peer is evicted only after this long (its chance to answer)
_JOIN_SECS = 2.0  # how long close() waits for the threads it stops
_WARN_EVERY = 10.0  # seconds between two warnings of one kind
_ACCEPT = "accept"
_WAKE = "wake"


class _Throttle:
    """Log a warning of each kind at most once per interval, counting the ones held back."""

    def __init__(self, interval: float = _WARN_EVERY) -> None:
        self._interval = interval
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    def warn(self, kind: str, message: str, *args: object, exc_info: bool = False) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._last.get(kind, -self._interval) < self._interval:
                self._held[kind] = self._held.get(kind, 0) + 1
                return
            self._last[kind] = now
            held = self._held.pop(kind, 0)
        suffix = f" ({held} more like it in the last {self._interval:g}s)" if held else ""
        log.warning(message + suffix, *args, exc_info=exc_info)


class _Pending:
    """One peer mid-handshake: what is left to send, what it has sent so far."""

    __slots__ = ("answered", "born", "deadline", "got", "handshake", "mask", "out", "sock")

    def __init__(self, sock: socket.socket, handshake: ServerHandshake, born: float, deadline: float) -> None:
        self.sock = sock
        self.handshake = handshake
        self.born = born
        self.deadline = deadline
        self.out = memoryview(handshake.hello)
        self.got = bytearray()
        self.answered = False
        self.mask = selectors.EVENT_READ


class Listener:
    """Accepts, authenticates and hands over connections on ``sock`` (bound and listening).

    ``handler(conn)`` runs in its own daemon thread per authenticated connection; when it
    returns False or raises, the connection is closed; True keeps it open (the handler closes
    it later), and :meth:`close` still closes it. ``rejected`` counts peers dropped before or
    at authentication (failed, timed out, evicted); ``dropped`` authenticated connections closed
    at once (``max_connections`` reached, or no thread could be started for them).
    """

    def __init__(
        self,
        sock: socket.socket,
        secret: bytes,
        handler: Callable[[Connection], bool],
        *,
        signed: bool = True,
        max_frame: int = DEFAULT_MAX_FRAME,
        handshake_timeout: float = 10.0,
        max_pending: int = 128,
        max_connections: int = 1024,
        name: str = "tfos-listener",
    ) -> None:
        self.name = name
        self.signed = signed
        self.max_frame = max_frame
        self.handshake_timeout = handshake_timeout
        self.max_pending = max(1, max_pending)
        self.max_connections = max(1, max_connections)
        self.rejected = 0
        self.dropped = 0
        self._secret = secret
        self._handler = handler
        self._sock = sock
        self._pending: dict[_Pending, None] = {}  # insertion order: oldest (earliest deadline) first
        self._live: set[Connection] = set()
        self._handlers: set[threading.Thread] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._backoff = 0.0
        self._resume_at: float | None = None
        self._throttle = _Throttle()
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        for s in (sock, self._wake_r, self._wake_w):
            s.setblocking(False)
        self._selector.register(sock, selectors.EVENT_READ, _ACCEPT)
        self._selector.register(self._wake_r, selectors.EVENT_READ, _WAKE)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # ---- the loop -------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._closed:
                try:
                    self._turn()
                except Exception:  # a bug here must not end the loop for good
                    self._throttle.warn("loop", "%s: accept loop error", self.name, exc_info=True)
                    time.sleep(_MIN_BACKOFF)
        finally:
            for p in list(self._pending):
                self._forget(p)
                p.sock.close()
            self._selector.close()

    def _turn(self) -> None:
        for key, _ in self._selector.select(self._wait_time()):
            if key.data is _ACCEPT:
                self._accept_some()
            elif key.data is _WAKE:
                with contextlib.suppress(OSError):
                    self._wake_r.recv(4096)
            elif key.data in self._pending:  # (it may have been evicted earlier in this turn)
                self._advance(key.data)
        now = time.monotonic()
        while self._pending and next(iter(self._pending)).deadline <= now:
            self._drop(next(iter(self._pending)), "handshake not completed in time")
        if self._resume_at is not None and now >= self._resume_at and not self._closed:
            self._resume()

    def _resume(self) -> None:
        """Accept again after a pause, first evicting a peer admitted over the cap."""
        self._resume_at = None
        if self._make_room("too many mid-handshake", self.max_pending + 1):
            self._selector.register(self._sock, selectors.EVENT_READ, _ACCEPT)

    def _wait_time(self) -> float | None:
        """Until the oldest handshake's deadline or the end of an accept back-off."""
        times = [next(iter(self._pending)).deadline] if self._pending else []
        if self._resume_at is not None:
            times.append(self._resume_at)
        return max(0.0, min(times) - time.monotonic()) if times else None

    # ---- accepting ------------------------------------------------------------------------
    def _accept_some(self) -> None:
        for _ in range(_ACCEPT_BATCH):
            try:
                sock, _ = self._sock.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if self._accept_failed(exc):
                    continue
                return
            self._backoff = 0.0
            room = self._make_room("too many mid-handshake", self.max_pending)
            self._admit(sock)  # (one over the cap while accepting pauses for the oldest's grace)
            if not room:
                return

    def _accept_failed(self, exc: OSError) -> bool:
        """Deal with a failed accept(); True to go on accepting in this turn."""
        if self._closed:
            return False
        if exc.errno in _PEER_ERRORS:
            return True
        self._throttle.warn(
            "accept", "%s: accept() failed (%s); evicting the oldest pending connection or backing off", self.name, exc
        )
        if exc.errno in _RESOURCE_ERRORS and self._pending:
            self._make_room("out of file descriptors", len(self._pending))
            return False  # serve the handshakes in progress, then accept into the room made
        self._pause(self._backoff_secs())
        return False

    def _make_room(self, why: str, below: int) -> bool:
        """Evict the oldest pending peers until fewer than ``below`` are left; False if one is too young.

        A peer is evicted only after a grace period: a real client answers within milliseconds,
        but a loaded host may take longer, and without it a fast enough flood would evict every
        client before it could answer. Accepting pauses until the grace ends.
        """
        while len(self._pending) >= below:
            oldest = next(iter(self._pending))
            grace_left = oldest.born + _EVICT_GRACE - time.monotonic()
            if grace_left > 0:
                self._pause(grace_left)
                return False
            self._drop(oldest, f"evicted ({why})")
        return True

    def _backoff_secs(self) -> float:
        """A back-off that doubles while accept keeps failing."""
        self._backoff = min(max(2 * self._backoff, _MIN_BACKOFF), _MAX_BACKOFF)
        return self._backoff

    def _pause(self, secs: float) -> None:
        """Stop accepting for ``secs``: new connections wait in the kernel's backlog meanwhile."""
        self._resume_at = time.monotonic() + secs
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(self._sock)

    def _admit(self, sock: socket.socket) -> None:
        """Start the handshake of a freshly accepted peer."""
        now = time.monotonic()
        try:
            sock.setblocking(False)
            prepare_server_socket(sock, self.signed)
            p = _Pending(sock, ServerHandshake(self._secret, self.signed), now, now + self.handshake_timeout)
            self._selector.register(sock, p.mask, p)
        except (OSError, ValueError) as exc:
            self.rejected += 1
            sock.close()
            self._throttle.warn("admit", "%s: could not watch a new connection (%s)", self.name, exc)
            return
        self._pending[p] = None
        self._advance(p)  # the server speaks first: send the hello at once

    # ---- handshakes -----------------------------------------------------------------------
    def _advance(self, p: _Pending) -> None:
        try:
            done = self._step(p)
        except (OSError, ProtocolError) as exc:
            self._drop(p, f"failed authentication ({type(exc).__name__})")
            return
        if done:
            self._authenticated(p)
            return
        mask = selectors.EVENT_WRITE if p.out else selectors.EVENT_READ
        if mask != p.mask:
            p.mask = mask
            self._selector.modify(p.sock, mask, p)

    @staticmethod
    def _step(p: _Pending) -> bool:
        """Move one handshake on as far as the socket allows; True once the proof has gone out."""
        try:
            if p.out:
                p.out = p.out[p.sock.send(p.out) :]
                if p.out:
                    return False
            if p.answered:
                return True
            chunk = p.sock.recv(CLIENT_HELLO - len(p.got))
        except (BlockingIOError, InterruptedError):
            return False
        if not chunk:
            raise ConnectionResetError("peer closed the connection during the handshake")
        p.got += chunk
        if len(p.got) < CLIENT_HELLO:
            return False
        p.out = memoryview(p.handshake.answer(p.got))
        p.answered = True
        return Listener._step(p)

    def _forget(self, p: _Pending) -> None:
        self._pending.pop(p, None)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(p.sock)

    def _drop(self, p: _Pending, why: str) -> None:
        self._forget(p)
        self.rejected += 1
        p.sock.close()
        self._throttle.warn(why, "%s: dropped a connection mid-handshake: %s", self.name, why)

    def _authenticated(self, p: _Pending) -> None:
        self._forget(p)
        try:
            p.sock.setblocking(True)
            conn = p.handshake.connection(p.sock, self.max_frame)
        except (OSError, ProtocolError):
            self.rejected += 1
            p.sock.close()
            return
        self._hand_over(conn)

    # ---- authenticated connections ----------------------------------------------------------
    def _hand_over(self, conn: Connection) -> None:
        """Run the handler for ``conn`` in a thread of its own, if the limits allow."""
        thread = threading.Thread(target=self._handle, args=(conn,), daemon=True, name=f"{self.name}-conn")
        with self._lock:
            if len(self._live) >= self.max_connections:
                self._live = {c for c in self._live if not c.closed}
            admitted = not self._closed and len(self._live) < self.max_connections
            if admitted:
                self._live.add(conn)
                self._handlers.add(thread)
        if not admitted:
            self._refuse(conn, None, "connection limit reached")
            return
        try:
            thread.start()
        except RuntimeError as exc:  # out of threads (or memory for a stack)
            self._refuse(conn, thread, f"no thread could be started for it ({exc})")
            self._pause(self._backoff_secs())

    def _refuse(self, conn: Connection, thread: threading.Thread | None, why: str) -> None:
        with self._lock:
            self._live.discard(conn)
            if thread is not None:
                self._handlers.discard(thread)
        if not self._closed:
            self.dropped += 1
            self._throttle.warn(why, "%s: closed an authenticated connection: %s", self.name, why)
        conn.close()

    def _handle(self, conn: Connection) -> None:
        keep = False
        try:
            keep = bool(self._handler(conn))
        except Exception as exc:
            self._throttle.warn(
                "handler", "%s: connection handler failed (%s)", self.name, type(exc).__name__, exc_info=True
            )
        finally:
            if not keep:
                conn.close()
            with self._lock:
                if not keep:
                    self._live.discard(conn)
                self._handlers.discard(threading.current_thread())

    # ---- closing ----------------------------------------------------------------------------
    def close(self) -> None:
        """Stop accepting; close the listening socket, every pending and every handed-out connection."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            live, self._live = self._live, set()
            handlers = set(self._handlers)
        with contextlib.suppress(OSError):  # wakes a blocked accept, refuses new connects
            self._sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")
        me = threading.current_thread()
        if self._thread is not me:
            self._thread.join(_JOIN_SECS)
        for s in (self._sock, self._wake_r, self._wake_w):
            s.close()
        for conn in live:
            conn.close()
        deadline = time.monotonic() + _JOIN_SECS
        for t in handlers - {me}:
            t.join(max(0.0, deadline - time.monotonic()))
