"""tfprocess/report.py: ``ctx.report`` refuses what it cannot send with ConfigError, and refuses
oversized values before converting them; the Reporter sends in order and never blocks."""

from __future__ import annotations

import logging
import sys
import threading
import time

import numpy as np
import pytest

from tfonspark.errors import (
    ConfigError,
)
from tfonspark.tfprocess.report import MAX_REPORT_BYTES, Reporter, report_payload


def test_an_int_too_long_for_json_is_a_config_error():
    with pytest.raises(ConfigError, match=r"at most 4,300 digits.*Received: 'step', an int of about 5,000 digits"):
        report_payload({"step": 10**5000 - 1})  # a ValueError from json.dumps before
    with pytest.raises(ConfigError, match=r"'deep\[1\]'"):
        report_payload({"deep": [1, -(10**4300)]})
    assert report_payload({"step": 10**4299})["step"] == 10**4299  # 4,300 digits: fine


def test_a_lower_int_digit_limit_is_a_config_error_too():
    if not hasattr(sys, "set_int_max_str_digits"):
        pytest.skip("no int digit limit in this Python")
    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(640)
    try:
        with pytest.raises(ConfigError, match="limit \\(640 digits\\)"):
            report_payload({"step": 10**1000})
    finally:
        sys.set_int_max_str_digits(old)


@pytest.mark.parametrize(
    "value",
    [
        np.zeros(10_000_000),
        np.zeros((1000, 10_000), np.int8),
        list(range(10_000_000)),
        [list(range(30_000))] * 30_000,  # each list small enough alone
        "x" * 10_000_000,
        {f"k{i}": i for i in range(1_000_000)},
    ],
    ids=["10M floats", "10M int8 2-D", "10M-int list", "30k x 30k lists", "10 MB str", "1M-key dict"],
)
def test_an_oversized_value_is_refused_before_it_is_converted(value):
    started = time.perf_counter()
    with pytest.raises(ConfigError, match=f"at most {MAX_REPORT_BYTES} bytes") as refused:
        report_payload({"big": value})
    assert time.perf_counter() - started < 0.5  # converting 10M values took 3.7-21 s
    assert "'big" in str(refused.value)


def test_values_under_the_limit_still_pass():
    """What is counted before converting is a lower bound of the JSON: nothing that fits is refused."""
    assert len(report_payload({"a": np.zeros(10_000, np.int8)})["a"]) == 10_000  # 20 KB
    assert len(report_payload({"p": list(range(10_000))})["p"]) == 10_000  # 49 KB
    assert len(report_payload({"x": [[1]] * 16_000})["x"]) == 16_000  # 64,007 bytes
    assert len(report_payload({"x": np.zeros((16_000, 1), np.int8)})["x"]) == 16_000
    assert len(report_payload({f"k{i}": None for i in range(5_000)})) == 5_000  # 63,891 bytes
    assert len(report_payload({"s": ["ab"] * 10_900})["s"]) == 10_900  # 54,507 bytes
    assert report_payload({"o": np.array([1, "a", None], dtype=object), "z": np.array("b", dtype=object)}) == {
        "o": [1, "a", None],
        "z": "b",
    }
    with pytest.raises(ConfigError, match="Received: 108897 bytes"):  # the exact check
        report_payload({"p": list(range(20_000))})


def test_report_refuses_a_cycle():
    loop: dict = {}
    loop["self"] = loop
    with pytest.raises(ConfigError, match="nest more than"):
        report_payload({"loop": loop})


def test_reporter_sends_in_order_off_the_callers_thread():
    sent: list[tuple[dict, str]] = []
    reporter = Reporter(lambda payload: sent.append((payload, threading.current_thread().name)))
    for i in range(50):
        reporter({"i": i})
    assert reporter.flush(5)
    assert [p["i"] for p, _ in sent] == list(range(50))
    assert {name for _, name in sent} == {"tfos-report"}


def test_reporter_never_blocks_and_drops_the_oldest(caplog):
    release = threading.Event()
    sent: list[int] = []

    def stuck(payload: dict) -> None:  # a supervisor that does not read its pipe
        release.wait(10)
        sent.append(payload["i"])

    reporter = Reporter(stuck, max_pending=3)
    with caplog.at_level(logging.WARNING):
        for i in range(10):
            reporter({"i": i})  # returns at once although nothing can be sent
    assert not reporter.flush(0.05)
    release.set()
    assert reporter.flush(5)
    assert sent[-3:] == [7, 8, 9] and reporter.dropped == len(range(10)) - len(sent)
    assert caplog.text.count("dropping the oldest") == 1


def test_reporter_survives_a_sender_that_fails():
    calls: list[int] = []

    def broken(payload: dict) -> None:
        calls.append(payload["i"])
        raise BrokenPipeError("the supervisor is gone")

    reporter = Reporter(broken)
    reporter({"i": 1})
    reporter({"i": 2})
    assert reporter.flush(5) and calls == [1, 2]


def test_reporter_needs_room_for_one():
    with pytest.raises(ConfigError, match="max_pending"):
        Reporter(lambda payload: None, max_pending=0)
