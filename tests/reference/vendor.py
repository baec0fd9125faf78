"""Events the README gives alike for every vendor format the reference judges."""

from __future__ import annotations

from tests.reference.envelope import MALFORMED, Expected


def vendor_error(stream_id: str) -> Expected:
    """A vendor error's own event (README, "Vendor formats"): it ends the stream."""
    return Expected(
        stream_id, f"{stream_id}:error", "rejected", "response_classification", "model_error"
    )


def rejected_record(stream_id: str, code: str) -> Expected:
    """A finish or stop reason that is the vendor's verdict on a call: a rejected record."""
    return Expected(stream_id, MALFORMED, "rejected", "response_classification", code)
