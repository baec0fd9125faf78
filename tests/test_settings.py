"""The settings: topics that would feed the gate its own output are refused at start; a
variable that sets nothing is refused; a wrong value is named where it was set."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from tests.datafiles import SCHEMAS
from worker._native import AssembledCall, encode_event
from worker.compose import build_assembler, build_decoder
from worker.errors import ConfigError
from worker.model import Code, Outcome, Phase, Verdict
from worker.runtime.topics import changelog_topic, keys_topic, requests_topic
from worker.settings import (
    MAX_LIMIT,
    Settings,
    load_settings,
    setting_fields,
    unknown_variables,
)

GROUP = "gate"
TOPICS = {"accepted": "ok", "rejected": "no", "incomplete": "partial"}


def settings_with(**topics: str) -> Any:
    return load_settings(
        kafka={"bootstrap_servers": ["k:9092"], "group_id": GROUP},
        topics={**TOPICS, **topics},
        schemas={"dir": SCHEMAS},
    )


@given(
    own=st.sampled_from(
        [
            *TOPICS.values(),
            requests_topic(GROUP),
            keys_topic(GROUP),
            changelog_topic(GROUP, "in"),
            changelog_topic(GROUP, "x" * 300),
        ]
    ),
    others=st.lists(st.from_regex(r"in[a-z]{0,5}", fullmatch=True), max_size=3),
)
def test_an_outcome_or_internal_topic_named_as_input_is_refused(
    own: str, others: list[str]
) -> None:
    with pytest.raises(ConfigError, match="would be judged again, for ever") as refused:
        settings_with(input=",".join([*others, own]))
    assert repr(own) in str(refused.value)
    assert "CALLGATE_" in str(refused.value)


def test_inputs_apart_from_the_outputs_are_taken() -> None:
    settings = settings_with(input="in,gate-input")
    assert settings.topics.input_topics == ["in", "gate-input"]
    # outcomes may share a topic (every event names its outcome): still never input
    shared = settings_with(input="in", accepted="all", rejected="all", incomplete="all")
    assert shared.topics.accepted == shared.topics.rejected == "all"
    with pytest.raises(ConfigError, match=r"input topics \['all'\]"):
        settings_with(input="in,all", accepted="all", rejected="all", incomplete="all")


# -- where a wrong value came from ----------------------------------------------------------------

KNOWN = [env for env, _ in setting_fields()]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in list(os.environ):
        if name.upper().startswith("CALLGATE_"):
            monkeypatch.delenv(name)
    return monkeypatch


def _mutations(name: str) -> st.SearchStrategy[str]:
    """Misspellings of a setting's name: a character dropped, doubled or changed, or its
    nesting written with one underscore."""
    body = name.removeprefix("CALLGATE_")
    positions = st.integers(0, len(body) - 1)
    return st.one_of(
        positions.map(lambda i: body[:i] + body[i + 1 :]),
        positions.map(lambda i: body[:i] + body[i] + body[i:]),
        st.tuples(positions, st.sampled_from("ABCXYZ_")).map(
            lambda t: body[: t[0]] + t[1] + body[t[0] + 1 :]
        ),
        st.just(body.replace("__", "_")),
    ).map(lambda misspelt: "CALLGATE_" + misspelt)


@given(data=st.data(), name=st.sampled_from(KNOWN))
def test_a_misspelt_variable_is_refused_naming_a_setting(data: st.DataObject, name: str) -> None:
    misspelt = data.draw(_mutations(name).filter(lambda n: n.upper() not in KNOWN))
    misspelt = data.draw(st.sampled_from([misspelt, misspelt.lower()]))
    (problem,) = unknown_variables({misspelt: "1", "PATH": "/bin", "CALLGATE_LOG_LEVEL": "x"})
    assert problem.startswith(f"{misspelt} is not a setting")
    suggested = re.fullmatch(r".* \(did you mean (\S+)\?\)", problem)
    if suggested:
        assert suggested[1] in KNOWN
    if misspelt.upper() == name.replace("__", "_"):  # one underscore where two nest
        assert suggested, problem
        assert suggested[1] == name


def test_every_setting_and_every_section_is_a_known_variable() -> None:
    sections = {f"CALLGATE_{name.upper()}" for name in Settings.model_fields}
    everything = dict.fromkeys([*KNOWN, *sections], "1")
    assert unknown_variables(everything) == []
    assert unknown_variables({name.lower(): "1" for name in everything}) == []


def test_load_refuses_an_unknown_variable(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("CALLGATE_LOGLEVEL", "debug")
    with pytest.raises(ConfigError, match=r"CALLGATE_LOGLEVEL is not a setting \(did you mean "):
        load_settings()


@given(level=st.sampled_from(["debug", "info", "warning", "error"]), data=st.data())
def test_level_names_are_read_in_any_case(level: str, data: st.DataObject) -> None:
    spelt = "".join(data.draw(st.sampled_from([c.lower(), c.upper()]), label=c) for c in level)
    assert Settings(log_level=spelt).log_level == level.upper()
    with pytest.raises(ValidationError):
        Settings(log_level=spelt + "x")


@given(data=st.data())
def test_the_log_format_is_read_in_any_case(data: st.DataObject) -> None:
    for name in ("text", "json"):
        spelt = "".join(data.draw(st.sampled_from([c.lower(), c.upper()]), label=c) for c in name)
        assert Settings(log={"format": spelt}).log.format == name


@pytest.mark.parametrize(
    ("endpoint", "url"),
    [
        ("http://127.0.0.1:4318", "http://127.0.0.1:4318/v1/traces"),
        ("http://127.0.0.1:4318/", "http://127.0.0.1:4318/v1/traces"),
        ("https://otel.example:443/custom/traces", "https://otel.example:443/custom/traces"),
    ],
)
def test_spans_go_to_the_endpoint_or_its_traces_path(endpoint: str, url: str) -> None:
    assert Settings(tracing={"endpoint": endpoint}).tracing.traces_url == url


#: a wrong value for a setting in each section, and the message's words
WRONG = [
    (("kafka", "group_id"), "bad group", "String should match pattern"),
    (("kafka", "bootstrap_servers"), "k1:9092,k2", "'k2' is not host:port"),
    (("kafka", "ssl_cafile"), "/no/such/ca.pem", "no such file: /no/such/ca.pem"),
    (("topics", "replication_factor"), "0", "greater than or equal to 1"),
    (("limits", "max_event_bytes"), "1", "greater than or equal to 65536"),
    (("idempotency", "partitions"), "none", "valid integer"),
    (("log_level",), "LOUD", "Input should be"),
    (("log", "format"), "yaml", "Input should be 'text' or 'json'"),
    (("tracing", "endpoint"), "collector:4318", "is not an http:// or https:// URL"),
    (("tracing", "sample_ratio"), "1.5", "less than or equal to 1"),
]


@pytest.mark.parametrize(("path", "value", "words"), WRONG)
def test_a_wrong_value_is_named_where_it_was_set(
    clean_env: pytest.MonkeyPatch,
    tmp_path: Path,
    path: tuple[str, ...],
    value: str,
    words: str,
) -> None:
    env_name = "CALLGATE_" + "__".join(part.upper() for part in path)
    file = tmp_path / "settings.json"
    nested: dict[str, Any] = {path[-1]: value}
    for part in reversed(path[:-1]):
        nested = {part: nested}
    file.write_bytes(orjson.dumps(nested))
    # in the file: the file and its key, and no environment variable
    with pytest.raises(ConfigError) as in_file:
        load_settings(file)
    message = str(in_file.value)
    assert f"{file}: {'.'.join(path)}: " in message
    assert words in message
    assert env_name not in message
    # in the environment: the variable (it overrides the file's value, which is not named)
    clean_env.setenv(env_name, value)
    with pytest.raises(ConfigError) as in_env:
        load_settings(file)
    assert f"{env_name}: " in str(in_env.value)
    assert words in str(in_env.value)
    assert str(file) not in str(in_env.value)


def test_a_check_across_a_section_names_each_source_it_read(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    file = tmp_path / "settings.json"
    file.write_bytes(orjson.dumps({"kafka": {"sasl_username": "gate"}}))
    clean_env.setenv("CALLGATE_KAFKA__SECURITY_PROTOCOL", "SASL_SSL")
    with pytest.raises(ConfigError) as both:
        load_settings(file)
    assert f"CALLGATE_KAFKA__* and {file}: kafka: SASL_SSL needs sasl_mechanism" in str(both.value)
    clean_env.delenv("CALLGATE_KAFKA__SECURITY_PROTOCOL")
    file.write_bytes(orjson.dumps({"kafka": {"security_protocol": "SASL_SSL"}}))
    with pytest.raises(ConfigError, match=rf"invalid settings: {re.escape(str(file))}: kafka: "):
        load_settings(file)


def test_the_shadow_topic_needs_candidate_contracts_and_is_never_input(
    clean_env: pytest.MonkeyPatch,
) -> None:
    clean_env.setenv("CALLGATE_SHADOW__TOPIC", "flips")
    with pytest.raises(ConfigError, match=r"CALLGATE_SHADOW.*needs the candidate contracts"):
        load_settings(schemas={"dir": SCHEMAS})
    clean_env.setenv("CALLGATE_SHADOW__SCHEMAS", str(SCHEMAS))
    settings = load_settings(schemas={"dir": SCHEMAS})
    assert settings.written_topics[-1] == "flips"
    clean_env.setenv("CALLGATE_TOPICS__INPUT", "in,flips")
    with pytest.raises(ConfigError, match=r"input topics \['flips'\].*shadow topic"):
        load_settings(schemas={"dir": SCHEMAS})


# -- every limit has an upper bound ----------------------------------------------------------------

#: the settings the native core takes (a byte or count bound, a time it holds in milliseconds)
NATIVE_BOUNDS = [
    *(
        f"CALLGATE_LIMITS__{name.upper()}"
        for name in (
            "max_bytes",
            "max_chunks",
            "max_open_calls_per_partition",
            "max_message_bytes",
            "max_feedback_bytes",
            "max_violations",
            "max_event_bytes",
            "recently_closed_per_partition",
        )
    ),
    "CALLGATE_ASSEMBLY__IDLE_TIMEOUT_S",
    "CALLGATE_ASSEMBLY__MAX_CALL_LIFETIME_S",
]


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from(NATIVE_BOUNDS),
    value=st.one_of(
        st.integers(min_value=MAX_LIMIT - 2, max_value=MAX_LIMIT + 2),
        st.integers(min_value=2**31, max_value=2**80),
        st.sampled_from([2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 2**64 + 1]),
    ),
)
def test_a_limit_past_its_bound_is_refused_naming_it(name: str, value: int) -> None:
    """A value the settings take builds the native core and writes an event under it; one
    past `MAX_LIMIT` is a settings error naming its variable, never an overflow at start."""
    with pytest.MonkeyPatch.context() as env:
        for other in list(os.environ):
            if other.upper().startswith("CALLGATE_"):
                env.delenv(other)
        env.setenv(name, str(value))
        try:
            taken: Settings | ConfigError = load_settings(schemas={"dir": SCHEMAS})
        except ConfigError as exc:
            taken = exc
    if isinstance(taken, ConfigError):
        assert value > MAX_LIMIT or "max_event_bytes must hold" in str(taken)
        assert f"{name}: " in str(taken) or "CALLGATE_LIMITS__*" in str(taken), taken
        return
    assert value <= MAX_LIMIT
    build_assembler(taken)
    build_decoder(taken)
    call = AssembledCall("s", "c", "t", b"{}")
    verdict = Verdict(Outcome.REJECTED, phase=Phase.ASSEMBLY, code=Code.MALFORMED_RECORD)
    assert encode_event(call, verdict, taken.limits.max_event_bytes) is not None
    limits = taken.limits.violation_limits()
    assert limits.max_violations == taken.limits.max_violations
