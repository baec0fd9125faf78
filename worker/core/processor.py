"""The record processor: what the Kafka runner and the offline CLI both run, record by record.

Decoder (record to chunks) -> reassembler (chunks to calls) -> gate (call to verdict) -> event.
A record that cannot be decoded becomes its own rejected `malformed_record` call, so a poison
record never stops a partition. Pure: the caller passes `now` and moves the bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from worker.adapters.decoder import Decoder
from worker.adapters.envelope import bare_fragment, chunk_from_envelope, parse_envelope
from worker.assembly.reassembler import AssemblyLimits, Reassembler
from worker.core.pipeline import Gate
from worker.errors import InputFormatError
from worker.events import encode_event
from worker.model import AssembledCall, Chunk, Code, Fragment, SourceSpan, Verdict
from worker.settings import Settings


@dataclass(frozen=True, slots=True)
class InboundRecord:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Emission:
    """One outcome event ready to produce: key `call_id`, headers for filtering without parsing."""

    call: AssembledCall
    verdict: Verdict
    key: bytes
    value: bytes
    headers: tuple[tuple[str, bytes], ...]


class Processor:
    def __init__(self, gate: Gate, reassembler: Reassembler, decoder: Decoder) -> None:
        self.gate = gate
        self.reassembler = reassembler
        self.decoder = decoder
        self.chunks_seen = 0
        self.poison_records = 0
        self._next_offset: dict[tuple[str, int], int] = {}

    @classmethod
    def from_settings(cls, settings: Settings) -> Processor:
        limits = settings.limits
        assembly = AssemblyLimits(
            idle_timeout_s=settings.assembly.idle_timeout_s,
            max_call_bytes=limits.max_bytes,
            max_call_chunks=limits.max_chunks,
            max_open_calls_per_partition=limits.max_open_calls_per_partition,
        )
        return cls(
            Gate.from_settings(settings),
            Reassembler(assembly),
            Decoder(
                max_streams=limits.max_open_calls_per_partition * 8,
                idle_timeout_s=settings.assembly.idle_timeout_s,
            ),
        )

    @property
    def open_calls(self) -> int:
        return self.reassembler.open_calls

    @property
    def buffered_bytes(self) -> int:
        return self.reassembler.buffered_bytes

    @property
    def tool_names(self) -> frozenset[str]:
        return self.gate.registry.tool_names()

    def tool_name(self, name: str | None) -> str | None:
        """The registry's own name of a tool a call named by alias (schema id), else the name."""
        if name is None:
            return None
        return self.gate.registry.tool_name(name) or name

    def feed(self, record: InboundRecord, now: float) -> list[Emission]:
        return self.feed_many((record,), now)

    def feed_many(self, records: Iterable[InboundRecord], now: float) -> list[Emission]:
        """A batch of records, in partition order, to the events they complete.

        The per-record loop lives here, with its lookups bound once: this is the hot path.
        Envelopes (no `content-format` header) go straight to their stateless decoder, and a
        bare middle fragment straight from its JSON object to the reassembler.
        """
        emissions: list[Emission] = []
        emit = emissions.append
        judge = self._emit
        decode = self.decoder.decode
        assemble = self.reassembler.feed
        assemble_fragment = self.reassembler.feed_fragment
        next_offset = self._next_offset
        chunks_seen = 0
        for record in records:
            topic, partition, offset, value = (
                record.topic,
                record.partition,
                record.offset,
                record.value,
            )
            scope = (topic, partition)
            next_offset[scope] = offset + 1
            headers = record.headers
            fragment: Fragment | None = None
            try:
                if value is None:
                    raise InputFormatError("record has no value (a tombstone is not a chunk)")
                if not headers:
                    envelope = parse_envelope(value)
                    # most records are a call's middle fragment: no Chunk is built for those
                    fragment = bare_fragment(envelope)
                    chunks: Sequence[Chunk] = () if fragment else (chunk_from_envelope(envelope),)
                else:
                    chunks = decode(
                        value,
                        fmt=headers.get("content-format"),
                        key=record.key,
                        headers=headers,
                        scope=scope,
                        offset=offset,
                        now=now,
                    )
            except InputFormatError as exc:
                self.poison_records += 1
                emit(judge(_malformed_call(record, str(exc))))
                continue
            if fragment:
                chunks_seen += 1
                for call in assemble_fragment(
                    fragment, topic=topic, partition=partition, offset=offset, now=now
                ):
                    emit(judge(call))
                continue
            chunks_seen += len(chunks)
            for chunk in chunks:
                for call in assemble(
                    chunk, topic=topic, partition=partition, offset=offset, now=now
                ):
                    emit(judge(call))
        self.chunks_seen += chunks_seen
        return emissions

    def expire(self, now: float) -> list[Emission]:
        self.decoder.expire(now)
        return [self._emit(call) for call in self.reassembler.expire(now)]

    def flush(self) -> list[Emission]:
        return [self._emit(call) for call in self.reassembler.flush()]

    def revoke(self, topic: str, partition: int) -> None:
        self.reassembler.drop_partition(topic, partition)
        self.decoder.drop_scope((topic, partition))
        self._next_offset.pop((topic, partition), None)

    def commit_offset(self, topic: str, partition: int) -> int | None:
        """The offset safe to commit: never past the first record of a call, or of a vendor
        stream, still open there, so a replay from it decodes and assembles them whole."""
        fed = self._next_offset.get((topic, partition))
        if fed is None:
            return None
        candidates = [
            fed,
            self.reassembler.safe_offset(topic, partition),
            self.decoder.safe_offset((topic, partition)),
        ]
        return min(offset for offset in candidates if offset is not None)

    def _emit(self, call: AssembledCall) -> Emission:
        verdict = self.gate.judge(call)
        schema = verdict.schema
        headers = (
            ("outcome", verdict.outcome.value.encode()),
            ("tool", (call.tool or "").encode("utf-8", "surrogatepass")),
            ("schema-version", schema.version.encode() if schema else b""),
        )
        return Emission(
            call,
            verdict,
            call.call_id.encode("utf-8", "surrogatepass"),
            encode_event(call, verdict),
            headers,
        )


def _malformed_call(record: InboundRecord, detail: str) -> AssembledCall:
    stream_id = record.key.decode("utf-8", "replace") if record.key else ""
    position = SourceSpan(record.topic, record.partition, record.offset, record.offset)
    return AssembledCall(
        stream_id=stream_id,
        call_id=f"record:{record.topic}:{record.partition}:{record.offset}",
        tool=None,
        arguments=b"",
        source=position,
        assembly_error=Code.MALFORMED_RECORD,
        assembly_detail=detail[:300],
    )
