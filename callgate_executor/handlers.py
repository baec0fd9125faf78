"""Handlers: what an executor runs per tool (and version), and one run of one of them.

A handler is an async function of a `Call`: its arguments typed by the pydantic model the
handler registers (read from the accepted event's arguments; arguments the model refuses are a
`refused` result and the handler never sees them), the accepted event itself (the published
model), its idempotency key (to pass on to any system that can deduplicate by it), its trace
context, its deadline, and `emit` for records it wants written with its result (in the same
Kafka transaction under exactly_once). What it returns is the tool's output: a JSON value or a
pydantic model.

`run_handler` runs one call within its deadline and says what came of it: `succeeded` (the
output, held to the contract's output schema through the gate's tool-output path, as an MCP
`structuredContent` would be), `failed` (the handler raised; only a `ToolError`'s message
reaches the agent, any other exception is named by its class and logged), `timed_out`.

Whatever the tool's own code raises (its handler, its argument or output model), any
`BaseException` included, is its call's failure (`argument_type` before a run, `failed` after
one), never the executor's: only the executor cancelling the task of a run (its stop, a
partition revoked past its grace: `executor_cancelling`) stops the run, and then nothing of it
is recorded, even when the handler swallows the cancellation and returns an output. A
`CancelledError` the handler raises itself is its failure like any other.

Nor is the process being interrupted: a `KeyboardInterrupt` that SIGINT raised (Python's
default handler, or asyncio.run's at a second Ctrl-C) lands in whatever code runs at that
moment, a handler's too. While the executor runs, SIGINT's handler is wrapped
(`note_interrupts`) so that such an interrupt is told from one the tool's code raises itself
(`raise_if_interrupted`): it stops the run, records nothing, and goes on to stop the process.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Generic, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from callgate_executor.contract import Emitted, Outcome
from worker.core.tool_output import check_tool_result
from worker.published.model import Accepted, ResultError, ResultStatus
from worker.schemas.contract import CompiledCheck

log = logging.getLogger("callgate.executor")

A = TypeVar("A", bound=BaseModel)

#: The longest message of a `ToolError` that reaches the agent (longer ones are cut).
MAX_ERROR_MESSAGE = 512


class ToolError(Exception):
    """Raised by a handler to fail its call with a message meant for the agent (bounded to
    `MAX_ERROR_MESSAGE` characters); `type` names the failure (default: the class name)."""

    def __init__(self, message: str, *, type: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.type = type or self.__class__.__name__


@dataclass(slots=True)
class Call(Generic[A]):
    """One accepted call as its handler sees it."""

    arguments: A
    event: Accepted
    #: the call's idempotency key (None when its contract has none): give it to any system
    #: that deduplicates by it (a payment API, a database's unique key)
    idempotency_key: str | None
    #: what the execution is recorded under (`key:<idempotency key>` or `event:<event id>`)
    execution_key: str
    #: W3C trace context the call carried (None when it had none)
    traceparent: str | None
    #: when the executor stops waiting for the handler, as `time.time()` seconds
    deadline: float
    #: which run of this execution this is (more than 1 only for a handler safe to retry,
    #: after an executor died during an earlier run)
    attempt: int
    emitted: list[Emitted] = field(default_factory=list)

    def remaining_s(self) -> float:
        """Seconds left before the deadline (never negative)."""
        return max(0.0, self.deadline - time.time())

    def emit(self, topic: str, value: bytes, *, key: bytes | None = None) -> None:
        """Write `value` to `topic` together with this call's result: under exactly_once in the
        same Kafka transaction (both or neither), else just before it. Dropped if the handler
        does not succeed. The call fails instead, writing none, when a record is not bytes to a
        topic of the application's, or its key and value pass CALLGATE_LIMITS__MAX_EVENT_BYTES
        (`contract.ran`)."""
        self.emitted.append(Emitted(topic, key, value))


Handler = Callable[[Call[Any]], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class HandlerSpec:
    """A registered handler: for which tool (the name it was registered by, and the schema id
    of its contract: what a call is known by) and version (None: any), its arguments' type,
    whether running it again after an interruption is safe, and its deadline."""

    tool: str
    schema_id: str
    version: str | None
    handler: Handler
    arguments: type[BaseModel]
    retry_safe: bool
    timeout_s: float


class Handlers:
    """The registered handlers, looked up by a call's schema id and version: the identity its
    approval and its output are judged by too (the event's `tool` is never looked up, so a
    handler never runs a call judged under another contract than its own)."""

    def __init__(self) -> None:
        self._specs: dict[tuple[str, str | None], HandlerSpec] = {}

    def add(self, spec: HandlerSpec) -> None:
        where = (spec.schema_id, spec.version)
        if where in self._specs:
            version = "any version" if spec.version is None else f"version {spec.version}"
            raise ValueError(
                f"a handler for {spec.tool!r} ({spec.schema_id}, {version}) is registered already"
            )
        self._specs[where] = spec

    def find(self, event: Accepted) -> HandlerSpec | None:
        """The handler for this call: its schema id and version's, else its schema id's for
        any version."""
        schema = event.schema_ref
        return self._specs.get((schema.id, schema.version)) or self._specs.get((schema.id, None))

    def __len__(self) -> int:
        return len(self._specs)


def executor_cancelling() -> bool:
    """Whether the executor is cancelling the running task (`Task.cancel`: its stop, a partition
    revoked past its grace), as opposed to a `CancelledError` raised by the tool's own code.
    A cancellation reaches a task only where it awaits, so only an awaited handler sees one."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


