"""executor/relay.py: status lines from the TF process bounded before they are read, relayed or sent
(issue 21)."""

from __future__ import annotations

import io
import json
import logging
import threading

import pytest

from tfonspark.executor.relay import MAX_EVENT_BYTES, MAX_STATUS_LINE, Relay
from tfonspark.tfprocess.report import MAX_REPORT_BYTES, report_payload
from tfonspark.wire import events as ev
from tfonspark.wire import messages as m

# ---- row 6: a TF process that cannot be spawned leaves no scratch directory -----------------------


# ---- row 5: what the TF process writes is bounded before it is read, relayed or sent -------------


class _Status(io.StringIO):
    """The status pipe, remembering the longest piece the supervisor read at once."""

    longest = 0

    def readline(self, size: int | None = -1) -> str:  # type: ignore[override]
        line = super().readline(size)
        self.longest = max(self.longest, len(line))
        return line

    def __next__(self) -> str:  # iterating reads whole lines, however long
        line = super().__next__()
        self.longest = max(self.longest, len(line))
        return line


def _line(event_type: str, **fields) -> str:
    """A status line as the TF process may write it: ``J`` and a typed event (spaces after separators)."""
    return "J" + json.dumps({"type": event_type, **fields}) + "\n"


def _relay(pair, lines: list[str]) -> tuple[str, list[m.Message], _Status]:
    sup_end, drv_end = pair
    relay = Relay(sup_end, 2)
    status = _Status("".join(lines))
    got: list[m.Message] = []

    def driver() -> None:  # reads as the driver does, so a large frame cannot block the relay
        while not isinstance(msg := m.recv_message(drv_end), m.Heartbeat):
            got.append(msg)

    drv_end.settimeout(10)
    reader = threading.Thread(target=driver, daemon=True)
    reader.start()
    error = relay.status(status, 4242, [])
    m.send_message(sup_end, m.Heartbeat())  # the end of what was relayed
    reader.join(10)
    return error, got, status


def test_an_overlong_status_line_is_skipped_with_an_error_and_the_relay_goes_on(pair, caplog):
    """A 5 MiB line (a feeder's 5 MiB feed_id in an epoch mark) neither reaches the driver nor
    sits in the supervisor's memory whole; the events after it are relayed."""
    huge = _line("epoch_read", feed_id="f" * (5 * 1024 * 1024), epoch=0)
    after = ev.FeedStalled("f1", 1, timeout=9.0)
    lines = [huge, ev.to_line(after), _line("process_error", traceback="tb")]
    with caplog.at_level(logging.ERROR, logger="tfonspark.executor.relay"):
        error, got, status = _relay(pair, lines)
    assert got == [after]
    assert error == "tb"
    assert status.longest <= MAX_STATUS_LINE + 1
    (record,) = caplog.records
    assert f"{len(huge)} characters" in record.getMessage() and f"at most {MAX_STATUS_LINE}" in record.getMessage()
    assert "epoch_read" in record.getMessage()  # the start of the line says what it was


def test_an_event_over_max_event_bytes_is_dropped_with_an_error(pair, caplog):
    big = {"feed_id": "f" * (MAX_EVENT_BYTES + 1), "epoch": 0}  # within a status line, over an event
    lines = [_line("epoch_read", **big), _line("reported", metrics={"a": 1})]
    with caplog.at_level(logging.ERROR, logger="tfonspark.executor.relay"):
        error, got, _ = _relay(pair, lines)
    assert got == [ev.Reported({"a": 1})] and error == ""
    (record,) = caplog.records
    assert "'epoch_read' event of" in record.getMessage() and f"at most {MAX_EVENT_BYTES}" in record.getMessage()


def test_the_largest_report_ctx_report_allows_is_relayed():
    """MAX_EVENT_BYTES leaves room for a report of MAX_REPORT_BYTES and its envelope."""
    filler = MAX_REPORT_BYTES - len(json.dumps({"x": ""}, separators=(",", ":")))
    for detail in ({"x": "é" * (filler // 6)}, {"x": "a" * filler}):  # non-ASCII: six bytes each as JSON
        payload = report_payload(detail)  # the TF process's own check passes
        event = ev.Reported(payload)
        assert len(m.encode(event)) <= MAX_EVENT_BYTES


def test_a_largest_report_line_reaches_the_driver(pair):
    detail = {"x": [0] * (MAX_REPORT_BYTES // 2 - 8)}  # ", " between items: a line far longer than the JSON
    report_payload(detail)
    error, got, _ = _relay(pair, [_line("reported", metrics=detail)])
    assert got == [ev.Reported(detail)]


def test_an_overlong_traceback_still_ends_the_relay(pair, caplog):
    lines = [_line("process_error", traceback="x" * (MAX_STATUS_LINE + 10)), _line("feed_terminated")]
    with caplog.at_level(logging.ERROR, logger="tfonspark.executor.relay"):
        error, got, _ = _relay(pair, lines)
    assert error == "" and got == [ev.FeedTerminated()]  # the driver shows the output tail instead
    assert "skipped a status line" in caplog.text


def test_a_last_line_without_a_newline_is_read():
    status = io.StringIO(_line("process_error", traceback="tb").rstrip("\n"))
    assert Relay(None, 2).status(status, 0, []) == "tb"  # type: ignore[arg-type]


# ---- issue 43, row 7: a status line nested too deep to re-encode -----------------------------------


def _nested_line(depth: int) -> str:
    """A ``reported`` status line whose ``metrics`` nest ``depth`` objects deep (built as text:
    ``json.dumps`` itself refuses that depth)."""
    return 'J{"type": "reported", "metrics": ' + '{"x": ' * (depth - 1) + '{"loss": 1' + "}" * depth + "}\n"


@pytest.mark.parametrize("depth", [500, 800])  # the issue: 900-990 in a supervisor, whose stack is shallower
def test_a_status_line_nested_too_deep_is_skipped_and_the_relay_goes_on(pair, caplog, depth):
    """``metrics`` nested 900-990 deep decodes, then re-encoding it for the driver
    (``dataclasses.asdict``) raised RecursionError out of the relay: the node ended with it."""
    after = ev.Reported({"a": 1})
    lines = [_nested_line(depth)] * 12 + [ev.to_line(after), _line("process_error", traceback="tb")]
    with caplog.at_level(logging.ERROR, logger="tfonspark.executor.relay"):
        error, got, _ = _relay(pair, lines)
    assert got == [after] and error == "tb"  # the relay went on past them
    skipped = [r.getMessage() for r in caplog.records]
    assert len(skipped) == 10, skipped  # twelve such lines, ten errors: the first 10, then 1 in 1,000
    assert "'reported' event nested too deep" in skipped[0] and "(1 skipped so far)" in skipped[0]
    assert "(10 skipped so far)" in skipped[-1] and "The node goes on" in skipped[-1]
