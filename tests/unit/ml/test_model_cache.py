"""ModelCache: a process-wide, thread-safe LRU of whatever the caller loads, keyed by a driver-made id."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from tfonspark.ml import ModelCache


@pytest.fixture(autouse=True)
def _empty_cache(monkeypatch):
    """Each test starts with an empty cache, fresh counts and the default capacity."""
    ModelCache.clear()
    monkeypatch.setattr(ModelCache, "loads", type(ModelCache.loads)())
    yield
    ModelCache.clear()


def test_get_or_load_loads_once_and_add_get_work_like_sparks_cache():
    key = uuid.uuid4()
    assert ModelCache.get(key) is None
    assert ModelCache.get_or_load(key, lambda: ["model"]) == ["model"]
    assert ModelCache.get_or_load(key, lambda: pytest.fail("loaded twice")) == ["model"]
    ModelCache.add("other", 42)
    assert ModelCache.get("other") == 42 and ModelCache.get(key) == ["model"]
    assert ModelCache.loads[key] == 1 and "other" not in ModelCache.loads  # add() is not a load


def test_least_recently_used_is_dropped_beyond_capacity(monkeypatch):
    monkeypatch.setattr(ModelCache, "capacity", 2)
    for key in "abc":
        ModelCache.get_or_load(key, lambda key=key: key.upper())
        if key == "b":
            ModelCache.get("a")  # a is now more recent than b
    assert ModelCache.get("b") is None
    assert (ModelCache.get("a"), ModelCache.get("c")) == ("A", "C")
    assert ModelCache.stats()["cached"] == ["a", "c"]


def test_a_failed_load_is_not_cached_and_is_retried():
    def broken() -> str:
        raise OSError("no such model")

    with pytest.raises(OSError, match="no such model"):
        ModelCache.get_or_load("k", broken)
    assert ModelCache.get("k") is None and ModelCache.get_or_load("k", lambda: "ok") == "ok"


def test_threads_asking_for_one_key_load_it_once_without_blocking_other_keys():
    started, release = threading.Event(), threading.Event()
    calls: list[str] = []

    def slow() -> str:
        calls.append("slow")
        started.set()
        release.wait(10)
        return "slow model"

    results: list[str] = []
    threads = [threading.Thread(target=lambda: results.append(ModelCache.get_or_load("slow", slow))) for _ in range(4)]
    for t in threads:
        t.start()
    assert started.wait(10)
    t0 = time.monotonic()
    assert ModelCache.get_or_load("fast", lambda: "fast model") == "fast model"  # not held up by "slow"
    assert time.monotonic() - t0 < 1
    release.set()
    for t in threads:
        t.join(10)
    assert results == ["slow model"] * 4 and calls == ["slow"]


def test_stats_are_json_ready():
    key = uuid.UUID(int=7)
    ModelCache.get_or_load(key, object)
    stats = ModelCache.stats()
    assert stats["cached"] == [str(key)] and stats["loads"] == {str(key): 1} and isinstance(stats["pid"], int)
