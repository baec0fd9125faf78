"""The only repair the chain makes: a markdown code fence around the whole text.

Everything else (missing commas, single quotes, type coercion, default filling) is left alone: a
repair must be lossless and its result is parsed and validated in full, like any other text.
"""

from __future__ import annotations

import re

from worker.model import RepairKind

_FENCE = re.compile(
    rb"\A\s*```(?:json|JSON)?[ \t]*\r?\n(?P<body>.*?)\r?\n?[ \t]*```\s*\Z", re.DOTALL
)


def strip_fence(text: bytes) -> tuple[bytes, RepairKind | None]:
    """The text inside a fence that encloses all of it, and the repair made; else the text as is."""
    if not text.lstrip().startswith(b"```"):
        return text, None
    match = _FENCE.match(text)
    if match is None:
        return text, None
    return match["body"], RepairKind.MARKDOWN_FENCE
