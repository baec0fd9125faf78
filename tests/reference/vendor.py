"""Events the README gives alike for every vendor format the reference judges."""

from __future__ import annotations

from tests.reference.envelope import MALFORMED, Expected


def _call_id(base: str, *added: str | int) -> str:
    """README, "How a vendor stream's calls are named": the base (a vendor's id, or the stream
    id) with each `#` written `##`, then what callgate adds, each after a lone `#`."""
    written = "".join("##" if char == "#" else char for char in base)
    return "#".join([written, *(str(part) for part in added)])


def named_call(vendor_id: str, output: int = 0) -> str:
    """The call a vendor named `vendor_id` in output (choice, candidate) `output`."""
    return _call_id(vendor_id, output) if output else _call_id(vendor_id)


def unnamed_call(stream_id: str, output: int, n: int) -> str:
    """Output `output`'s call `n` (from 0), which has no vendor id."""
    return _call_id(stream_id, output, n)


def refusal_call(stream_id: str, output: int = 0) -> str:
    """Output `output`'s refusal."""
    return _call_id(stream_id, "refusal", output) if output else _call_id(stream_id, "refusal")


def error_call(stream_id: str) -> str:
    """The vendor error that ended the stream."""
    return _call_id(stream_id, "error")


def approval_call(item_id: str) -> str:
    """An OpenAI Responses MCP approval request, named by its item's `id`."""
    return _call_id(item_id, "approval")


def vendor_error(stream_id: str) -> Expected:
    """A vendor error's own event (README, "Vendor formats"): it ends the stream."""
    call_id = error_call(stream_id)
    return Expected(stream_id, call_id, "rejected", "response_classification", "model_error")


def rejected_record(stream_id: str, code: str) -> Expected:
    """A finish or stop reason that is the vendor's verdict on a call: a rejected record."""
    return Expected(stream_id, MALFORMED, "rejected", "response_classification", code)