@dataclass(slots=True)
class _Interrupts:
    """The `KeyboardInterrupt`s SIGINT raised while `note_interrupts` was installed, and who
    installed it (the executors running in the process)."""

    count: int = 0
    last: BaseException | None = None
    users: int = 0
    #: SIGINT's handler as it was found, and the wrapper installed over it
    previous: Any = None
    noting: Any = None


_INTERRUPTS = _Interrupts()


def note_interrupts() -> Callable[[], None]:
    """Wrap SIGINT's handler (in the main thread, when it is a Python function) so that each
    `KeyboardInterrupt` it raises is noted (`interrupts`, `raise_if_interrupted`); it still
    raises it there and then. Returns what its user calls when done: the handler is put back
    once every user is (unless another was installed since). An event loop's own SIGINT
    handler (`loop.add_signal_handler`, as `serve` installs) raises nothing, and keeps
    working: the loop hears of the signal apart."""
    noted = _INTERRUPTS
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    if noted.users == 0:
        previous = signal.getsignal(signal.SIGINT)
        if not callable(previous):
            return lambda: None
        handler = previous

        def noting(signum: int, frame: FrameType | None) -> Any:
            try:
                return handler(signum, frame)
            except KeyboardInterrupt as exc:
                noted.count += 1
                noted.last = exc
                raise

        signal.signal(signal.SIGINT, noting)
        noted.previous, noted.noting = previous, noting
    noted.users += 1
    done = False

    def restore() -> None:
        nonlocal done
        if done:
            return
        done = True
        noted.users -= 1
        if noted.users == 0:
            if signal.getsignal(signal.SIGINT) is noted.noting:
                signal.signal(signal.SIGINT, noted.previous)
            noted.previous = noted.noting = None

    return restore


def interrupts() -> int:
    """How many `KeyboardInterrupt`s SIGINT has raised so far (`raise_if_interrupted`)."""
    return _INTERRUPTS.count


def raise_if_interrupted(since: int) -> None:
    """Raise the last `KeyboardInterrupt` SIGINT raised, when one was raised since `since`
    (`interrupts()` as a run began): the process is being stopped, which is never a call's
    result, whatever the code it landed in made of it (let it through, made another exception
    of it, as pydantic's serializer does, or swallowed it)."""
    if _INTERRUPTS.count > since and _INTERRUPTS.last is not None:
        raise _INTERRUPTS.last


