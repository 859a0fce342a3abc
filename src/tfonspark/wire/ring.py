"""Shared memory for large frames between two processes of one host (a feed task and its node).

Over a Unix socket every frame is copied twice by the kernel: into the socket by ``send``, out
of it by ``recv``; for a feed of 784-float rows that was ~3.5 CPU us a row of the ~10 the feed
adds to what Spark itself spends. Instead, the sender copies a large payload into a ring of
memory both processes map, and sends only its place (``F`` below); the receiver copies it out
into its own buffer, exactly where ``recv`` would have put it, and tells the sender the place
is free again (``R``). Everything above the connection is unchanged.

The ring is a sealed ``memfd`` (Linux): it has no name, so only the process it is passed to
(over the authenticated socket, ``SCM_RIGHTS``) can map it, and it cannot shrink under the
receiver (a read past its end would kill the receiver with SIGBUS). Control frames have the top
bit of the length set::

    O capacity id   sender -> receiver, with the memfd: the ring to map (``id``: random, the
                    same for every offer of one ring, so the receiver may keep its mapping)
    F position len  sender -> receiver: a payload at byte ``position`` (counted since the
                    offer; its offset in the ring is ``position % capacity``)
    R end           receiver -> sender: every payload before byte ``end`` is copied out

A payload that does not fit before the ring's end starts at the next turn; the bytes skipped
are freed with it.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import stat
import struct
import threading
from collections import OrderedDict
from typing import Any

from ..errors import ProtocolError

try:
    import fcntl
except ImportError:  # not a POSIX platform: frames go over the socket
    fcntl: Any = None  # type: ignore[no-redef]

__all__ = ["BODY", "FLAG", "RecvRing", "SendRing", "control", "kept_bytes", "return_send_ring", "take_send_ring"]

FLAG = 0x80000000  # in a frame's length: a control frame of the ring
BODY = struct.Struct(">cQQ")  # a control frame's payload: kind, two numbers
MAX_POSITION = 2**64 - 1  # the largest number a control frame holds: every end must be at most this
#: payloads at least this large go through the ring; smaller ones are cheaper on the socket
MIN_PAYLOAD = 64 * 1024
#: three 4 MB feed frames in flight: the sender rarely waits for the receiver's ``R``
CAPACITY = 13 * 1024 * 1024
#: the largest ring a receiver maps (each open connection maps at most one): ``CAPACITY`` and a margin
MAX_CAPACITY = 16 * 1024 * 1024
_ALIGN = 64  # payloads start on a cache line
#: mappings a receiver keeps for the next offer of the same ring: a feeder's Python worker offers
#: its ring again on every connection (one a partition), and mapping 13 MB (``MAP_POPULATE``)
#: then unmapping it was ~10% of a TF process's CPU on a feed of MNIST rows. Only rings of
#: ``CAPACITY`` (what :func:`take_send_ring` makes) are kept, the latest ``KEPT_MAPPINGS``
#: within ``KEPT_BYTES``: a peer offering ring after ring leaves at most that much mapped.
KEPT_MAPPINGS = 4
#: the most bytes of kept mappings (their pages stay resident: ``MAP_POPULATE``)
KEPT_BYTES = 64 * 1024 * 1024
_SEALS = ("F_SEAL_SHRINK", "F_SEAL_GROW", "F_SEAL_SEAL")


def control(kind: bytes, first: int, second: int = 0) -> bytes:
    """One control frame."""
    return struct.pack(">I", FLAG | BODY.size) + BODY.pack(kind, first, second)


def supported() -> bool:
    """Sealed memfds exist here (Linux); elsewhere frames go over the socket."""
    return (
        fcntl is not None
        and hasattr(os, "memfd_create")
        and all(hasattr(fcntl, s) for s in (*_SEALS, "F_ADD_SEALS", "F_GET_SEALS"))
    )


class SendRing:
    """The sender's side: a sealed memfd mapped read-write, and where its payloads go."""

    def __init__(self, capacity: int | None = None) -> None:
        capacity = capacity or CAPACITY
        fd = os.memfd_create("tfonspark-feed", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, capacity)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            self.map = mmap.mmap(fd, capacity)
        except BaseException:
            os.close(fd)
            raise
        self.fd, self.capacity = fd, capacity
        self.ident = 1 + secrets.randbelow(2**63)  # names this ring in every offer (``O``)
        self.head = self.released = 0  # bytes placed / freed since the offer

    def reset(self) -> None:
        """Positions count from 0 again (a new connection's offer)."""
        self.head = self.released = 0

    def place(self, length: int) -> tuple[int, int]:
        """(position, end) of the next ``length`` bytes: contiguous, cache-line aligned."""
        start = -(-self.head // _ALIGN) * _ALIGN
        if start % self.capacity + length > self.capacity:
            start = -(-start // self.capacity) * self.capacity  # the next turn
        return start, start + length

    def fits(self, end: int) -> bool:
        """A payload placed up to ``end`` may be written: nothing the receiver has yet to copy
        lies where it goes (the bytes in use are ``released`` to ``head``)."""
        return self.idle or end - self.released <= self.capacity

    def write(self, position: int, parts: list[memoryview], end: int) -> None:
        offset = position % self.capacity
        for part in parts:
            self.map[offset : offset + part.nbytes] = part
            offset += part.nbytes
        self.head = end

    def free(self, end: int) -> None:
        """The receiver's ``R``: everything before ``end`` was copied out."""
        if not self.released <= end <= self.head:
            raise ProtocolError(f"the receiver freed ring bytes up to {end}; {self.released}-{self.head} are in use")
        self.released = end

    @property
    def idle(self) -> bool:
        return self.released == self.head

    def close(self) -> None:
        with contextlib.suppress(BufferError):
            self.map.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)


_spare: list[SendRing] = []
_spare_lock = threading.Lock()


def take_send_ring() -> SendRing | None:
    """A ring for a new connection: the last one this process used, its pages already in
    memory (a feed task's Python worker runs task after task), else a new one; None where
    sealed memfds do not exist or cannot be made."""
    with _spare_lock:
        if _spare and _spare[-1].capacity == CAPACITY:
            ring = _spare.pop()
            ring.reset()
            return ring
    if not supported():
        return None
    try:
        return SendRing()
    except OSError:
        return None


def return_send_ring(ring: SendRing) -> None:
    """Keep ``ring`` for the next connection if its receiver is done with it; else drop it."""
    if ring.idle:
        with _spare_lock:
            if not _spare:
                _spare.append(ring)
                return
    ring.close()


def _seals(fd: int) -> int:
    """The file's seals; 0 where it cannot have any (not a memfd)."""
    try:
        return int(fcntl.fcntl(fd, fcntl.F_GET_SEALS))
    except OSError:
        return 0


class RecvRing:
    """The receiver's side: the sender's memfd mapped read-only, checked before it is trusted."""

    def __init__(self, fd: int, capacity: int, ident: int = 0) -> None:
        try:
            if not supported():
                raise ProtocolError("peer offered a ring; this platform has no sealed memfds")
            info = os.fstat(fd)
            seals = _seals(fd)
            if not 0 < capacity <= MAX_CAPACITY or not stat.S_ISREG(info.st_mode) or info.st_size < capacity:
                raise ProtocolError(
                    f"peer offered a ring of {capacity} bytes in a file of {info.st_size}; a ring is a regular "
                    f"file of at least its size, 1 to {MAX_CAPACITY} bytes (MAX_CAPACITY)"
                )
            if not seals & fcntl.F_SEAL_SHRINK:
                raise ProtocolError("peer offered a ring that may shrink (no F_SEAL_SHRINK)")
            # the file and the sender's id: an inode number alone may be reused once the file is
            # gone (a kept mapping keeps it alive, but numbers wrap), an id with it is not
            self.key = (info.st_dev, info.st_ino, capacity, ident) if ident else None
            self.map = _mapping(self.key, fd, capacity)
        except OSError as exc:
            raise ProtocolError(f"peer offered a ring that cannot be mapped: {exc}") from None
        finally:
            os.close(fd)
        self.capacity = capacity
        self.next = 0  # where the next payload may start
        self._view: memoryview | None = memoryview(self.map)
        self._lock = threading.Lock()  # close() may come from another thread than read()

    def check(self, position: int, length: int) -> None:
        """Raise unless ``length`` bytes at ``position`` lie in the ring, after what was read, and
        end where an ``R`` frame can say (a u64: a peer may send a place in the last turn before
        2**64 whose end is past it)."""
        if position < self.next or position % self.capacity + length > self.capacity:
            raise ProtocolError(
                f"peer placed {length} bytes at ring position {position}; expected at least {self.next}, "
                f"within {self.capacity} bytes"
            )
        if position + length > MAX_POSITION:
            raise ProtocolError(
                f"peer placed {length} bytes at ring position {position}: they end at {position + length}, "
                "past 2**64 - 1, the last ring position a frame can name"
            )

    def read(self, position: int, length: int, into: memoryview) -> int:
        """Copy the payload at ``position`` into ``into`` (``length`` bytes); the end to free (``R``)."""
        self.check(position, length)
        offset = position % self.capacity
        with self._lock:
            if self._view is None:
                raise ProtocolError("the connection was closed")
            into[:] = self._view[offset : offset + length]
        self.next = position + length
        return self.next

    def close(self) -> None:
        with self._lock:
            if self._view is not None:
                self._view.release()
                self._view = None
                _keep_mapping(self.key, self.map)


_kept: OrderedDict[tuple[int, int, int, int], mmap.mmap] = OrderedDict()  # no connection uses them
_kept_lock = threading.Lock()


def _mapping(key: tuple[int, int, int, int] | None, fd: int, capacity: int) -> mmap.mmap:
    """The ring's mapping kept from its last offer, else a new one (read-only, pages populated)."""
    if key is not None:
        with _kept_lock:
            kept = _kept.pop(key, None)
        if kept is not None:
            return kept
    flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
    return mmap.mmap(fd, capacity, flags=flags, prot=mmap.PROT_READ)


def _keep_mapping(key: tuple[int, int, int, int] | None, mapping: mmap.mmap) -> None:
    """Keep ``mapping`` for its ring's next offer if the ring is of ``CAPACITY``; the oldest
    beyond ``KEPT_MAPPINGS`` or ``KEPT_BYTES`` unmapped."""
    drop = [mapping]
    if key is not None and key[2] == CAPACITY <= KEPT_BYTES:
        with _kept_lock:
            if key not in _kept:  # else a second connection mapped the same ring meanwhile
                _kept[key] = drop.pop()
            while len(_kept) > KEPT_MAPPINGS or _kept_total() > KEPT_BYTES:
                drop.append(_kept.popitem(last=False)[1])
    for old in drop:
        old.close()


def _kept_total() -> int:
    """The bytes of the kept mappings (``_kept_lock`` held); each key ends with its capacity."""
    return sum(key[2] for key in _kept)


def kept_bytes() -> int:
    """The bytes of ring mappings this process keeps for a next offer (at most ``KEPT_BYTES``)."""
    with _kept_lock:
        return _kept_total()
