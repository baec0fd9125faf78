"""The one rule naming the calls of a vendor stream (README, *Vendor formats*, "Call ids").

A call id is a base, written with every `#` in it doubled (`##`), then zero or more tags, each
a single `#` and a word or number that holds no `#` (stream `s1` in the examples):

- a call the vendor named, in the stream's first output: its id, no tag (`call_1`);
- the same in output k > 0 (a Chat choice, a Gemini candidate): its id, `#k` (`call_1#2`);
- output k's call n (from 0) that the vendor did not name: the stream id, `#k#n` (`s1#0#0`);
- output k's refusal: the stream id, `#refusal`, then `#k` if k > 0 (`s1#refusal`);
- the vendor's error: the stream id, `#error` (`s1#error`);
- an MCP approval request (OpenAI Responses) the vendor named by its item's id: that id,
  `#approval` (`mcpr_1#approval`), since item ids and function calls' `call_id`s are two spaces.

An id is read back from its left: `##` is a `#` of the base, and the first lone `#` starts the
tags. So an id names one (base, tags) and the naming is injective: two different calls of a
stream never get one id, a vendor's id can never be one callgate derived (it has no tag), and
a vendor id that holds no `#` (every vendor's own format) is the call id unchanged.

Pure: strings in, strings out. Every adapter names its calls here and nowhere else.
"""

from __future__ import annotations

#: the separator of tags; in a base it is doubled
MARK = "#"


def _base(text: str) -> str:
    return text.replace(MARK, MARK * 2)


def _tagged(base: str, *tags: str | int) -> str:
    return "".join([_base(base), *(f"{MARK}{tag}" for tag in tags)])


def _output(output: int) -> tuple[int, ...]:
    """The tag of output (choice, candidate) `output`: none for the first."""
    return (output,) if output > 0 else ()


def vendor_call(vendor_id: str, output: int = 0) -> str:
    """A call the vendor named `vendor_id`, in output `output` of its stream."""
    return _tagged(vendor_id, *_output(output))


def unnamed_call(stream_id: str, output: int, position: int) -> str:
    """The call at `position` (from 0) among output `output`'s calls, which the vendor did not
    name."""
    return _tagged(stream_id, output, position)


def refusal(stream_id: str, output: int = 0) -> str:
    """The refusal of output `output` of the stream."""
    return _tagged(stream_id, "refusal", *_output(output))


def error(stream_id: str) -> str:
    """The vendor error that ended the stream."""
    return _tagged(stream_id, "error")


def approval_request(item_id: str) -> str:
    """The MCP approval request whose item is `item_id` (a function call's `call_id` may be
    the same text: it names another call)."""
    return _tagged(item_id, "approval")
