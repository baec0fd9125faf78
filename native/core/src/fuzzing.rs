//! The checks of the fuzz targets (`native/fuzz/`), one function per target, behind the
//! `fuzzing` feature: the production modules carry no oracle. `cargo test` runs the kept corpus
//! through the same functions on stable (`tests/fuzz_corpus.rs`).
//!
//! `parse_check`: the strict JSON parser on any bytes never panics; a parsed value serializes to
//! text that parses back to the same value; the depth the parser sees is the depth `depth_over`
//! measures, and `max_depth` cuts exactly there; a rejection's message is plain ASCII; and
//! `check_value` decides as the parse does.
//!
//! `envelope_check`: any bytes decode to a piece or a reason, never a panic, and a decoded piece
//! holds no identifier past its bound.
//!
//! `assembler_check`: the bytes are read as a script of records (pieces of a few streams and
//! calls, ends, aborts, time jumps, snapshots). Whatever the script: no panic; the open-call and
//! buffered-byte counts always equal what the partitions hold; a call that ends complete holds
//! exactly the pieces it took, in order; and a partition written out (base or deltas) and
//! restored at any point decides the rest of the script exactly as the original does.

use std::borrow::Cow;
use std::sync::Arc;

use crate::assembler::{
    Assembler, CallPiece, Channel, Closed, Ending, Finish, Limits, Piece, Scope,
};
use jiter::Jiter;

use crate::envelope;
use crate::json::{check_value, depth_over, nesting_depth, utf8_first, Code, Failure, DEPTH_CAP};
use crate::origin::{CallKind, Origin};
use crate::snapshot;
use crate::value::{parse_value, Value};

/// The parse target's checks on one input (see the module's docs).
pub fn parse_check(data: &[u8]) {
    let parsed = parse_value(data, DEPTH_CAP);
    check_agrees(data, &parsed);
    match parsed {
        Ok(value) => {
            let text = value.to_json();
            let again = parse_value(text.as_bytes(), DEPTH_CAP)
                .unwrap_or_else(|failure| panic!("re-parse of {text:?} failed: {failure:?}"));
            assert_eq!(again, value, "round trip through {text:?}");
            assert_eq!(again.to_json(), text, "round trip is not stable");
            let depth = value.depth();
            assert_eq!(
                nesting_depth(data),
                depth,
                "nesting_depth disagrees with the parser"
            );
            assert_eq!(depth_over(data, depth), None);
            if depth > 0 {
                assert_eq!(depth_over(data, depth - 1), Some(depth));
                let cut = parse_value(data, depth - 1).expect_err("max_depth must cut");
                assert_eq!(cut.code, Code::TooDeep, "{cut:?}");
            }
            assert_eq!(parse_value(data, depth), Ok(value));
        }
        Err(failure) => {
            assert!(failure.message.is_ascii(), "{failure:?}");
            assert!(failure.message.contains("(line "), "{failure:?}");
            if failure.code == Code::TooDeep {
                assert!(depth_over(data, DEPTH_CAP).is_some(), "{failure:?}");
            }
        }
    }
}

/// [`check_value`] over the text, then only whitespace, is [`parse`]: the same decision, and on a
/// value that fails, the same failure (once reclassified for a text that is not UTF-8).
fn check_agrees(data: &[u8], parsed: &Result<Value, Failure>) {
    let mut jiter = Jiter::new(data);
    match (check_value(&mut jiter, data, DEPTH_CAP), parsed) {
        (Ok(()), Ok(_)) => assert!(jiter.finish().is_ok(), "check_value stopped early"),
        (Ok(()), Err(failure)) => {
            // the value is sound: what the parse refused is the text after it
            assert!(jiter.finish().is_err(), "{failure:?}");
            assert!(
                matches!(failure.code, Code::InvalidJson | Code::InvalidUtf8),
                "{failure:?}"
            );
            assert_eq!(failure.path, "", "{failure:?}");
        }
        (Err(checked), Ok(_)) => panic!("check_value refuses a parsed text: {checked:?}"),
        (Err(checked), Err(failure)) => assert_eq!(&utf8_first(data, checked), failure),
    }
}

const MAX_ID_BYTES: usize = 16;

