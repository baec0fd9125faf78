"""Checkpoints of input partitions in a compacted changelog topic: frames, generations, restore.

A checkpoint is one *frame*: the processor's state of one input partition, whole (`full`) or
what changed since the previous frame (`delta`), with the input offset it reflects. Frames are
written to the same partition of the changelog topic as the input partition, each as one or
more records (a frame larger than the record bound is cut into parts):

    key    b"<generation>:<seq>:<part>"     (zero-padded decimals, so keys sort as they count)
    value  the part's bytes
    headers frame-kind (full | delta), frame-parts (how many), frame-offset (input offset)

A *generation* starts with a full frame (seq 0) and continues with deltas. When the deltas of a
generation add up to more than its full frame (and a floor), the next frame is a full one of a
new generation; once that frame is acknowledged, the old generation's keys are deleted
(tombstones, `Writer.tombstones`), so compaction keeps the topic about the size of one full
frame and its deltas: what is written per checkpoint is what changed, and a restore reads a
bounded amount.

Restore reads the partition to its end and takes the newest generation whose full frame is
complete, then its deltas in seq order up to the first missing or incomplete one (a crash in
the middle of writing). Everything else is stale and deleted after the next full frame.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

Header = tuple[str, bytes]
#: A changelog record: key, value (None: a tombstone), headers.
ChangelogRecord = tuple[bytes, bytes | None, list[Header]]

FULL, DELTA = b"full", b"delta"
_KIND, _PARTS, _OFFSET = "frame-kind", "frame-parts", "frame-offset"
#: Deltas may add up to this much before a new generation, however small the full frame.
MIN_GENERATION_BYTES = 1 << 20


def frame_key(generation: int, seq: int, part: int) -> bytes:
    return b"%010d:%010d:%04d" % (generation, seq, part)


def parse_key(key: bytes) -> tuple[int, int, int] | None:
    try:
        generation, seq, part = key.split(b":")
        return int(generation), int(seq), int(part)
    except ValueError:
        return None


@dataclass(slots=True)
class Writer:
    """Where the next frame of one input partition goes, and when a new generation starts."""

    max_record_bytes: int
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
            key = frame_key(self.generation, self.seq, index)
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
    committed offset. `writer` continues the log: its next frame is a full one of a newer
    generation, and deletes every key read here.
    """

    frames: list[bytes]
    offset: int | None
    writer: Writer


@dataclass(slots=True)
class _Frame:
    kind: bytes
    parts: int
    offset: int
    bodies: dict[int, bytes] = field(default_factory=dict)

    def complete(self) -> bool:
        return len(self.bodies) == self.parts

    def body(self) -> bytes:
        return b"".join(self.bodies[i] for i in range(self.parts))


def restore(records: Iterable[ChangelogRecord], max_record_bytes: int) -> Restored:
    """Read a changelog partition's records (in log order) into what to restore."""
    frames: dict[tuple[int, int], _Frame] = {}
    keys: list[bytes] = []
    for key, value, headers in records:
        place = parse_key(key)
        if place is None:
            continue
        generation, seq, part = place
        if value is None:
            frames.pop((generation, seq), None)
            continue
        keys.append(key)
        fields = dict(headers)
        try:
            kind = fields[_KIND]
            parts = int(fields[_PARTS])
            offset = int(fields[_OFFSET])
        except (KeyError, ValueError):
            continue
        frame = frames.get((generation, seq))
        if frame is None or (frame.kind, frame.parts, frame.offset) != (kind, parts, offset):
            frame = frames[(generation, seq)] = _Frame(kind, parts, offset)
        frame.bodies[part] = value
    writer = Writer(max_record_bytes=max_record_bytes, stale=sorted(set(keys)))
    generations = sorted({g for g, s in frames if s == 0}, reverse=True)
    for generation in generations:
        first = frames[(generation, 0)]
        if first.kind != FULL or not first.complete():
            continue
        chosen = [first]
        seq = 1
        while (frame := frames.get((generation, seq))) is not None and frame.complete():
            if frame.kind != DELTA:
                break
            chosen.append(frame)
            seq += 1
        writer.generation = max(g for g, _ in frames) + 1
        return Restored([f.body() for f in chosen], chosen[-1].offset, writer)
    if frames:
        writer.generation = max(g for g, _ in frames) + 1
    return Restored([], None, writer)
