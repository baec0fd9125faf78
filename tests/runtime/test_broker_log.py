"""What the log says when Kafka goes away (`worker.runtime.broker_log`): each change of state
once, a reminder while it lasts, the client's repeats counted and written once per kind."""

from __future__ import annotations

import logging
import sys

import pytest

from tests.test_metrics import scrape, series
from worker.metrics import Metrics
from worker.runtime.broker_log import REPEATS, BrokerState, RepeatFilter


@pytest.fixture
def now() -> list[float]:
    return [100.0]


def test_each_change_of_state_is_said_once_and_a_long_outage_is_recalled(
    now: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="callgate")
    state = BrokerState(lambda: now[0], reminder_s=60)
    state.observe(None)
    for _ in range(100):  # rounds, every 0.5 s, while Kafka is away for 150 s
        state.observe("no fetch answered within 10 s for 3 of 3 partitions")
        now[0] += 1.5
    state.observe(None)
    state.observe(None)
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert lines == [
        ("ERROR", "Kafka unreachable: no fetch answered within 10 s for 3 of 3 partitions"),
        (
            "ERROR",
            "Kafka still unreachable after 1 min: no fetch answered within 10 s for 3 of 3 "
            "partitions; 0 client warnings and errors since",
        ),
        (
            "ERROR",
            "Kafka still unreachable after 2 min: no fetch answered within 10 s for 3 of 3 "
            "partitions; 0 client warnings and errors since",
        ),
        ("WARNING", "Kafka reachable again after 150 s; 0 client warnings and errors meanwhile"),
    ]


def record(name: str, level: int, msg: str, *args: object, **extra: object) -> logging.LogRecord:
    made = logging.LogRecord(name, level, __file__, 1, msg, args, None)
    made.__dict__.update(extra)
    return made


def test_repeats_are_counted_written_once_per_kind_and_none_while_unreachable(
    now: list[float],
) -> None:
    metrics = Metrics({})
    state = BrokerState(lambda: now[0], reminder_s=60)
    repeats = RepeatFilter(state, metrics, lambda: now[0])
    client = "aiokafka.consumer.fetcher"
    failed = [record(client, logging.ERROR, "Failed fetch messages from %s", i) for i in range(5)]
    assert [repeats.filter(r) for r in failed] == [True, False, False, False, False]
    # the worker's own repeats are marked; an unmarked warning is not one
    mine = record("callgate.worker", logging.WARNING, "fetch failed: %r", "x", **REPEATS)
    assert repeats.filter(mine)
    assert not repeats.filter(
        record("callgate.worker", logging.WARNING, "fetch failed: %r", "y", **REPEATS)
    )
    assert repeats.filter(record("callgate.worker", logging.WARNING, "pausing"))
    assert repeats.filter(record("callgate.worker", logging.WARNING, "pausing"))
    # a client's INFO is no repeat
    assert repeats.filter(record("aiokafka", logging.INFO, "Discovered coordinator"))
    now[0] += 61  # a kind is written again once per reminder interval
    assert repeats.filter(record(client, logging.ERROR, "Failed fetch messages from %s", 6))
    state.observe("unreachable")
    now[0] += 61
    # nothing while Kafka is unreachable
    assert not repeats.filter(record(client, logging.ERROR, "Failed fetch messages from %s", 7))
    # a record passes each handler's filters: decided once
    assert not repeats.filter(failed[1])
    assert repeats.filter(failed[0])
    counted = series(scrape(metrics), "callgate_kafka_client_log_records_total")
    assert counted == {
        frozenset({("level", "error")}): 7.0,
        frozenset({("level", "warning")}): 2.0,
    }
    assert state.repeats == 9


def test_a_repeat_with_a_traceback_is_written_on_one_line(now: list[float]) -> None:
    repeats = RepeatFilter(BrokerState(lambda: now[0]), Metrics({}), lambda: now[0])
    try:
        raise ConnectionError("Connect call failed")
    except ConnectionError:
        made = logging.LogRecord(
            "aiokafka",
            logging.ERROR,
            __file__,
            1,
            "Unable connect to %s",
            ("node 1",),
            sys.exc_info(),
        )
    assert repeats.filter(made)
    assert made.exc_info is None
    assert made.levelname == "WARNING"  # the worker's own lines say what is an error
    assert logging.Formatter().format(made) == (
        "Unable connect to node 1: ConnectionError('Connect call failed')"
    )


def test_nothing_repeats_while_the_membership_is_taken_for_lost(now: list[float]) -> None:
    state = BrokerState(lambda: now[0])
    repeats = RepeatFilter(state, Metrics({}), lambda: now[0])

    def expired() -> logging.LogRecord:
        return record("aiokafka.consumer.group_coordinator", logging.ERROR, "Heartbeat expired")

    state.membership_lost = True
    assert not repeats.filter(expired())
    state.membership_lost = False
    assert repeats.filter(expired())


def test_nothing_repeats_once_the_rounds_stalled_past_the_session(now: list[float]) -> None:
    """A paused process runs again: the client's heartbeat may log before the worker's round
    ends and says it stalled; the stall is seen from the last round's end."""
    state = BrokerState(lambda: now[0], session_s=6.0)
    repeats = RepeatFilter(state, Metrics({}), lambda: now[0])

    def expired() -> logging.LogRecord:
        return record("aiokafka.consumer.group_coordinator", logging.ERROR, "Session expired")

    now[0] += 60  # no round ran yet: start-up is no stall
    assert not state.stalled
    state.round_ended()
    now[0] += 15
    assert state.stalled
    assert not repeats.filter(expired())
    state.round_ended()
    assert repeats.filter(expired())
