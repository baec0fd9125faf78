"""The repairs the chain makes, each lossless and recorded in the event:

- `markdown_fence`: a markdown code fence around the whole text is taken off;
- `double_encoded`: arguments sent as a JSON string holding their JSON text are decoded once,
  only for a call whose server's dialect is known to do it (`AssembledCall.double_encoded`,
  `worker.adapters.dialects`); never in the strict default, and never twice.

Everything else (missing commas, single quotes, type coercion, default filling) is left alone: a
repair must be lossless and its result is parsed and validated in full, like any other text.
"""

from __future__ import annotations

import re

from worker._native import parse_json
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


def decode_double(text: bytes, max_depth: int) -> tuple[bytes, RepairKind | None]:
    """The JSON text a JSON string holds, and the repair made; else the text as is (any other
    value, or text that is not strict JSON, is parsed and judged as it came)."""
    if not text.lstrip().startswith(b'"'):
        return text, None
    value = parse_json(text, max_depth)
    if type(value) is not str:
        return text, None
    try:
        return value.encode(), RepairKind.DOUBLE_ENCODED
    except UnicodeEncodeError:  # a lone surrogate escape: no text to decode to
        return text, None
