"""wire/errors.py: typed errors across the Spark task boundary: one capture on the executor, one re-
raise on the driver."""

from __future__ import annotations

import base64
import json
import traceback

import pytest

from tfonspark import errors
from tfonspark.wire.errors import CapturedError, capture, captured, decode, encode, raise_or, reraise, summary

TYPED = [
    errors.InputError("ragged row", column="features", partition=3, row=17),
    errors.DataFormatError("bad CRC", path="hdfs://nn/x/part-r-00001", offset=4096),
    errors.NodeFailed("boom", role="worker", index=1, exit_code=2, traceback="tb", failures={"worker:1": "tb"}),
    errors.ReservationTimeout("too few", registered=1, required=3),
    errors.FeedTimeout("stalled"),
    errors.ConfigError("bad setting"),
]


def spark_failure(exc: BaseException) -> RuntimeError:
    """What Spark hands the driver for a failed Python task: the traceback as text, nothing chained."""
    try:
        raise exc
    except BaseException:
        text = traceback.format_exc()
    return RuntimeError(f"An error occurred while calling o123.collect.\n{text}\n\tat org.apache.spark.api.python")


@pytest.mark.parametrize("err", TYPED, ids=lambda e: type(e).__name__)
def test_a_captured_error_arrives_with_its_class_message_and_attributes(err):
    with pytest.raises(CapturedError) as info, capture():
        raise err
    with pytest.raises(type(err)) as back:
        reraise(spark_failure(info.value))
    assert str(back.value) == str(err)
    assert vars(back.value) == vars(err)


def test_generator_and_plain_task_functions_are_both_captured():
    @captured
    def rows(n):
        yield 1
        raise errors.InputError("bad row", row=n)

    @captured
    def one(n):
        raise errors.InputError("bad value", row=n)

    with pytest.raises(CapturedError, match="bad row"):
        list(rows(5))
    with pytest.raises(CapturedError, match="bad value"):
        one(6)
    assert rows.__wrapped__ is not None and one.__name__ == "one"


def test_untyped_errors_pass_through_capture_untouched():
    with pytest.raises(KeyError), capture():
        raise KeyError("weights")


def test_a_marker_in_a_result_column_is_raised_too():
    with pytest.raises(errors.InputError) as info:
        reraise(encode(errors.InputError("no such column", column="x")))
    assert info.value.column == "x"


def test_the_marker_is_found_in_a_java_cause_and_in_chained_exceptions():
    java = type("JavaError", (), {"toString": lambda self: encode(errors.FeedTimeout("slow"))})()
    outer = RuntimeError("Py4JJavaError")
    outer.java_exception = java  # type: ignore[attr-defined]
    with pytest.raises(errors.FeedTimeout, match="slow"):
        reraise(outer)
    try:
        try:
            raise spark_failure(CapturedError(encode(errors.ConfigError("inner"))))
        except RuntimeError as inner:
            raise ValueError("wrapper") from inner
    except ValueError as chained:
        with pytest.raises(errors.ConfigError, match="inner"):
            reraise(chained)


def _marker(payload: dict) -> str:
    return "[tfonspark-error " + base64.urlsafe_b64encode(json.dumps(payload).encode()).decode() + "]"


@pytest.mark.parametrize(
    "text",
    [
        _marker({"type": "OSError", "message": "not ours", "attrs": {}}),  # only tfonspark.errors classes
        _marker({"type": "_rebuild", "message": "x", "attrs": {}}),
        _marker({"message": "no type"}),
        "[tfonspark-error not*base64]",
        "[tfonspark-error " + base64.urlsafe_b64encode(b"\x80\x81").decode() + "]",
        "no marker at all",
    ],
)
def test_anything_but_a_valid_marker_of_our_classes_is_ignored(text):
    assert decode(text) is None
    reraise(text)  # returns: nothing to raise


def test_a_marker_without_attributes_still_names_its_class():
    err = decode(_marker({"type": "FeedError", "message": "m"}) + " trailing text")
    assert type(err) is errors.FeedError and str(err) == "m"


def test_unjsonable_attributes_travel_as_their_repr():
    err = errors.InputError("bad", column=("a", "b"))
    err.extra = object()  # type: ignore[attr-defined]
    back = decode(encode(err))
    assert back is not None and back.column == ["a", "b"] and back.extra.startswith("<object")  # type: ignore[attr-defined]


def test_raise_or_falls_back_to_one_summary_line():
    failure = spark_failure(OSError(28, "No space left on device"))
    with pytest.raises(errors.FeedError, match=r"^the job failed: OSError: \[Errno 28\] No space left on device$"):
        raise_or(failure, lambda line: errors.FeedError(f"the job failed: {line}"))
    assert summary(RuntimeError("")) == "RuntimeError('')"
    assert summary(RuntimeError("just text")) == "just text"