pub fn envelope_check(data: &[u8]) {
    if let Ok(Piece::Call(piece)) =
        envelope::decode(data, envelope::RecordHeaders::default(), MAX_ID_BYTES)
    {
        assert!(piece.stream_id.len() <= MAX_ID_BYTES && piece.call_id.len() <= MAX_ID_BYTES);
        for id in [
            &piece.tool,
            &piece.tool_version,
            &piece.idempotency_key,
            &piece.principal,
        ] {
            assert!(id.as_ref().is_none_or(|id| id.len() <= MAX_ID_BYTES));
        }
    }
}

fn limits() -> Limits {
    Limits {
        max_call_bytes: 40,
        max_call_chunks: 6,
        max_open_calls: 4,
        idle_timeout_ms: 50,
        max_call_lifetime_ms: 200,
        recently_closed: 3,
    }
}

/// One step of a script: a record (its timestamp and piece), or a write of the state.
#[derive(Clone, Debug)]
enum Step {
    Record(i64, Box<Piece<'static>>),
    Write { full: bool },
}

fn script(data: &[u8]) -> Vec<Step> {
    const STREAMS: [&str; 3] = ["a", "b", "c"];
    const CALLS: [&str; 3] = ["x", "y", "z"];
    let mut steps = Vec::new();
    let mut clock = 0i64;
    let mut bytes = data.chunks(3);
    while let Some(&[op, arg, more]) = bytes.next() {
        clock += i64::from(more % 4) * 20;
        let stream = Cow::Borrowed(STREAMS[usize::from(arg % 3)]);
        let call = Cow::Borrowed(CALLS[usize::from(arg / 3 % 3)]);
        let piece = match op % 8 {
            0..=3 => Piece::Call(CallPiece {
                stream_id: stream,
                call_id: call,
                channel: if op % 16 == 15 {
                    Channel::Text
                } else {
                    Channel::ToolCall
                },
                seq: (op & 0x10 != 0).then_some(u32::from(more % 5)),
                tool: (op & 0x20 != 0).then(|| "t".into()),
                tool_version: None,
                delta: "ab{}\"".chars().take(usize::from(more % 6)).collect(),
                is_final: op & 0x40 != 0,
                idempotency_key: None,
                // now and then a principal, and another on the same call (a contradiction)
                principal: (op & 0x20 != 0 && more % 4 >= 2)
                    .then_some(Cow::Borrowed(if more % 16 >= 8 { "p" } else { "q" })),
                trace: None,
                expected: (op & 0x80 != 0).then_some(Cow::Borrowed("ab")),
                opens: op & 0x08 == 0 || op & 0x20 != 0,
                // a stated origin, now and then another on the same call (a contradiction)
                origin: (op & 0x20 != 0 && more % 8 >= 4).then(|| {
                    Box::new(Origin {
                        kind: CallKind::Custom,
                        caller: Some("{}".into()),
                        double_encoded: more % 2 == 0,
                    })
                }),
            }),
            4 | 5 => Piece::End {
                stream_id: stream,
                finish: [None, Some(Finish::Length), Some(Finish::Stop)][usize::from(more % 3)],
            },
            6 => Piece::Abort {
                stream_id: stream,
                call_id: call,
            },
            _ => {
                steps.push(Step::Write {
                    full: more % 2 == 0,
                });
                continue;
            }
        };
        steps.push(Step::Record(clock, Box::new(piece)));
    }
    steps
}

fn line(closed: &Closed) -> String {
    format!(
        "{}/{} {:?} {:?} {} {} {} {:?}",
        closed.stream_id,
        closed.call_id,
        closed.ending,
        closed.text,
        closed.first_offset,
        closed.last_offset,
        closed.chunks,
        closed.origin,
    )
}

/// Runs the script from `start`; the lines of the calls it closes, and the frames written.
fn run(
    assembler: &mut Assembler,
    steps: &[Step],
    start: usize,
    frames: &mut Vec<Vec<u8>>,
) -> Vec<String> {
    let scope: Scope = (Arc::from("t"), 0);
    let mut lines = Vec::new();
    for (index, step) in steps.iter().enumerate().skip(start) {
        match step {
            Step::Write { full: true } => *frames = vec![snapshot::write_base(assembler, &scope)],
            Step::Write { full: false } if frames.is_empty() => {
                frames.push(snapshot::write_base(assembler, &scope));
            }
            Step::Write { full: false } => frames.push(snapshot::write_delta(assembler, &scope)),
            Step::Record(clock, piece) => {
                let mut out = Vec::new();
                let offset = index as i64;
                if assembler.begin_record(&scope, offset, Some(*clock), &mut out) {
                    assembler.feed(&scope, offset, (**piece).clone(), &mut out);
                }
                for closed in &out {
                    check_complete(closed, steps);
                }
                lines.extend(out.iter().map(line));
            }
        }
        check_counts(assembler);
    }
    lines
}

/// A complete call holds the deltas of the pieces of its span in order, a piece without `seq`
/// taking the next place and a piece whose `seq` names a place already taken being a
/// retransmission of it (a different one would have made the call corrupt).
fn check_complete(closed: &Closed, steps: &[Step]) {
    if closed.ending != Ending::Complete {
        assert!(closed.text.is_empty());
        return;
    }
    let mut taken: Vec<&str> = Vec::new();
    for offset in closed.first_offset..=closed.last_offset {
        let Step::Record(_, record) = &steps[offset as usize] else {
            continue;
        };
        let Piece::Call(piece) = &**record else {
            continue;
        };
        if *piece.stream_id != *closed.stream_id || *piece.call_id != *closed.call_id {
            continue;
        }
        match piece.seq {
            Some(seq) if (seq as usize) < taken.len() => {
                assert_eq!(
                    taken[seq as usize], piece.delta,
                    "a differing repeat was taken"
                );
            }
            Some(seq) => {
                assert_eq!(seq as usize, taken.len(), "a gap was taken");
                taken.push(&piece.delta);
            }
            None => taken.push(&piece.delta),
        }
    }
    assert_eq!(closed.text, taken.concat().as_bytes(), "{closed:?}");
    assert_eq!(closed.chunks as usize, taken.len());
}

fn check_counts(assembler: &Assembler) {
    let open: usize = assembler
        .partitions
        .values()
        .map(|p| p.calls().count())
        .sum();
    let buffered: usize = assembler
        .partitions
        .values()
        .flat_map(|p| p.calls())
        .map(|(_, _, c)| c.body.text().len())
        .sum();
    for part in assembler.partitions.values() {
        assert_eq!(part.open, part.calls().count());
    }
    assert_eq!(assembler.open_calls(), open);
    assert_eq!(assembler.buffered_bytes(), buffered);
}

pub fn assembler_check(data: &[u8]) {
    let steps = script(data);
    let scope: Scope = (Arc::from("t"), 0);
    let mut original = Assembler::new(limits());
    let mut frames = Vec::new();
    let expected = run(&mut original, &steps, 0, &mut frames);
    // restore after every write, and decide the rest of the script
    let mut live = Assembler::new(limits());
    let mut frames = Vec::new();
    let mut before = Vec::new();
    for (index, step) in steps.iter().enumerate() {
        before.extend(run(&mut live, &steps[..=index], index, &mut frames));
        if matches!(step, Step::Write { .. }) && !frames.is_empty() {
            let mut restored = Assembler::new(limits());
            snapshot::restore(&mut restored, &scope, &frames).expect("a written state restores");
            let mut rest_frames = frames.clone();
            let mut lines = before.clone();
            lines.extend(run(&mut restored, &steps, index + 1, &mut rest_frames));
            assert_eq!(lines, expected, "restored after step {index}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn some_scripts() {
        for data in [
            &b""[..],
            b"\x20\x00\x01\x10\x00\x02\x50\x00\x03",
            b"\x30\x00\x00\x07\x00\x00\x30\x00\x01\x07\x01\x00\x70\x00\x02",
            b"\x04\x01\x03\x20\x04\x00\x06\x04\x00\x07\x00\x01\x24\x04\x03",
        ] {
            assembler_check(data);
            envelope_check(data);
        }
    }

    #[test]
    fn values_round_trip_through_their_text() {
        for text in [
            r#"{"a": [1, 2.5, -0.0, 1e300, 5e-324, "\u0000\u001f\"\\"], "b": {"c": null}}"#,
            "18446744073709551615",
            r#"["\ud83d\ude00", "\u00e9"]"#,
        ] {
            parse_check(text.as_bytes());
        }
    }
}
