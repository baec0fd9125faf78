"""Changelog frames: generations, parts, tombstones, restore after any crash point, and owners
that write at the same time (a former owner paused past its session) never mixing."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from worker.runtime.checkpoints import (
    MIN_GENERATION_BYTES,
    ChangelogRecord,
    Writer,
    frame_key,
    parse_key,
    restore,
)

W, OWNER, ZOMBIE = 0xA, 0xB, 0xC
#: frames to write: each one's body, and whether it asks to be a full one
FRAMES = st.lists(st.tuples(st.binary(max_size=20), st.booleans()), min_size=1, max_size=12)


def test_keys_sort_as_they_count() -> None:
    keys = [
        frame_key(g, w, s, p)
        for g in (0, 2, 10)
        for w in (1, 2**64 - 1)
        for s in (0, 9, 11)
        for p in (0, 3)
    ]
    assert sorted(keys) == keys
    assert [parse_key(k) for k in keys[:2]] == [(0, 1, 0, 0), (0, 1, 0, 3)]
    assert parse_key(b"other") is None
    assert parse_key(b"1:2:3") is None


def test_a_large_frame_is_written_in_parts_and_read_back_whole() -> None:
    writer = Writer(max_record_bytes=4, writer=W)
    records = writer.frame(b"0123456789", full=True, offset=7)
    assert [key for key, _, _ in records] == [frame_key(0, W, 0, p) for p in range(3)]
    restored = restore(records, 4, OWNER)
    assert (restored.frames, restored.offset) == ([b"0123456789"], 7)


def test_deltas_follow_their_full_frame_and_a_new_generation_starts_when_they_outgrow_it() -> None:
    writer = Writer(max_record_bytes=1 << 30, writer=W)
    log: list[ChangelogRecord] = writer.frame(b"base", full=True, offset=1)
    assert not writer.wants_full()
    big = b"x" * (MIN_GENERATION_BYTES // 2 + 1)
    log += writer.frame(big, full=False, offset=2)
    assert not writer.wants_full()
    log += writer.frame(big, full=False, offset=3)
    assert writer.wants_full()
    restored = restore(log, 1 << 30, OWNER)
    assert (restored.frames, restored.offset) == ([b"base", big, big], 3)
    log += writer.frame(b"base2", full=True, offset=3)
    assert restore(log, 1 << 30, OWNER).frames == [b"base2"]
    tombstones = writer.tombstones()
    assert [value for _, value, _ in tombstones] == [None, None, None]
    log += tombstones
    assert restore(log, 1 << 30, OWNER).frames == [b"base2"]


@settings(max_examples=200, derandomize=True)
@given(
    frames=FRAMES,
    crash=st.data(),
)
def test_a_crash_anywhere_restores_the_last_complete_frame_chain(
    frames: list[tuple[bytes, bool]], crash: st.DataObject
) -> None:
    writer = Writer(max_record_bytes=7, writer=W)
    log: list[ChangelogRecord] = []
    expected_states: list[tuple[list[bytes], int]] = []
    chain: list[bytes] = []
    for offset, (body, want_full) in enumerate(frames, start=1):
        full = want_full or writer.wants_full()
        log += writer.frame(body, full=full, offset=offset)
        chain = [body] if full else [*chain, body]
        expected_states.append((list(chain), offset))
        if full and crash.draw(st.booleans()):
            log += writer.tombstones()
    # the log was cut after some record: a frame is complete only if all its parts made it
    cut = crash.draw(st.integers(0, len(log)))
    restored = restore(log[:cut], 7, OWNER)
    complete = [
        state for state, end in zip(expected_states, _frame_ends(log), strict=True) if end <= cut
    ]
    if restored.frames:
        assert (restored.frames, restored.offset) == (complete[-1][0], complete[-1][1])
    else:
        assert not complete
    # whatever was read is deleted once the next full frame is written
    after = restored.writer.frame(b"next", full=True, offset=99)
    assert restore(log[:cut] + after + restored.writer.tombstones(), 7, W).frames == [b"next"]


@settings(max_examples=300, derandomize=True)
@given(
    frames=FRAMES,
    hole=st.data(),
)
def test_records_a_reader_skipped_end_the_chain_before_them_never_mix_into_it(
    frames: list[tuple[bytes, bool]], hole: st.DataObject
) -> None:
    """A reader that skipped a run of records in the middle of the changelog (a broker can hand
    out a batch past one it has not stored yet): what is restored is the furthest state whose
    whole chain (its full frame and every delta up to it, every part of each) was read, never
    a delta applied past a missing one."""
    writer = Writer(max_record_bytes=7, writer=W)
    log: list[ChangelogRecord] = []
    spans: list[tuple[int, int]] = []  # each frame's records: [start, end) in the log
    chain_start: list[int] = []  # for each frame, the index of its chain's full frame
    states: list[tuple[list[bytes], int]] = []
    chain: list[bytes] = []
    for offset, (body, want_full) in enumerate(frames, start=1):
        full = want_full or writer.wants_full()
        start = len(log)
        log += writer.frame(body, full=full, offset=offset)
        spans.append((start, len(log)))
        chain_start.append(len(spans) - 1 if full else chain_start[-1])
        chain = [body] if full else [*chain, body]
        states.append((list(chain), offset))
    first = hole.draw(st.integers(0, len(log) - 1), label="first record skipped")
    last = hole.draw(st.integers(first + 1, len(log)), label="after the last skipped")
    read = log[:first] + log[last:]
    restored = restore(read, 7, OWNER)

    def whole(frame: int) -> bool:
        start, end = spans[frame]
        return end <= first or start >= last

    complete = [
        k for k in range(len(frames)) if all(whole(f) for f in range(chain_start[k], k + 1))
    ]
    if complete:
        assert (restored.frames, restored.offset) == states[complete[-1]]
    else:
        assert restored.frames == []


def _frame_ends(log: list[ChangelogRecord]) -> list[int]:
    """For each frame written, the log length once its last part is in."""
    ends: list[int] = []
    for index, (key, value, headers) in enumerate(log):
        if value is None:
            continue
        parts = int(dict(headers)["frame-parts"])
        place = parse_key(key)
        assert place is not None
        if place[3] == parts - 1:
            ends.append(index + 1)
    return ends


def test_a_former_owner_writing_late_never_mixes_with_the_new_owner() -> None:
    # both restore the same log (the former owner was paused right after its assignment)
    log = Writer(1024, writer=W).frame(b"S0", full=True, offset=100)
    zombie, owner = restore(log, 1024, ZOMBIE).writer, restore(log, 1024, OWNER).writer
    log += owner.frame(b"OWNER-FULL", full=True, offset=150)
    log += owner.frame(b"OWNER-DELTA", full=False, offset=180)
    log += zombie.frame(b"ZOMBIE-FULL", full=True, offset=120)
    restored = restore(log, 1024, W)
    assert (restored.frames, restored.offset) == ([b"OWNER-FULL", b"OWNER-DELTA"], 180)
    # the former owner's tombstones delete what it read, never the new owner's frames
    log += zombie.tombstones() + zombie.frame(b"ZOMBIE-DELTA", full=False, offset=190)
    restored = restore(log, 1024, W)
    assert (restored.frames, restored.offset) == ([b"ZOMBIE-FULL", b"ZOMBIE-DELTA"], 190)
    log += owner.frame(b"OWNER-FULL-2", full=True, offset=200) + owner.tombstones()
    assert restore(log, 1024, W).frames == [b"OWNER-FULL-2"]


@settings(max_examples=300, derandomize=True)
@given(script=st.data())
def test_owners_writing_at_once_restore_one_owners_chain_reaching_furthest(
    script: st.DataObject,
) -> None:
    """Owners restore from the log as it stands, then write interleaved (each with offsets
    that only grow). A restore is always one owner's chain, never a mix; with no deletions, the
    one reaching furthest (an owner's tombstones may delete another's chain, which then only
    costs replay)."""
    deletions = script.draw(st.booleans())
    log: list[ChangelogRecord] = []
    owners: list[tuple[Writer, list[bytes], int]] = []  # writer, its chain, its offset
    written: list[tuple[list[bytes], int]] = []  # every chain written, with its offset
    for step in range(script.draw(st.integers(1, 30))):
        if not owners or script.draw(st.integers(0, 4)) == 0:
            restored = restore(log, 5, writer=len(owners) + 1)
            owners.append((restored.writer, list(restored.frames), restored.offset or 0))
        index = script.draw(st.integers(0, len(owners) - 1))
        writer, chain, offset = owners[index]
        offset += script.draw(st.integers(0, 3))
        body = b"%d:%d" % (index, step)
        full = writer.wants_full() or script.draw(st.booleans())
        log += writer.frame(body, full=full, offset=offset)
        chain = [body] if full else [*chain, body]
        owners[index] = (writer, chain, offset)
        written.append((chain, offset))
        if deletions and full and script.draw(st.booleans()):
            log += writer.tombstones()
    restored = restore(log, 5, writer=0)
    if restored.frames or not deletions:
        assert (restored.frames, restored.offset) in written
    if not deletions:
        assert restored.offset == max(offset for _, offset in written)
