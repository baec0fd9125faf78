"""OpenAI-compatible servers' known habits, each named as a dialect of the format it speaks.

A vendor format is read strictly by default: as the vendor itself streams it (OpenAI's own Chat
Completions and Responses API). A self-hosted server that speaks the format with a known habit
is read in its dialect, named explicitly, never guessed: per input topic (the setting
`CALLGATE_TOPICS__DIALECTS`, `{"<topic>": "<dialect>"}`) or per record by the `content-format`
header's parameter (`openai.chat; dialect=ollama`). Each dialect relaxes only what its server
is known to do, documented where the server's own tracker shows it:

- `ollama` (openai.chat): every call of a turn arrives at `index: 0`, each opening with an `id`
  of its own (ollama/ollama#15457): a delta at the current index with a new id and a name
  opens the next call instead of breaking the stream.
- `dynamo` (openai.chat): NVIDIA Dynamo's frontend before ai-dynamo/dynamo#4723 did the same.
- `vllm` (openai.chat): the streaming server reports `finish_reason: "tool_calls"` for a call
  the token limit cut (vllm-project/vllm#53269): the finish reason is not trusted for the
  calls' text, and a call whose text ends inside a JSON value is cut (`incomplete`
  `max_tokens`), whatever the finish reason says. Its hermes tool parser also sends the
  arguments of a model that writes them as a string (Granite 4) double-encoded, a JSON string
  holding the JSON text (vllm-project/vllm#54964): such a text is decoded once, recorded as the
  repair `double_encoded` in the call's event.
- `copilot` (openai.responses): GitHub Copilot's Responses endpoint gives the response and each
  item a new id on each event while an item's `output_index` stays (captured in vercel/ai's
  `github-copilot-id-rotation` fixture): events are placed by `output_index` alone, and no id
  is compared between events.
- `9router`, `new-api` (openai.responses): these Responses proxies end the stream with a
  `response.completed` whose response has no `output` (decolua/9router#705) or an empty one
  (QuantumNous/new-api#4362), though every item's `response.output_item.done` was sent: the
  calls are taken from their `output_item.done` (each call must have one), each checked against
  its `.done` text as in the strict default; nothing is read from the missing output.

Only `double_encoded` changes a call's text, and it is recorded as a repair; otherwise the
event's call is the vendor's.
"""

from __future__ import annotations

from dataclasses import dataclass

from worker.errors import InputFormatError

#: the `content-format` parameter that names a dialect
PARAMETER = "dialect"
#: the adapter header that carries a stream's dialect (set by the decoder, kept with the stream)
HEADER = "dialect"


@dataclass(frozen=True, slots=True)
class Dialect:
    """A server's habits: which of a format's strict rules it is known to break."""

    name: str
    format: str
    #: chat: every call at index 0, each opening with an id of its own
    reused_index: bool = False
    #: chat: `finish_reason` says `tool_calls` for calls the token limit cut
    cut_calls_finish_as_tool_calls: bool = False
    #: chat: arguments may come as a JSON string holding their JSON text (decoded once, a repair)
    double_encoded_arguments: bool = False
    #: responses: an item's id changes from event to event
    rotating_item_ids: bool = False
    #: responses: the final response has no `output` (or an empty one): the calls are taken
    #: from their `output_item.done`
    completed_without_output: bool = False


DIALECTS: dict[str, Dialect] = {
    dialect.name: dialect
    for dialect in (
        Dialect("ollama", "openai.chat", reused_index=True),
        Dialect("dynamo", "openai.chat", reused_index=True),
        Dialect(
            "vllm",
            "openai.chat",
            cut_calls_finish_as_tool_calls=True,
            double_encoded_arguments=True,
        ),
        Dialect("copilot", "openai.responses", rotating_item_ids=True),
        Dialect("9router", "openai.responses", completed_without_output=True),
        Dialect("new-api", "openai.responses", completed_without_output=True),
    )
}


def split_format(value: str) -> tuple[str, str]:
    """A `content-format` value's format and the text of its parameters (`""` when none)."""
    base, _, parameters = value.partition(";")
    return base.strip(), parameters.strip()


def dialect_of(fmt: str, parameters: str) -> Dialect | None:
    """The dialect a `content-format`'s parameters name (None for none). Raises
    `InputFormatError` for another parameter, an unknown dialect or one of another format."""
    if not parameters:
        return None
    name, equals, value = parameters.partition("=")
    if name.strip().lower() != PARAMETER or not equals or ";" in value:
        raise InputFormatError(
            f"content-format {fmt!r} takes one parameter, {PARAMETER}=<name>; "
            f"dialects: {sorted(DIALECTS)}"
        )
    return named(fmt, value.strip().strip('"'))


def named(fmt: str, name: str) -> Dialect:
    """The dialect `name` of format `fmt`, or `InputFormatError` saying which exist."""
    dialect = DIALECTS.get(name.lower())
    if dialect is None or dialect.format != fmt:
        known = sorted(d.name for d in DIALECTS.values() if d.format == fmt)
        raise InputFormatError(f"{fmt} has no dialect {name!r}; its dialects: {known}")
    return dialect
