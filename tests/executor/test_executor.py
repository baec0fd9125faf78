"""What an executor refuses before it connects: a tool with no contract, a handler twice, a
non-positive deadline, no handler at all; and its settings (its own group and transactional
ids, the gate's left as they are). What it runs of a record, decided before any write: only a
call of a kind the client runs, and only under a contract of the call's schema version."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import orjson
import pytest
from aiokafka.structs import ConsumerRecord
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from callgate_executor import Call, Executor, contract
from callgate_executor.contract import Step
from callgate_executor.executor import executor_settings
from tests.support.executor import CONTRACTS, Judge, contract_settings
from worker.errors import ConfigError
from worker.model import CallKind
from worker.published.model import Accepted, parse_event
from worker.settings import Settings

#: a cluster nothing here connects to
NOWHERE = {"bootstrap_servers": "127.0.0.1:9"}


def _settings() -> Settings:
    return contract_settings(kafka=NOWHERE)


class Lookup(BaseModel):
    sku: str


async def lookup(call: Call[Lookup]) -> str:
    return call.arguments.sku


def test_a_tool_without_a_contract_is_refused() -> None:
    executor = Executor(_settings())
    with pytest.raises(ConfigError, match="no contract is registered for tool 'launch'"):
        executor.register("launch", lookup, arguments=Lookup, retry_safe=False)


def test_a_handler_twice_or_without_a_deadline_is_refused() -> None:
    executor = Executor(_settings())
    executor.tool("lookup", arguments=Lookup, retry_safe=False)(lookup)
    with pytest.raises(ValueError, match="registered already"):
        executor.register("lookup", lookup, arguments=Lookup, retry_safe=False)
    with pytest.raises(ConfigError, match="must be positive"):
        executor.register("pay", lookup, arguments=Lookup, retry_safe=False, timeout_s=0)


@pytest.mark.asyncio
async def test_an_executor_without_handlers_does_not_start() -> None:
    with pytest.raises(ConfigError, match="at least one handler"):
        await Executor(_settings()).start()


def test_the_executor_reads_the_settings_with_its_own_group() -> None:
    settings = contract_settings(
        kafka={**NOWHERE, "group_id": "gate"}, executor={"group_id": "runner", "results": "answers"}
    )
    mine = executor_settings(settings)
    assert (mine.kafka.group_id, mine.delivery.transactional_id_prefix) == ("runner", "runner")
    assert (settings.kafka.group_id, settings.delivery.transactional_id_prefix) == ("gate", None)
    assert (mine.executor.requests, mine.executor.executions) == (
        "runner.requests",
        "runner.executions",
    )


# -- what an executor runs: the client's kinds of call, each held to a contract of its version ---

JUDGE = Judge()
#: the kinds of call the client runs (README, "Contract kinds" and "Vendor formats"): a remote
#: MCP tool's approval request is approved by the client and run by OpenAI, never by the client
CLIENT_RUNS = {
    "function_call",
    "custom_tool_call",
    "apply_patch_call",
    "shell_call",
    "local_shell_call",
}
_EVENTS = {
    "lookup": JUDGE.accepted("lookup", {"sku": "s"}, call_id="kind-lookup"),
    "pay": JUDGE.accepted(
        "pay",
        {"amount_minor": 3, "currency": "EUR", "recipient": "acme", "idempotency_key": "kind"},
        call_id="kind-pay",
    ),
    "wire": JUDGE.approved("wire", {"amount_minor": 3, "idempotency_key": "kw"}, call_id="kind-w"),
}


class Pay(BaseModel):
    amount_minor: int


async def pay(call: Call[Pay]) -> str:
    return "paid"


def _record(value: bytes) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord("tool-calls.validated", 0, 3, 0, 0, b"k", value, None, 1, len(value), [])


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _passed_over(executor: Executor) -> float:
    registry = executor.metrics.registry
    return sum(
        sample.value
        for metric in registry.collect()
        if metric.name == "callgate_executor_calls"
        for sample in metric.samples
        if sample.name.endswith("_total") and sample.labels.get("outcome") == "passed_over"
    )


@settings(max_examples=150, deadline=None)
@given(
    tool=st.sampled_from(sorted(_EVENTS)),
    kind=st.sampled_from(sorted(CallKind)) | st.text(max_size=24),
    stated=st.booleans(),
)
def test_a_call_of_a_kind_the_client_does_not_run_is_never_run_and_is_counted(
    tool: str, kind: str, stated: bool
) -> None:
    """An accepted event of every call kind (an approved `mcp_approval_request` among them, with
    a handler for its tool): a call of a kind the client runs is answered as any other; any
    other kind (one callgate does not know included) is passed over, with no result, logged and
    counted `passed_over`, in either stage (the validated topic's, the requests topic's)."""
    executor = Executor(_settings())
    executor.register("lookup", lookup, arguments=Lookup, retry_safe=False)
    executor.register("pay", pay, arguments=Pay, retry_safe=False)
    executor.register("wire", pay, arguments=Pay, retry_safe=False)
    fields = orjson.loads(_EVENTS[tool])
    if stated or kind != "function_call":
        fields["call_kind"] = kind
    logged = _Lines()
    logger = logging.getLogger("callgate.executor")
    level = logger.level
    logger.addHandler(logged)
    logger.setLevel(logging.INFO)
    try:
        event = executor._call(_record(orjson.dumps(fields)))
    finally:
        logger.removeHandler(logged)
        logger.setLevel(level)
    if kind in CLIENT_RUNS:
        assert event is not None
        assert event.call_kind == kind
        assert executor._judged(event)[2] is None  # it runs
        assert _passed_over(executor) == 0
        return
    assert event is None, kind
    assert executor.stats["passed_over"] == 1
    assert _passed_over(executor) == 1
    assert any("passed over" in line for line in logged.lines)


@pytest.fixture(scope="module")
def two_versions(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The executor tests' contracts, with `lookup` at versions 1 and 2."""
    root = tmp_path_factory.mktemp("versions")
    shutil.copytree(CONTRACTS, root, dirs_exist_ok=True)
    first = root / "shop" / "lookup.v1.schema.json"
    shutil.copy(first, root / "shop" / "lookup.v2.schema.json")
    return root


