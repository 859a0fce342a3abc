"""Reading from the tf.data service on the driver: fail, saying why, once a worker is lost for good.

A reader of the service is not told when a worker dies for good (its executor lost, its
restarts in place used up): TF's client retries the dead address forever. :func:`watched` reads
in a thread and asks the driver's view of the nodes meanwhile (``DataService.watch``).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from ...errors import NodeFailed

__all__ = ["watched"]


def watched(dataset: Iterable[Any], failed: Callable[[], Sequence[Any]], poll_secs: float = 1.0) -> Iterator[Any]:
    """``dataset``'s elements, raising NodeFailed within ``poll_secs`` once ``failed()`` names a lost worker.

    A reader of the service is not told when a worker dies for good (its executor lost, its
    restarts in place used up): TF's client retries the dead address forever. This reads
    ``dataset`` in a thread and, while waiting, asks ``failed()`` (the driver's view) every
    ``poll_secs``, so that the reader fails, saying why, instead of hanging.

    Parameters
    ----------
    dataset : iterable
        What to read (a ``tf.data.Dataset`` read through the service).
    failed : callable
        Returns the workers lost for good: the control plane's ``failures`` (``DataService.watch``).
    poll_secs : float
        How often ``failed()`` is asked.

    Examples
    --------
    >>> for batch in watched(ds, lambda: []):  # doctest: +SKIP
    ...     train_step(batch)
    """
    items: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=8)
    stop = threading.Event()
    threading.Thread(target=_pump, args=(dataset, items, stop), daemon=True, name="tfos-data-watch").start()
    checked = time.monotonic()
    try:
        while True:
            try:
                kind, value = items.get(timeout=poll_secs)
            except queue.Empty:
                kind, value = "wait", None
            if kind == "end":
                return
            if kind == "error":
                raise value
            if kind == "item":
                yield value
            if time.monotonic() - checked >= poll_secs:  # not at every element: failed() takes a lock
                _raise_if_lost(failed())
                checked = time.monotonic()
    finally:
        stop.set()


def _pump(dataset: Iterable[Any], items: queue.Queue[tuple[str, Any]], stop: threading.Event) -> None:
    """Read ``dataset`` into ``items`` until it ends, fails, or ``stop`` is set."""
    try:
        for element in dataset:
            while not stop.is_set():
                try:
                    items.put(("item", element), timeout=0.1)
                    break
                except queue.Full:
                    continue
            if stop.is_set():
                return
        items.put(("end", None))
    except BaseException as error:  # noqa: BLE001 - handed to the reader, raised there
        items.put(("error", error))


def _raise_if_lost(lost: Sequence[Any]) -> None:
    if lost:
        names = ", ".join(str(getattr(getattr(n, "role", None), "name", n)) for n in lost)
        raise NodeFailed(
            f"tf.data worker(s) {names} lost for good (not restartable in place): the service cannot "
            "go on with this job. Leave the data_service block and start again."
        )
