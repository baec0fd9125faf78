"""callgate's executor library: run each accepted call once, and answer the agent.

    executor = Executor(load_settings())

    @executor.tool("create_payment", arguments=Payment, retry_safe=True)
    async def pay(call: Call[Payment]) -> dict[str, str]:
        return await bank.transfer(call.arguments, idempotency_key=call.idempotency_key)

    async with executor:
        await executor.run()

- `Executor` (`callgate_executor.executor`): a consumer group on the validated topic; the
  execute contract (first result, the recorded result for an equal repeat, a conflict for a
  different request under the same key) held cluster-wide by a compacted executions topic;
  one result per call on the tool-results topic.
- `Call`, `ToolError` (`callgate_executor.handlers`): what a handler gets, and how it fails
  with a message for the agent.
- `retry_turn`, `result_turn` (`callgate_executor.agent`): a rejected event or a result as
  the next model turn for OpenAI Chat, OpenAI Responses and Anthropic.

Exceptions: a wrong registration or setting is `worker.errors.ConfigError`; Kafka failing is
`worker.errors.BrokerError`, and an executions topic that cannot be read is
`worker.errors.StateError` (both stop `Executor.run`). Whatever a handler raises becomes its
call's `failed` result, never a stopped executor.
"""

from __future__ import annotations

from callgate_executor.agent import NextTurn, Vendor, anthropic_user_turn, result_turn, retry_turn
from callgate_executor.executor import Executor
from callgate_executor.handlers import Call, ToolError

__all__ = [
    "Call",
    "Executor",
    "NextTurn",
    "ToolError",
    "Vendor",
    "anthropic_user_turn",
    "result_turn",
    "retry_turn",
]
