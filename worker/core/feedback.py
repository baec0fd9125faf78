"""Retry feedback: what a rejected call tells the model, safe to hand back to it.

It names the error type, the schema id and version, each violation's path, keyword and message, and
one instruction. It never holds raw input: violation messages are built by the engines from the
schema, never from the instance (a record that cannot be read says only `MALFORMED_RECORD_MESSAGE`;
why is the producer's text, kept in the operator's log), and a violation path names an object key
only when the schema declares that name (`Contract.declared_names`); any other key, which the model
or whatever fed it chose (`/password=hunter2`), is replaced by `UNDECLARED`. Array indices stay,
where the arguments show a position is one. Where a document nests another schema's value (an MCP
result's `structuredContent`, judged by the tool's output schema), the names are judged by where
they stand (`Scoped`): the envelope's own members above it, only that schema's names below. The
event's own violations keep the real path (for operators). A refusal by authorization
(`unauthorized`, `authorizer_error`) shows no violation at all and is `unauthorized` either way:
the model learns that the call is not permitted, never which rule or principal decided it, nor that
a rule failed (the event's own code and violations say, for operators). It is bounded in size:
violations are dropped from the end, and the count of dropped ones is said, until the encoded
object fits; the encoding that fits is the one the event embeds. What is left when none is shown
(the code's instruction, the schema's id and version, the count) always fits: the settings, and the
composition for each contract, refuse a bound that could not hold it (`largest_feedback_bytes`).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from worker.model import Code, Feedback, SchemaRef, Violation
from worker.schemas.contract import CUT
from worker.schemas.drafts import escape

#: What the event and the feedback of a `malformed_record` rejection say, whatever the record held.
MALFORMED_RECORD_MESSAGE = "the record is not a readable chunk of its format; it was not judged"
#: What stands in a feedback path for an object key the schema does not declare.
UNDECLARED = "<undeclared>"
#: "The arguments are not known": no position in a path can be shown to be an array index.
NO_ARGUMENTS: Any = object()


@dataclass(frozen=True, slots=True)
class Scoped:
    """The names a path may show by where they stand: `outer` down to the tokens `at` (which
    `outer` must name to be shown) and `inner` below them, where another schema's value is."""

    outer: frozenset[str]
    at: tuple[str, ...]
    inner: frozenset[str]


#: The names a feedback path may show: one set for every position, or `Scoped`.
Names = frozenset[str] | Scoped


@dataclass(frozen=True, slots=True)
class _Element:
    """An array known only by one element: `node` at index `at`."""

    at: int
    node: Any


def arguments_of_path(path: Iterable[str | int]) -> Any:
    """What a typed path (a key a string, an array index an int, as the reassembler's early
    judge reports one) shows of the arguments it points into: enough for `feedback_path` to
    show its indices as the whole arguments would, and nothing of any other position."""
    node: Any = NO_ARGUMENTS
    for token in reversed(tuple(path)):
        node = _Element(token, node) if type(token) is int else {token: node}
    return node


_INSTRUCTIONS: Mapping[Code, str] = {
    Code.INVALID_JSON: "Send the arguments as one complete JSON object and nothing else: "
    "no trailing commas, comments, single quotes or text around it.",
    Code.DUPLICATE_KEY: "Send each property of an object once.",
    Code.NON_FINITE_NUMBER: "Use finite numbers only; NaN and Infinity are not allowed.",
    Code.INEXACT_NUMBER: "Write each number exactly: an integer within 64 bits, or a decimal "
    "of at most 17 significant digits as a 64-bit float prints it.",
    Code.INVALID_UTF8: "Send the arguments as valid UTF-8 text without lone surrogates.",
    Code.ROOT_NOT_OBJECT: "Send the arguments as a JSON object, not an array or a scalar.",
    Code.TOO_LARGE: "Send smaller arguments; the call exceeded the size limit.",
    Code.TOO_DEEP: "Send arguments that are less deeply nested.",
    Code.TOO_MANY_CHUNKS: "Send the call in fewer pieces.",
    Code.UNKNOWN_TOOL: "Call one of the tools you were given; this tool does not exist.",
    Code.UNKNOWN_SCHEMA_VERSION: "Call the tool without a version, or with one that exists.",
    Code.SCHEMA_VIOLATION: "Fix the listed properties so the arguments match the tool's schema, "
    "then call the tool again.",
    Code.BUSINESS_RULE: "Fix the listed properties; they break a rule of this tool.",
    Code.IDEMPOTENCY_CONFLICT: "This idempotency key was already used for a different call; "
    "do not reuse it.",
    Code.IDEMPOTENCY_KEY_MISSING: "This tool has side effects: add an idempotency key.",
    Code.IDEMPOTENCY_KEY_MISMATCH: "Send one idempotency key: the call's key and the key "
    "argument must be the same.",
    Code.DUPLICATE: "This call was already accepted; do not send it again.",
    Code.REFUSAL: "The model refused; this is not a formatting problem to retry.",
    Code.MODEL_ERROR: "The model reported an error; this is not a formatting problem to retry.",
    Code.UNEXPECTED_CHANNEL: "Answer with a tool call where a tool call is expected.",
    Code.MALFORMED_TOOL_CALL: "The tool call was malformed: call the tool again, with its "
    "name and its arguments as one JSON object.",
    Code.UNEXPECTED_TOOL_CALL: "Call only the tools you were given, and only when tools are "
    "enabled.",
    Code.UNSUPPORTED_CALL_KIND: "This kind of tool call cannot pass the gate: no contract "
    "judges it. Use a function tool.",
    Code.APPROVAL_DENIED: "A person denied this call; do not send it again.",
    Code.APPROVAL_EXPIRED: "Nobody approved this call in time; ask the user before sending it "
    "again.",
    Code.UNAUTHORIZED: "This call is not permitted. Do not retry it; tell the user it could not "
    "be made.",
}
_DEFAULT_INSTRUCTION = "The call cannot be executed as sent."
#: Codes whose feedback names no violation and reads as `unauthorized`: what decided them is the
#: policy's, not the model's.
_SILENT = frozenset({Code.UNAUTHORIZED, Code.AUTHORIZER_ERROR})


