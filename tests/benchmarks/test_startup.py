"""The start-up benchmark's phase split (`benchmarks.startup.split`) on a recorded log: a
restart of `callgate run` on Apache Kafka with three checkpoint frames to restore, its JSON log
lines as the worker wrote them (aiokafka's among them), in `startup-restart.jsonl`. No timing
is measured here."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from benchmarks.startup import PHASES, restored_frames, split

#: recorded as the worker wrote it (trimmed; one stray line that is not JSON added)
RECORDED = (Path(__file__).parent / "startup-restart.jsonl").read_text().splitlines()


def _at(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


SPAWNED = _at("2026-12-05T17:14:25.493Z")


def _seconds(readable: str) -> dict[str, float]:
    phases = split(SPAWNED, RECORDED, _at(readable))
    assert [p["phase"] for p in phases] == [phase.name for phase in PHASES]
    assert sum(p["s"] for p in phases) == pytest.approx(_at(readable) - SPAWNED, abs=0.002)
    return {p["phase"]: p["s"] for p in phases}


def test_each_phase_ends_at_its_line_and_imports_end_where_the_settings_began() -> None:
    seconds = _seconds("2026-12-05T17:14:26.400Z")
    assert seconds == {
        # the first line (at .987) says: settings 25.9 ms, contracts 19.4 ms, the rest 3.0 ms
        "interpreter + imports": pytest.approx(0.446, abs=0.001),
        "settings": pytest.approx(0.026, abs=0.001),
        "contract registry compile": 0.019,
        "metrics + health server": 0.003,
        "broker connect + metadata": 0.004,
        "topic checks": 0.006,
        "topic provisioning": 0.07,
        "consumer + producer start": 0.007,
        "group join + assignment": 0.013,
        "restore": 0.051,
        "first fetch": 0.003,
        "first judged round": 0.001,
        "first event acknowledged": 0.202,
        "event readable": 0.056,
    }


def test_an_event_read_before_the_worker_noticed_its_acknowledgement_ends_the_start() -> None:
    # the worker notices acknowledgements between rounds; its next fetch waited for records
    seconds = _seconds("2026-12-05T17:14:26.167Z")
    assert seconds["first event acknowledged"] == pytest.approx(0.025, abs=0.001)
    assert seconds["event readable"] == 0.0


def test_a_log_without_a_boundary_line_is_an_error_that_names_it() -> None:
    without = [line for line in RECORDED if "first round judged" not in line]
    with pytest.raises(ValueError, match=r"first round judged.*first judged round"):
        split(SPAWNED, without, _at("2026-12-05T17:14:26.400Z"))


def test_a_first_line_without_its_durations_is_an_error() -> None:
    bare = [
        line.split(" (settings")[0] + '"}' if "health and" in line else line for line in RECORDED
    ]
    with pytest.raises(ValueError, match="gives no durations"):
        split(SPAWNED, bare, _at("2026-12-05T17:14:26.400Z"))


def test_the_restored_frames_are_counted_from_the_restore_lines() -> None:
    assert restored_frames(RECORDED) == 3
    assert restored_frames(RECORDED[:9]) == 0