@settings(max_examples=100, deadline=None)
@given(
    handler=st.sampled_from([None, "any", "1", "2", "3"]),
    contracts=st.sampled_from([("1",), ("1", "2")]),
    version=st.sampled_from(["1", "2", "3"]),
)
def test_a_call_with_a_handler_but_no_contract_of_its_version_never_runs(
    two_versions: Path, handler: str | None, contracts: tuple[str, ...], version: str
) -> None:
    """With a handler for the call's schema version (or for any) but no contract of that version
    in the executor's own registry, nothing holds the run to an allow list, an approval or an
    output schema: the call is refused `no_contract` (its answer, recorded; its key left free),
    as a call of a schema id it knows no contract of finds no handler. A call runs only with
    both."""
    settings_ = _settings()
    if contracts == ("1", "2"):
        settings_ = settings_.model_copy(
            update={"schemas": settings_.schemas.model_copy(update={"dir": two_versions})}
        )
    executor = Executor(settings_)
    if handler is not None:
        at = None if handler == "any" else handler
        executor.register("lookup", lookup, arguments=Lookup, retry_safe=True, version=at)
    event = parse_event(_EVENTS["lookup"])
    assert isinstance(event, Accepted)
    event = event.model_copy(
        update={"schema_ref": event.schema_ref.model_copy(update={"version": version})}
    )
    spec, _, refusal = executor._judged(event)
    handled = handler in ("any", version)
    assert (spec is not None) is handled
    if not handled:
        assert refusal == contract.NO_HANDLER
    elif version not in contracts:
        assert refusal == contract.NO_CONTRACT, (handler, contracts, version)
    else:
        assert refusal is None
    answer = contract.answer(event, {}, refusal=refusal, retry_safe=True)
    assert (answer.step is Step.RUN) is (refusal is None)
    if refusal is not None:
        assert answer.result is not None
        assert answer.result.error == refusal
        assert [r.key for r in answer.records] == [contract.answered_key(event.event_id)]
