"""The log's formats (`worker.logs`): text by default; JSON lines with the fields they promise.

Each JSON line is one object on one line, whatever the message holds (newlines, quotes, any
text hypothesis draws); it has time, level, logger and message; a call's ids when the line is
about a call; the traceback when there is one; the active span's ids when there is a span (a
real OpenTelemetry SDK span), and none when there is not. A worker's real stderr in JSON is
tested in tests/runtime/test_logs_json.py.
"""

from __future__ import annotations

import io
import logging
import re
import sys

import orjson
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.sdk.trace import TracerProvider

from worker._native import AssembledCall
from worker.logs import CALL_FIELDS, JsonFormatter, call_fields, formatter
from worker.runtime.tracing import current_span_ids

TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def log_record(message: str, *args: object, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("callgate.worker", logging.WARNING, __file__, 1, message, args, None)
    record.__dict__.update(extra)
    return record


@given(message=st.text(), arg=st.one_of(st.text(), st.integers(), st.binary()))
def test_a_json_line_is_one_object_on_one_line_whatever_the_message(
    message: str, arg: object
) -> None:
    line = JsonFormatter().format(log_record("%s " + message.replace("%", "%%"), arg))
    assert "\n" not in line
    parsed = orjson.loads(line)
    assert parsed["message"] == f"{arg} {message}"
    assert (parsed["level"], parsed["logger"]) == ("WARNING", "callgate.worker")
    assert TIME.fullmatch(parsed["time"])
    assert "trace_id" not in parsed
    assert "span_id" not in parsed


def test_a_line_about_a_call_carries_its_ids() -> None:
    call = AssembledCall("s1", "c1", "get_weather", b"{}", topic="in", partition=2, first_offset=7)
    parsed = orjson.loads(JsonFormatter().format(log_record("bad", **call_fields(call))))
    assert {name: parsed[name] for name in CALL_FIELDS} == {
        "call_id": "c1",
        "stream_id": "s1",
        "event_id": call.event_id,
        "tool": "get_weather",
        "topic": "in",
        "partition": 2,
        "offset": 7,
    }


def test_a_traceback_is_kept_in_the_line() -> None:
    try:
        raise ValueError("broken")
    except ValueError:
        record = logging.LogRecord(
            "callgate.worker", logging.ERROR, __file__, 1, "failed", (), sys.exc_info()
        )
    parsed = orjson.loads(JsonFormatter().format(record))
    assert parsed["message"] == "failed"
    assert parsed["exception"].startswith("Traceback (most recent call last):")
    assert parsed["exception"].endswith("ValueError: broken")


def test_the_active_spans_ids_are_in_the_line_and_only_while_it_is_active() -> None:
    tracer = TracerProvider().get_tracer("test")
    json = JsonFormatter(current_span_ids)
    with tracer.start_as_current_span("judging") as span:
        inside = orjson.loads(json.format(log_record("inside")))
    outside = orjson.loads(json.format(log_record("outside")))
    ctx = span.get_span_context()
    assert (inside["trace_id"], inside["span_id"]) == (
        f"{ctx.trace_id:032x}",
        f"{ctx.span_id:016x}",
    )
    assert "trace_id" not in outside


def test_text_stays_the_default_format() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter("text"))
    handler.emit(log_record("assigned %d partitions", 3))
    assert re.fullmatch(
        r"\S+ \S+ WARNING callgate.worker: assigned 3 partitions\n", stream.getvalue()
    )
