"""Judging one MCP `tools/call` response (the `tool_output_validation` phase), as a pure function.

In order, the first finding decides:

1. a JSON-RPC `error` object: rejected `jsonrpc_error`, the error code as the violation keyword
   when the JSON-RPC specification defines it (-32768 to -32000: its named errors and the
   server errors), else `application_error` (a code the server chose is a value of the input);
2. `resultType: "input_required"`: the call is not done yet; incomplete `input_required`
   (its own non-error outcome: the tool asks the client for input);
3. `isError: true`: rejected `tool_error` (the tool ran and failed; not a parse failure);
   a result that is not of its shape (`resultType`, `isError`, `content` an array, a text block's
   `text` a string: `JSON.parse` reads `99` or `["{...}"]` as JSON) is rejected
   `output_schema_violation`, where the member is read;
4. `structuredContent` against the tool's `outputSchema` (and a tool with an `outputSchema` that
   returns no `structuredContent`): rejected `output_schema_violation`;
5. a text block that a common lenient reader takes as JSON (Python's `json.loads`, which reads
   all that JavaScript's `JSON.parse` reads and more: NaN, numbers past a double's range, a key
   twice, any nesting) and that is not the strict JSON of a value equal to `structuredContent`:
   rejected `output_text_mismatch`. A client that reads the text block reads what the gate
   checked, or the result is refused; text no such reader takes as JSON is prose.

Violation messages are built here from keywords and codes only: a result can carry anything a
tool returned, and none of it is echoed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from worker._native import ParseError, parse_json
from worker.model import Code, IncompleteReason, Outcome, Violation
from worker.schemas.contract import CompiledCheck

#: The members of an MCP response that feedback may name (besides the output schema's own).
RESULT_MEMBERS = frozenset(
    {"result", "structuredContent", "content", "isError", "resultType", "text", "error", "code"}
)
_RESULT = "/result"
_STRUCTURED = "/result/structuredContent"
#: the codes the JSON-RPC 2.0 specification reserves (its own errors and the server errors)
_RESERVED_CODES = (-32768, -32000)
_JSONRPC_ERRORS = {
    -32700: "parse error",
    -32600: "invalid request",
    -32601: "method not found",
    -32602: "invalid params",
    -32603: "internal error",
}


@dataclass(frozen=True, slots=True)
class ToolOutputFinding:
    """Why a tool result is not acceptable as it stands."""

    outcome: Outcome
    code: Code | None
    reason: IncompleteReason | None
    violations: tuple[Violation, ...]


def _rejected(code: Code, *violations: Violation) -> ToolOutputFinding:
    return ToolOutputFinding(Outcome.REJECTED, code, None, violations)


def _malformed(path: str, keyword: str, message: str) -> ToolOutputFinding:
    return _rejected(Code.OUTPUT_SCHEMA_VIOLATION, Violation(path, keyword, message))


def check_tool_result(
    message: Mapping[str, Any], output_check: CompiledCheck | None, max_depth: int
) -> ToolOutputFinding | None:
    """None when the result is acceptable, else the first finding (see the module docstring)."""
    if "error" in message:
        return _jsonrpc_error(message["error"])
    result = message.get("result")
    if not isinstance(result, dict):
        return _malformed(_RESULT, "type", "a tools/call response needs a result object")
    result_type = result.get("resultType", "complete")
    if result_type == "input_required":
        return ToolOutputFinding(Outcome.INCOMPLETE, None, IncompleteReason.INPUT_REQUIRED, ())
    if result_type != "complete":
        return _malformed(
            f"{_RESULT}/resultType", "enum", "resultType must be 'complete' or 'input_required'"
        )
    is_error = result.get("isError", False)
    if type(is_error) is not bool:
        return _malformed(f"{_RESULT}/isError", "type", "isError must be a boolean")
    if is_error:
        violation = Violation(f"{_RESULT}/isError", "isError", "the tool reported an error")
        return _rejected(Code.TOOL_ERROR, violation)
    content = result.get("content")
    if not isinstance(content, list):
        return _malformed(f"{_RESULT}/content", "type", "content must be an array of blocks")
    for index, block in enumerate(content):
        if _is_text_block(block) and not isinstance(block.get("text"), str):
            # JSON.parse(block.text) reads 99 as 99 and ["{...}"] as {...}: never prose
            return _malformed(
                f"{_RESULT}/content/{index}/text", "type", "a text block's text must be a string"
            )
    if "structuredContent" not in result:
        if output_check is not None:
            return _malformed(
                _STRUCTURED,
                "required",
                "the tool declares an outputSchema but returned no structuredContent",
            )
        return None
    structured = result["structuredContent"]
    if output_check is not None:
        violations = output_check(structured)
        if violations:
            return _rejected(
                Code.OUTPUT_SCHEMA_VIOLATION,
                *(
                    Violation(
                        _STRUCTURED + v.path,
                        v.keyword,
                        f"structuredContent does not satisfy the outputSchema's {v.keyword!r}",
                    )
                    for v in violations
                ),
            )
    return _text_mismatch(content, structured, max_depth)


def _jsonrpc_error(error: object) -> ToolOutputFinding:
    code = error.get("code") if isinstance(error, dict) else None
    if type(code) is not int:
        return _rejected(
            Code.JSONRPC_ERROR,
            Violation("/error/code", "invalid", "the JSON-RPC error has no integer code"),
        )
    if not _RESERVED_CODES[0] <= code <= _RESERVED_CODES[1]:
        violation = Violation(
            "/error/code", "application_error", "JSON-RPC error of the server's own code"
        )
        return _rejected(Code.JSONRPC_ERROR, violation)
    name = _JSONRPC_ERRORS.get(code)
    if name is None:
        name = "server error" if -32099 <= code <= -32000 else "reserved error"
    return _rejected(
        Code.JSONRPC_ERROR, Violation("/error/code", str(code), f"JSON-RPC error {code} ({name})")
    )


def _text_mismatch(content: list[Any], structured: Any, max_depth: int) -> ToolOutputFinding | None:
    for index, block in enumerate(content):
        if not _is_text_block(block):
            continue
        text = block["text"]  # a string: checked with the result's shape
        value = parse_json(text.encode("utf-8", "surrogatepass"), max_depth)
        if isinstance(value, ParseError) and not _lenient_json(text):
            continue  # prose: no common reader takes it as JSON
        # JSON the strict parser refuses (a key twice, NaN, 1e400, too deep) reads in a lenient
        # reader as something the gate never checked: it cannot be shown to agree
        if isinstance(value, ParseError) or not _same_json(value, structured):
            return _rejected(
                Code.OUTPUT_TEXT_MISMATCH,
                Violation(
                    f"{_RESULT}/content/{index}/text",
                    "structuredContent",
                    "the serialized JSON in this text block differs from structuredContent",
                ),
            )
    return None


def _is_text_block(block: object) -> bool:
    return isinstance(block, dict) and block.get("type") == "text"


def _keep(text: str) -> str:
    return text


def _lenient_json(text: str) -> bool:
    """Whether Python's `json.loads` takes `text` as JSON (numbers and constants are only read,
    never converted: a 5,000-digit integer is JSON to every lenient reader)."""
    try:
        json.loads(text, parse_int=_keep, parse_float=_keep, parse_constant=_keep)
    except RecursionError:
        return True  # nested past Python's stack, and still JSON to JSON.parse
    except ValueError:
        return False
    return True


def _same_json(a: Any, b: Any) -> bool:
    """JSON equality: numbers by value (1 == 1.0), but true is not 1 and key order is ignored."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_json(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_json(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b
