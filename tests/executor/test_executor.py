"""What an executor refuses before it connects: a tool with no contract, a handler twice, a
non-positive deadline, no handler at all; and its settings (its own group and transactional
ids, the gate's left as they are)."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from callgate_executor import Call, Executor
from callgate_executor.executor import executor_settings
from tests.support.executor import contract_settings
from worker.errors import ConfigError
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