def typed_arguments(spec: HandlerSpec, event: Accepted) -> BaseModel | ResultError:
    """The call's arguments as the handler's model reads them, or why they cannot be (the
    model's refusal named by location and type only, never an argument's value; a validator
    that raised anything else is named by the exception's class, and logged)."""
    since = interrupts()
    try:
        typed = spec.arguments.model_validate(event.arguments)
        raise_if_interrupted(since)  # its validator swallowed a Ctrl-C
        return typed
    except ValidationError as exc:
        where = "; ".join(
            f"{'/'.join(str(part) for part in error['loc']) or '/'}: {error['type']}"
            for error in exc.errors()[:8]
        )
        return ResultError(
            type="argument_type",
            message=f"the handler's argument type refuses the arguments ({where})"[
                :MAX_ERROR_MESSAGE
            ],
        )
    except BaseException as exc:  # the tool's own code: see the module docstring
        raise_if_interrupted(since)
        log.error("argument type of %s failed on call %s", spec.tool, event.call_id, exc_info=exc)
        return ResultError(
            type="argument_type",
            message=f"the handler's argument type failed on the arguments ({_named(exc)})",
        )


async def run_handler(
    spec: HandlerSpec,
    call: Call[Any],
    output_check: CompiledCheck | None,
    max_depth: int,
) -> Outcome:
    """One run of `spec`'s handler on `call`, within `spec.timeout_s` (see the module
    docstring). The executor's cancellation propagates, whatever the handler made of it, and
    so does SIGINT's interrupt (`raise_if_interrupted`): nothing is recorded."""
    deadline = asyncio.timeout(spec.timeout_s)
    since = interrupts()
    try:
        async with deadline:
            output = await spec.handler(call)
        if executor_cancelling():
            # it swallowed the executor's cancellation and returned: the run stops all the same
            raise asyncio.CancelledError
        outcome = checked_output(output, output_check, max_depth)
        raise_if_interrupted(since)  # its code swallowed a Ctrl-C: the run stops all the same
        return outcome
    except BaseException as exc:  # the tool's own code: see the module docstring
        if executor_cancelling():
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise asyncio.CancelledError from exc
        raise_if_interrupted(since)
        if deadline.expired():
            return Outcome(
                ResultStatus.TIMED_OUT,
                error=ResultError(
                    type="deadline",
                    message=f"the tool did not finish within its deadline of {spec.timeout_s:g} s",
                ),
            )
        if (
            isinstance(exc, ToolError)
            and isinstance(exc.type, str)
            and isinstance(exc.message, str)
        ):
            return Outcome(
                ResultStatus.FAILED,
                error=ResultError(type=exc.type, message=exc.message[:MAX_ERROR_MESSAGE]),
            )
        log.error("handler of %s failed on call %s", spec.tool, call.event.call_id, exc_info=exc)
        return Outcome(
            ResultStatus.FAILED, error=ResultError(type=_named(exc), message="the tool failed")
        )


def _named(exc: BaseException) -> str:
    return type(exc).__name__


def checked_output(output: Any, output_check: CompiledCheck | None, max_depth: int) -> Outcome:
    """`succeeded` with the output as JSON, or `failed` when it is not JSON or its contract's
    output schema refuses it (judged by the gate's tool-output phase, as structuredContent)."""
    if isinstance(output, BaseModel):
        output = output.model_dump(mode="json", by_alias=True)
    try:
        output = orjson.loads(orjson.dumps(output))
    except (TypeError, orjson.JSONEncodeError):
        return Outcome(
            ResultStatus.FAILED,
            error=ResultError(type="output_not_json", message="the tool returned no JSON value"),
        )
    finding = check_tool_result(
        {"result": {"content": [], "structuredContent": output}}, output_check, max_depth
    )
    if finding is not None:
        where = ", ".join(f"{v.path} ({v.keyword})" for v in finding.violations[:8])
        return Outcome(
            ResultStatus.FAILED,
            error=ResultError(
                type=str(finding.code or "output_schema_violation"),
                message=f"the tool's output breaks its output schema at {where}"[
                    :MAX_ERROR_MESSAGE
                ],
            ),
        )
    return Outcome(ResultStatus.SUCCEEDED, output=output)
