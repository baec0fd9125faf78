"""Checkpoints of input partitions in a compacted changelog topic: frames, chains, restore.

A checkpoint is one *frame*: the processor's state of one input partition, whole (`full`) or
what changed since the previous frame (`delta`), with the input offset it reflects. Frames are
written to the same partition of the changelog topic as the input partition, each as one or
more records (a frame larger than the record bound is cut into parts):

    key    b"<generation>:<writer>:<seq>:<part>"   (zero-padded, so keys sort as they count)
    value  the part's bytes
    headers frame-kind (full | delta), frame-parts (how many), frame-offset (input offset)

Every owner of a partition writes under its own *writer* id, drawn when it restores. A *chain*
is one writer's full frame (seq 0) and the deltas that follow it; when the deltas add up to more
than the full frame (and a floor), the writer starts a new generation with a full frame and,
once that frame is acknowledged, deletes the older keys it knows of (tombstones,
`Writer.tombstones`), so compaction keeps the topic about the size of one full frame and its
deltas: what is written per checkpoint is what changed, and a restore reads a bounded amount.

Restore reads the partition to its end and, of the complete chains, takes the one that reaches
furthest into the input (then the newest); a chain ends at its first missing or incomplete
frame (a crash in the middle of writing). Chains never mix: a former owner that writes late (a
member paused past its session, still checkpointing what it had fetched) writes its own chain,
which is as true as the new owner's, because a partition's state is a function of its records
alone; taking either decides the rest of the partition the same way.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field

Header = tuple[str, bytes]
#: A changelog record: key, value (None: a tombstone), headers.
ChangelogRecord = tuple[bytes, bytes | None, list[Header]]

FULL, DELTA = b"full", b"delta"
_KIND, _PARTS, _OFFSET = "frame-kind", "frame-parts", "frame-offset"
#: Deltas may add up to this much before a new generation, however small the full frame.
MIN_GENERATION_BYTES = 1 << 20


def frame_key(generation: int, writer: int, seq: int, part: int) -> bytes:
    return b"%010d:%016x:%010d:%04d" % (generation, writer, seq, part)


def parse_key(key: bytes) -> tuple[int, int, int, int] | None:
    """(generation, writer, seq, part), or None for a key that is not a frame's."""
    try:
        generation, writer, seq, part = key.split(b":")
        return int(generation), int(writer, 16), int(seq), int(part)
    except ValueError:
        return None


def new_writer_id() -> int:
    """A writer id no other owner of the partition draws (64 random bits)."""
    return secrets.randbits(64)


@dataclass(slots=True)
class Writer:
    """Where one owner's next frame of an input partition goes, and when a new generation starts."""

    max_record_bytes: int
    writer: int
    generation: int = 0
    seq: int = 0
    full_bytes: int = 0
    delta_bytes: int = 0
    #: keys written in the current generation, and older keys to delete after its full frame
    keys: list[bytes] = field(default_factory=list)
    stale: list[bytes] = field(default_factory=list)
    needs_full: bool = True

    def wants_full(self) -> bool:
        """Whether the next frame must be a full one (a new generation)."""
        return self.needs_full or self.delta_bytes > max(self.full_bytes, MIN_GENERATION_BYTES)

    def frame(self, body: bytes, *, full: bool, offset: int) -> list[ChangelogRecord]:
        """The records of one frame (and, after a full one, the tombstones it allows)."""
        if full:
            if self.keys or self.seq:
                self.generation += 1
            self.stale.extend(self.keys)
            self.keys = []
            self.seq = 0
            self.full_bytes = len(body)
            self.delta_bytes = 0
            self.needs_full = False
        else:
            if self.needs_full:
                raise ValueError("a delta before the generation's full frame")
            self.delta_bytes += len(body)
        parts = [
            body[i : i + self.max_record_bytes] for i in range(0, len(body), self.max_record_bytes)
        ]
        parts = parts or [b""]
        headers = [
            (_KIND, FULL if full else DELTA),
            (_PARTS, str(len(parts)).encode()),
            (_OFFSET, str(offset).encode()),
        ]
        records: list[ChangelogRecord] = []
        for index, part in enumerate(parts):
            key = frame_key(self.generation, self.writer, self.seq, index)
            self.keys.append(key)
            records.append((key, part, headers))
        self.seq += 1
        return records

    def tombstones(self) -> list[ChangelogRecord]:
        """Once the generation's full frame is acknowledged: delete the older keys."""
        if self.needs_full or not self.keys:
            return []
        records: list[ChangelogRecord] = [(key, None, []) for key in self.stale]
        self.stale = []
        return records


@dataclass(frozen=True, slots=True)
class Restored:
    """What a changelog partition holds: the frames to apply, in order, and where input resumes.

    `frames` is empty when there is no usable checkpoint: the partition starts empty, from its
    committed offset. `writer` continues the log under the new owner's id: its next frame is a
    full one of a newer generation, and deletes every key read here.
    """

    frames: list[bytes]
    offset: int | None
    writer: Writer


@dataclass(slots=True)
class _Frame:
    kind: bytes
    parts: int
    offset: int
    #: where the frame's last part was read, to tell the newer of two chains that end alike
    position: int
    bodies: dict[int, bytes] = field(default_factory=dict)

    def complete(self) -> bool:
        return len(self.bodies) == self.parts

    def body(self) -> bytes:
        return b"".join(self.bodies[i] for i in range(self.parts))


def restore(records: Iterable[ChangelogRecord], max_record_bytes: int, writer: int) -> Restored:
    """Read a changelog partition's records (in log order) into what to restore; the new
    owner writes on as `writer`."""
    frames: dict[tuple[int, int, int], _Frame] = {}
    keys: set[bytes] = set()
    for position, (key, value, headers) in enumerate(records):
        place = parse_key(key)
        if value is None:
            if place is not None:
                frames.pop(place[:3], None)
            keys.discard(key)
            continue
        keys.add(key)  # whatever is not a frame of a chain is deleted with the stale frames
        if place is None:
            continue
        generation, writer_id, seq, part = place
        fields = dict(headers)
        try:
            kind = fields[_KIND]
            parts = int(fields[_PARTS])
            offset = int(fields[_OFFSET])
        except (KeyError, ValueError):
            continue
        frame = frames.get((generation, writer_id, seq))
        if frame is None or (frame.kind, frame.parts, frame.offset) != (kind, parts, offset):
            frame = frames[(generation, writer_id, seq)] = _Frame(kind, parts, offset, position)
        frame.bodies[part] = value
        frame.position = position
    chains: list[list[_Frame]] = []
    for (generation, writer_id, seq), first in frames.items():
        if seq != 0 or first.kind != FULL or not first.complete():
            continue
        chain = [first]
        while (frame := frames.get((generation, writer_id, len(chain)))) is not None:
            if frame.kind != DELTA or not frame.complete():
                break
            chain.append(frame)
        chains.append(chain)
    newest = max((g for g, _, _ in frames), default=-1)
    continued = Writer(max_record_bytes, writer, generation=newest + 1, stale=sorted(keys))
    if not chains:
        return Restored([], None, continued)
    chosen = max(chains, key=lambda chain: (chain[-1].offset, chain[-1].position))
    return Restored([f.body() for f in chosen], chosen[-1].offset, continued)