def feedback_path(path: str, declared: Names, arguments: Any = NO_ARGUMENTS) -> str:
    """A violation's JSON Pointer as feedback may show it: a token stays when it is a declared
    property name (where it stands, for `Scoped` names), or an index into an array of
    `arguments`; every other token (an object key the schema does not declare, or a position the
    arguments cannot tell) becomes `UNDECLARED`. A path cut to its byte bound keeps its `CUT`
    marker."""
    if not path:
        return path
    scoped = declared if isinstance(declared, Scoped) else None
    names = scoped.outer if scoped is not None else declared
    assert isinstance(names, frozenset)
    cut = path.endswith(CUT)
    body = path.removesuffix(CUT) if cut else path
    if not body.startswith("/"):
        return (escape(body) if body in names else UNDECLARED) if body else CUT
    shown: list[str] = []
    node = arguments
    for depth, raw in enumerate(body[1:].split("/")):
        token = raw.replace("~1", "/").replace("~0", "~")
        if scoped is not None and depth < len(scoped.at) and token != scoped.at[depth]:
            scoped = None  # off the way to the inner value: the outer names from here on
        elif scoped is not None and depth == len(scoped.at):
            names = scoped.inner
        if isinstance(node, list) and _is_index(token, len(node)):
            shown.append(token)
            node = node[int(token)]
            continue
        if isinstance(node, _Element) and _is_index(token, node.at + 1) and int(token) == node.at:
            shown.append(token)
            node = node.node
            continue
        shown.append(escape(token) if token in names else UNDECLARED)
        node = node.get(token, NO_ARGUMENTS) if isinstance(node, dict) else NO_ARGUMENTS
    return "/" + "/".join(shown) + (CUT if cut else "")


def _is_index(token: str, length: int) -> bool:
    canonical = token == "0" or (token[:1] in "123456789" and len(token) < 10)
    return canonical and token.isascii() and token.isdigit() and int(token) < length


def largest_feedback_bytes(schema: SchemaRef | None, max_violations: int) -> int:
    """The longest feedback of `schema` that shows no violation: of any code, retryable or not,
    its budget spent or not, saying `max_violations` were left out (a rejection holds no more).
    A bound this large holds every feedback of the schema, whatever its violations say: the
    settings hold it for no schema (`LimitSettings`), and `worker.compose.build_gate` for
    each contract of the gate."""
    return max(
        len(
            build_feedback(
                code,
                schema,
                (),
                retryable=False,
                budget_exhausted=spent,
                max_bytes=sys.maxsize,
                omitted=max_violations,
            ).json
        )
        for code in Code
        for spent in (False, True)
    )


def build_feedback(
    code: Code,
    schema: SchemaRef | None,
    violations: tuple[Violation, ...],
    *,
    retryable: bool,
    budget_exhausted: bool,
    max_bytes: int,
    declared: Names = frozenset(),
    arguments: Any = NO_ARGUMENTS,
    omitted: int = 0,
) -> Feedback:
    """The feedback for a rejection. `declared`: the property names the contract's schema
    declares (`Contract.declared_names`; none known: every object key is `UNDECLARED`), or
    `Scoped` names;
    `arguments`: the parsed arguments (or `arguments_of_path`), which tell array indices from
    object keys; `omitted`:
    violations the caller left out already (counted in `violations_omitted`)."""
    if code in _SILENT:
        code, violations, omitted = Code.UNAUTHORIZED, (), 0
    feedback: dict[str, Any] = {
        "error_type": code.value,
        "schema": {"id": schema.id, "version": schema.version} if schema else None,
        "instruction": _INSTRUCTIONS.get(code, _DEFAULT_INSTRUCTION),
        "retryable": retryable,
        "violations": [
            {
                "path": feedback_path(v.path, declared, arguments),
                "keyword": v.keyword,
                "message": v.message,
            }
            for v in violations
        ],
    }
    if budget_exhausted:
        feedback["retry_budget_exhausted"] = True
        feedback["instruction"] = "The retry budget for this call is spent; do not retry."
    if omitted:
        feedback["violations_omitted"] = omitted
    shown = feedback["violations"]
    encoded = orjson.dumps(feedback)
    while shown and len(encoded) > max_bytes:
        shown.pop()
        feedback["violations_omitted"] = omitted + len(violations) - len(shown)
        encoded = orjson.dumps(feedback)
    return Feedback(feedback, encoded)
