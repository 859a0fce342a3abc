"""driver/nodes/reports.py: the report log the driver keeps, bounded in count and bytes."""

from __future__ import annotations

from tfonspark.driver.nodes.reports import KEEP_BYTES, KEEP_REPORTS, ReportLog


def test_the_report_log_keeps_the_latest_reports_within_count_and_bytes():
    log = ReportLog(lambda report: None, keep=5, keep_bytes=1000)
    for step in range(8):
        log.add("worker", 0, {"step": step})
    assert [r.metrics["step"] for r in log.all()] == [3, 4, 5, 6, 7]
    for step in range(8, 12):
        log.add("worker", 1, {"step": step, "pad": "p" * 300})  # ~320 bytes each: three fit in 1000
    assert [r.metrics["step"] for r in log.all()] == [9, 10, 11]
    log.add("worker", 0, {"pad": "p" * 5000})  # larger than the budget alone: the newest is still kept
    assert len(log.all()) == 1
    assert KEEP_REPORTS == 10_000 and KEEP_BYTES == 32 * 1024 * 1024
