"""The published contract: each document is a schema, only grows against its released copy,
agrees with the typed model, and holds every record the tests make (the hook in conftest)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import orjson
import pytest
from pydantic import BaseModel

from callgate_executor import contract
from callgate_executor import executor as executing
from tests.datafiles import data_path
from tests.support import published
from worker._native import AssembledCall
from worker.compose import build_key_store, build_processor
from worker.core.events import read_idempotency_request
from worker.core.idempotency import resolve
from worker.core.processor import Route
from worker.published import Document, load
from worker.published import model as published_model
from worker.settings import Settings

RELEASED = "published-released"


@pytest.mark.parametrize("document", list(Document))
def test_each_document_is_a_2020_12_schema(document: Document) -> None:
    schema = load(document)
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$id"].endswith(f":v{document.value.rsplit('.v', 1)[1]}")


def _compat(old: Path, new: Path, mode: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker", "schemas", "compat", str(old), str(new), "--mode", mode],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("document", list(Document))
def test_each_document_only_grows_against_its_released_copy(
    document: Document, tmp_path: Path
) -> None:
    """Additive only within a major version, as `callgate schemas compat` says it: `forward` on
    the documents as published (a reader of the released version reads every record the
    current one allows: nothing widened, retyped, made optional or removed), and `backward` on
    their strict copies (every record the released version allowed is still allowed: nothing
    narrowed, no variant or member removed; members added are fine)."""
    released = data_path(RELEASED, document.path.name)
    forward = _compat(released, document.path, "forward")
    assert forward.returncode == 0, forward.stdout + forward.stderr
    strict_old, strict_new = tmp_path / "released.json", tmp_path / "current.json"
    strict_old.write_text(json.dumps(published.strict(json.loads(released.read_text()))))
    strict_new.write_text(json.dumps(published.strict(load(document))))
    backward = _compat(strict_old, strict_new, "backward")
    assert backward.returncode == 0, backward.stdout + backward.stderr


def test_the_compat_check_refuses_what_is_not_additive(tmp_path: Path) -> None:
    """The check above can fail: a member removed, a code set closed, a variant added."""
    released = data_path(RELEASED, Document.OUTCOME_EVENT.path.name)
    schema = json.loads(released.read_text())
    changes = {
        "removed": lambda s: s["$defs"]["accepted"]["properties"].pop("principal"),
        "widened": lambda s: s["$defs"]["source"]["properties"]["partition"].update(
            type=["integer", "null"]
        ),
        "optional": lambda s: s["$defs"]["rejected"]["required"].remove("retry_feedback"),
        "variant": lambda s: s["oneOf"].append(
            {"type": "object", "properties": {"outcome": {"const": "x"}}, "required": ["outcome"]}
        ),
    }
    for name, change in changes.items():
        changed = json.loads(json.dumps(schema))
        change(changed)
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(changed))
        assert _compat(released, path, "forward").returncode == 1, name
    added = json.loads(json.dumps(schema))
    added["$defs"]["accepted"]["properties"]["new_member"] = {"type": "string"}
    path = tmp_path / "added.json"
    path.write_text(json.dumps(added))
    assert _compat(released, path, "forward").returncode == 0


# -- the model ---------------------------------------------------------------------------------

KINDS: dict[str, type[BaseModel]] = {
    "accepted": published_model.Accepted,
    "rejected": published_model.Rejected,
    "incomplete": published_model.Incomplete,
    "pending_approval": published_model.PendingApproval,
}


def _members(model: type[BaseModel]) -> tuple[set[str], set[str]]:
    names = {field.alias or name for name, field in model.model_fields.items()}
    fields = model.model_fields.items()
    required = {field.alias or name for name, field in fields if field.is_required()}
    return names, required


@pytest.mark.parametrize(
    ("schema", "model"),
    [
        *((load(Document.OUTCOME_EVENT)["$defs"][k], m) for k, m in KINDS.items()),
        (load(Document.APPROVAL_DECISION), published_model.ApprovalDecision),
        (load(Document.TOOL_RESULT), published_model.ToolResult),
    ],
    ids=[*KINDS, "approval_decision", "tool_result"],
)
def test_the_model_has_every_member_of_its_schema(
    schema: dict[str, Any], model: type[BaseModel]
) -> None:
    names, required = _members(model)
    assert names == set(schema["properties"])
    # the model may default a member the schema requires (none is null-or-absent there)
    assert required <= set(schema["required"])


def test_the_model_reads_every_kind_and_ignores_members_it_does_not_know() -> None:
    processor = build_processor(Settings())
    records = [
        (
            b'{"stream_id":"s","call_id":"ok","kind":"tool_call","tool":"get_weather",'
            b'"delta":"{\\"city\\":\\"Oslo\\",\\"units\\":\\"celsius\\"}","final":true}'
        ),
        b'{"stream_id":"s","call_id":"bad","kind":"tool_call","tool":"get_weather","delta":"{","final":true}',
        b'{"stream_id":"s","call_id":"cut","kind":"tool_call","tool":"get_weather","delta":"{"}',
        b'{"stream_id":"s","kind":"end","finish_reason":"length"}',
    ]
    fed = [_record(i, value) for i, value in enumerate(records)]
    emissions = processor.feed("in", 0, fed)
    kinds = {type(published_model.parse_event(e.value)).__name__ for e in emissions}
    assert kinds == {"Accepted", "Rejected", "Incomplete"}
    event = orjson.loads(emissions[0].value)
    event["a_member_of_a_later_version"] = {"any": "thing"}
    assert published_model.parse_event(orjson.dumps(event)).event_id == event["event_id"]


def _record(offset: int, value: bytes) -> Any:
    class Record:
        topic, partition, timestamp, key, headers = "in", 0, None, b"s", ()

    record = Record()
    record.offset, record.value = offset, value  # type: ignore[attr-defined]
    return record


# -- the hook ----------------------------------------------------------------------------------


def test_every_producer_is_checked_where_the_product_calls_it() -> None:
    """The hook is in place: the chain's events, the key owner's rejections and the executor's
    results are checked as they are made (a producer renamed or moved fails here, not in
    silence)."""
    before = published.calls.copy()
    processor = build_processor(Settings())
    call = AssembledCall(
        "s",
        "pay",
        "create_payment",
        orjson.dumps(
            {
                "amount_minor": 100,
                "currency": "EUR",
                "recipient": "bob",
                "description": None,
                "idempotency_key": "k1",
            }
        ),
    )
    emission = processor.emit(call)
    assert emission.route is Route.IDEMPOTENCY
    keys = build_key_store(Settings())
    resolve(keys, emission.value, 1, 4096)
    other = AssembledCall(
        "s",
        "pay2",
        "create_payment",
        orjson.dumps(
            {
                "amount_minor": 200,
                "currency": "EUR",
                "recipient": "bob",
                "description": None,
                "idempotency_key": "k1",
            }
        ),
        first_offset=1,
    )
    resolve(keys, processor.emit(other).value, 2, 4096)  # a conflict: the owner's rejection
    # the executor's result of the accepted call, encoded where the executor encodes it
    accepted = read_idempotency_request(emission.value).event
    event = published_model.parse_event(accepted)
    assert isinstance(event, published_model.Accepted)
    executing.encode_result(contract.conflict_result(event))
    refund = AssembledCall(
        "s",
        "refund",
        "refund_payment",
        orjson.dumps(
            {
                "payment_id": "pay_1",
                "amount_minor": 100,
                "currency": "EUR",
                "reason": None,
                "idempotency_key": "r1",
            }
        ),
        first_offset=2,
    )
    assert resolve(keys, processor.emit(refund).value, 3, 4096).pending  # held for approval
    grown = published.calls - before
    for producer in published.PRODUCERS:
        assert grown[f"{producer.module}.{producer.name}"] >= 1, producer


def test_a_record_that_breaks_the_schema_fails_the_test_that_made_it() -> None:
    event = orjson.loads(
        b'{"event_id":"0123456789abcdef0123456789abcdef","outcome":"rejected","stream_id":"s",'
        b'"call_id":"c","tool":null,"schema":null,"phase":"assembly","error_code":"x",'
        b'"reason":null,"violations":[],"retry_feedback":{"error_type":"x","schema":null,'
        b'"instruction":"i","retryable":false,"violations":[]},"repairs":[],"retryable":false,'
        b'"idempotency_key":null,"duplicate_of":null,"source":{"topic":"t","partition":0,'
        b'"first_offset":0,"last_offset":0},"metrics":{"chunks":0,"bytes":0,'
        b'"duplicate_chunks":0,"phases_us":{}}}'
    )
    published.check_event(event)
    for broken in (
        {**event, "undeclared": 1},  # the strict copy closes every object
        {**event, "retryable": "no"},
        {k: v for k, v in event.items() if k != "source"},
        {**event, "outcome": "approved"},
    ):
        with pytest.raises(AssertionError, match="breaks the published schema"):
            published.check_event(broken)
