"""driver/feed_watch.py: when the driver releases the Acks the nodes hold (issue 43, row 0).

The status tracker is a seam (``left``): what it reads of a real Spark job is exercised by
tests/integration/test_feed_pacing.py.
"""

from __future__ import annotations

import time

from tests.waiting import wait_until
from tfonspark.driver.feeds.feed_watch import FeedWatch, tasks_to_launch
from tfonspark.wire import messages as m


class Tracker:
    """``left``: how many of the feed job's tasks Spark has still to launch."""

    def __init__(self, left: int | None) -> None:
        self.left = left

    def __call__(self, sc: object, group: str) -> int | None:
        return self.left


def _watch(left: int | None) -> tuple[FeedWatch, Tracker, list[m.FeedRelease]]:
    told: list[m.FeedRelease] = []
    tracker = Tracker(left)
    watch = FeedWatch(None, "group", "input", "driver:3", told.append, left=tracker).start()
    return watch, tracker, told


def test_nothing_is_released_while_nothing_is_held_even_when_no_task_is_left():
    """Before any hold (e.g. an AQE shuffle job of the same group ending), a final release would
    turn pacing off for the feed that follows."""
    watch, _, told = _watch(0)
    try:
        watch.starved()
        time.sleep(1.2)
        assert told == []
        watch.held("driver:2")  # another feed's hold
        time.sleep(1.2)
        assert told == []
    finally:
        watch.stop()


def test_a_hold_is_released_for_good_once_every_task_of_the_feed_has_launched():
    watch, tracker, told = _watch(3)
    try:
        watch.held("driver:3")
        time.sleep(1.2)
        assert told == []  # partitions left for other executors to take: holding helps
        tracker.left = 0
        assert wait_until(lambda: told, timeout=5)
        time.sleep(1.2)
        assert told == [m.FeedRelease("input", "driver:3", final=True)]  # once
        assert watch.final_sent
    finally:
        watch.stop()


def test_a_starving_node_releases_the_holds_of_the_others_once_each_time():
    watch, tracker, told = _watch(5)
    try:
        watch.held("driver:3")
        watch.starved()
        assert wait_until(lambda: told, timeout=5)
        assert told == [m.FeedRelease("input", "driver:3", final=False)]
        time.sleep(1.2)
        assert len(told) == 1  # no new starvation reported: no new release
        watch.starved()
        assert wait_until(lambda: len(told) == 2, timeout=5)
        assert watch.releases == 2
    finally:
        watch.stop()


def test_an_unknown_job_state_releases_nothing():
    watch, _, told = _watch(None)
    try:
        watch.held("driver:3")
        time.sleep(1.2)
        assert told == []
    finally:
        watch.stop()


class _Info:
    def __init__(self, **fields: object) -> None:
        self.__dict__.update(fields)


class _StatusTracker:
    def __init__(self, jobs: dict[int, _Info], stages: dict[int, _Info]) -> None:
        self.jobs, self.stages = jobs, stages

    def getJobIdsForGroup(self, group: str) -> list[int]:  # noqa: N802 - pyspark's name
        return list(self.jobs)

    def getJobInfo(self, job_id: int) -> _Info | None:  # noqa: N802
        return self.jobs.get(job_id)

    def getStageInfo(self, stage_id: int) -> _Info | None:  # noqa: N802
        return self.stages.get(stage_id)


class _Context:
    def __init__(self, tracker: _StatusTracker) -> None:
        self._tracker = tracker

    def statusTracker(self) -> _StatusTracker:  # noqa: N802
        return self._tracker


def _stage(tasks: int, active: int, completed: int) -> _Info:
    return _Info(numTasks=tasks, numActiveTasks=active, numCompletedTasks=completed)


def test_tasks_to_launch_reads_the_final_stage_of_each_running_job():
    running = _Info(status="RUNNING", stageIds=[4, 5])
    done = _Info(status="SUCCEEDED", stageIds=[1, 2])
    tracker = _StatusTracker({7: running, 6: done}, {5: _stage(8, 2, 3), 4: _stage(8, 0, 0), 2: _stage(8, 0, 0)})
    assert tasks_to_launch(_Context(tracker), "g") == 3  # a skipped stage 4 does not count
    tracker.stages[5] = _stage(8, 2, 6)
    assert tasks_to_launch(_Context(tracker), "g") == 0
    tracker.stages.pop(5)  # the final stage not submitted yet
    assert tasks_to_launch(_Context(tracker), "g") is None
    assert tasks_to_launch(_Context(_StatusTracker({6: done}, {})), "g") is None  # nothing running
