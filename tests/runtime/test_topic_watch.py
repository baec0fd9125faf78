"""The topic watch: checks at most once per interval, at once after a failing write, and what a
finished check found (state topics gone, topics written to missing and back)."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka.errors import KafkaError, RequestTimedOutError
from hypothesis import given
from hypothesis import strategies as st

from worker.runtime.topic_watch import MISSING, STATE_GONE_AFTER_S, Found, TopicWatch

pytestmark = pytest.mark.asyncio

WRITTEN = ["accepted", "rejected", "requests"]
STATE = ["keys", "in-changelog"]


class Cluster:
    """The topics the check lists, and how many checks ran."""

    def __init__(self) -> None:
        self.gone: set[str] = set()
        self.checks = 0
        self.error: KafkaError | None = None

    async def missing_topics(self, topics: list[str]) -> list[str]:
        self.checks += 1
        if self.error is not None:
            raise self.error
        return sorted(set(topics) & self.gone)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def new_watch() -> tuple[TopicWatch, Cluster, Clock]:
    cluster, clock = Cluster(), Clock()
    watch = TopicWatch(cluster.missing_topics, clock, 1.0, WRITTEN)
    watch.watch_state(STATE)
    return watch, cluster, clock


async def checked(watch: TopicWatch) -> Found | None:
    watch.check_when_due()
    await watch.wait(1.0)
    return watch.finished()


async def test_a_check_runs_once_per_interval_and_at_once_after_a_failing_write() -> None:
    watch, cluster, clock = new_watch()
    assert await checked(watch) == Found()
    assert watch.verified_at == 100.0
    assert await checked(watch) is None  # within the interval: no check
    watch.write_failing("accepted", RequestTimedOutError())
    assert await checked(watch) == Found()
    assert cluster.checks == 2
    assert watch.failing == {"accepted": "RequestTimedOutError()"}
    watch.write_failing("accepted", RequestTimedOutError())  # failing already: not sooner
    assert await checked(watch) is None
    clock.now += 1.0
    assert await checked(watch) == Found()
    watch.write_recovered("accepted")
    assert watch.failing == {}


async def test_a_state_topic_gone_is_found_before_anything_else() -> None:
    """Once every check has missed it for `STATE_GONE_AFTER_S`; meanwhile nothing is
    verified (no checkpoint is sent), and nothing else is acted on."""
    watch, cluster, clock = new_watch()
    assert await checked(watch) == Found()
    verified = watch.verified_at
    cluster.gone = {"in-changelog", "accepted"}
    clock.now += 1.0
    first_miss = clock.now
    while clock.now - first_miss < STATE_GONE_AFTER_S:
        assert await checked(watch) == Found()
        assert watch.verified_at == verified
        clock.now += 1.0
    assert await checked(watch) == Found(state_gone=("in-changelog",))
    assert watch.failing == {}


@given(seen=st.lists(st.booleans(), min_size=1, max_size=30))
async def test_a_state_topic_a_check_misses_now_and_then_is_never_taken_for_gone(
    seen: list[bool],
) -> None:
    """A node that has not caught up with the cluster answers for a check now and then (the
    state topics are made at start, and a topic made a moment ago is not known to every broker
    at once): the topic is gone only once every check for `STATE_GONE_AFTER_S` missed it."""
    watch, cluster, clock = new_watch()
    missed_since: float | None = None
    for found in [*seen, True]:
        cluster.gone = set() if found else {"keys"}
        clock.now += 1.0
        missed_since = None if found else (clock.now if missed_since is None else missed_since)
        gone = missed_since is not None and clock.now - missed_since >= STATE_GONE_AFTER_S
        outcome = await checked(watch)
        assert outcome == Found(state_gone=("keys",) if gone else ())
        if gone:
            return
        assert (watch.verified_at == clock.now) is found


async def test_a_topic_missing_stays_missing_until_a_check_finds_it_back() -> None:
    watch, cluster, clock = new_watch()
    cluster.gone = {"rejected"}
    assert await checked(watch) == Found(newly_missing=("rejected",))
    assert watch.missing
    clock.now += 1.0
    assert await checked(watch) == Found(), "missing still: no news, no second rewind"
    assert watch.missing
    assert watch.verified_at == float("-inf")
    watch.write_failing("rejected", RequestTimedOutError())  # says no more than the check
    watch.write_recovered("accepted")
    assert watch.failing == {"rejected": MISSING}
    cluster.gone = set()
    clock.now += 1.0
    assert await checked(watch) == Found()
    assert not watch.missing
    assert watch.verified_at == clock.now


async def test_a_check_that_fails_finds_nothing_and_a_later_one_runs() -> None:
    watch, cluster, clock = new_watch()
    cluster.error = KafkaError("no broker")
    assert await checked(watch) is None
    cluster.error = None
    clock.now += 1.0
    assert await checked(watch) == Found()


@given(rounds=st.lists(st.sets(st.sampled_from(WRITTEN)), min_size=1, max_size=8))
async def test_what_is_missing_is_what_the_last_check_found(rounds: list[set[str]]) -> None:
    watch, cluster, clock = new_watch()
    before: set[str] = set()
    for gone in rounds:
        cluster.gone = gone
        clock.now += 1.0
        found = await checked(watch)
        assert found == Found(newly_missing=tuple(sorted(gone - before)))
        assert {t for t, why in watch.failing.items() if why == MISSING} == gone
        before = gone
        assert watch.missing is bool(gone)
    watch.cancel()
    await asyncio.sleep(0)
