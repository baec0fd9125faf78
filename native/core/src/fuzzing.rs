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
//!
//! `early_check`: the bytes choose a schema in the keywords the early judge decides and a value,
//! spelled with random whitespace and escapes, fed whole-prefix by byte and in random chunks: a
//! value the keywords accept (by a reference of their JSON Schema meaning) is never rejected
//! early, and an early rejection is only ever of a value the reference rejects
//! (`tests/early_props.rs` runs it on 20 000 generated inputs).

use std::borrow::Cow;
use std::sync::Arc;

use crate::assembler::{
    Assembler, CallPiece, Channel, Closed, Ending, Finish, Incomplete, Limits, Piece, Scope,
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
                reason: [Incomplete::StreamCorrupt, Incomplete::MaxTokens][usize::from(more % 2)],
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
                    assembler
                        .feed(&scope, offset, (**piece).clone(), &mut out)
                        .expect("no stream of envelopes here");
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

/// The early target's checks: the bytes choose a schema in the keywords the early judge decides
/// and a value (mostly one the schema accepts), spelled with random whitespace and escapes and
/// fed in random chunks. A value the schema accepts (by the reference below, the keywords'
/// meaning in JSON Schema) is never rejected; a rejection of a schema keyword is only ever of a
/// value the reference rejects too. True when the judge rejected the value.
pub fn early_check(data: &[u8]) -> bool {
    use crate::early::{Draft, EarlySchema, Judge, Rejection};
    let mut source = Source { data, at: 0 };
    let schema = gen_schema(&mut source, 0);
    let value = gen_value(&mut source, &schema, 0);
    let mut text = String::new();
    spell(&mut source, &value, &mut text);
    let compiled = EarlySchema::compile(schema.to_json().as_bytes(), Draft::Draft2020, &[])
        .expect("a generated schema compiles");
    let compiled = Arc::new(compiled);
    // the chain's own rule first: the arguments are an object
    let object = matches!(value, Value::Object(_));
    let valid = object && reference_valid(&schema, &value);
    let bytes = text.as_bytes();
    // byte by byte, and in the chunks the source chooses
    let mut rejected = false;
    for chunked in [false, true] {
        let mut judge = Judge::new(compiled.clone(), 64);
        let mut end = 0;
        while end < bytes.len() {
            let step = if chunked { 1 + source.below(8) } else { 1 };
            end = (end + step).min(bytes.len());
            while !text.is_char_boundary(end) {
                end += 1;
            }
            if let Some(rejection) = judge.feed(&bytes[..end]) {
                assert!(
                    !valid,
                    "{text} is valid under {} but rejected early at {end}: {rejection:?}",
                    schema.to_json()
                );
                match rejection {
                    Rejection::Schema { .. } => assert!(object, "{text}"),
                    Rejection::RootNotObject => assert!(!object, "{text}"),
                    Rejection::Json(failure) => panic!("{text} is JSON: {failure:?}"),
                }
                rejected = true;
                break;
            }
        }
    }
    rejected
}

struct Source<'a> {
    data: &'a [u8],
    at: usize,
}

impl Source<'_> {
    fn byte(&mut self) -> u8 {
        let byte = self.data.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        byte
    }

    fn below(&mut self, n: usize) -> usize {
        self.byte() as usize % n.max(1)
    }
}

const WORDS: [&str; 6] = ["a", "ab", "b", "é", "\u{1F600}x", "a\"\\/"];

fn gen_scalar(source: &mut Source<'_>) -> Value {
    match source.below(6) {
        0 => Value::Null,
        1 => Value::Bool(source.byte().is_multiple_of(2)),
        2 => Value::Int(source.byte() as i128 - 128),
        3 => Value::Float((source.byte() as f64 - 128.0) / 4.0),
        _ => Value::Str(WORDS[source.below(WORDS.len())].to_owned()),
    }
}

fn gen_schema(source: &mut Source<'_>, depth: usize) -> Value {
    let mut members: Vec<(String, Value)> = Vec::new();
    let types = [
        "null", "boolean", "integer", "number", "string", "array", "object",
    ];
    let flags = source.byte();
    if flags & 1 != 0 {
        let name = types[source.below(types.len())];
        members.push(("type".into(), Value::Str(name.into())));
    }
    if flags & 2 != 0 {
        let options = (0..1 + source.below(3))
            .map(|_| gen_scalar(source))
            .collect();
        members.push(("enum".into(), Value::Array(options)));
    }
    if flags & 4 != 0 {
        members.push(("maxLength".into(), Value::Int(source.below(4) as i128)));
    }
    if flags & 8 != 0 {
        members.push(("maxItems".into(), Value::Int(source.below(3) as i128)));
    }
    if flags & 16 != 0 {
        let keyword =
            ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"][source.below(4)];
        let bound = match gen_scalar(source) {
            number @ (Value::Int(_) | Value::Float(_)) => number,
            _ => Value::Int(0),
        };
        members.push((keyword.into(), bound));
    }
    if depth < 3 && flags & 32 != 0 {
        members.push(("items".into(), gen_schema(source, depth + 1)));
    }
    if depth < 3 && flags & 64 != 0 {
        let properties = (0..source.below(3))
            .map(|n| {
                (
                    ["a", "b", "c\u{e9}"][n].to_owned(),
                    gen_schema(source, depth + 1),
                )
            })
            .collect();
        members.push(("properties".into(), Value::Object(properties)));
        if flags & 128 != 0 {
            members.push(("additionalProperties".into(), Value::Bool(false)));
        }
    }
    if depth == 0 {
        members.retain(|(key, _)| !matches!(key.as_str(), "type" | "enum"));
        members.push(("type".into(), Value::Str("object".into())));
    }
    Value::Object(members)
}

fn get<'v>(schema: &'v Value, name: &str) -> Option<&'v Value> {
    match schema {
        Value::Object(members) => members.iter().find(|(k, _)| k == name).map(|(_, v)| v),
        _ => None,
    }
}

/// A value for `schema`, valid unless the source says otherwise (a quarter of the choices).
fn gen_value(source: &mut Source<'_>, schema: &Value, depth: usize) -> Value {
    let wild = source.below(4) == 0;
    if let (false, Some(Value::Array(options))) = (wild, get(schema, "enum")) {
        return options[source.below(options.len())].clone();
    }
    let kind = match (wild, get(schema, "type")) {
        (false, Some(Value::Str(name))) => name.clone(),
        _ => [
            "null", "boolean", "integer", "number", "string", "array", "object",
        ][source.below(7)]
        .to_owned(),
    };
    match kind.as_str() {
        "null" => Value::Null,
        "boolean" => Value::Bool(source.byte().is_multiple_of(2)),
        "integer" => Value::Int(source.byte() as i128 - 128),
        "number" => Value::Float((source.byte() as f64 - 128.0) / 4.0),
        "string" => {
            let mut text = String::new();
            let room = match (wild, get(schema, "maxLength")) {
                (false, Some(Value::Int(max))) => *max as usize,
                _ => 4,
            };
            for _ in 0..source.below(room + 1) {
                text.push(['a', 'é', '"', '\u{1F600}', '\\', '\n'][source.below(6)]);
            }
            Value::Str(text)
        }
        "array" if depth < 4 => {
            let room = match (wild, get(schema, "maxItems")) {
                (false, Some(Value::Int(max))) => *max as usize,
                _ => 3,
            };
            let items = get(schema, "items").cloned().unwrap_or(Value::Bool(true));
            Value::Array(
                (0..source.below(room + 1))
                    .map(|_| gen_value(source, &items, depth + 1))
                    .collect(),
            )
        }
        "object" if depth < 4 => {
            let mut members = Vec::new();
            if let Some(Value::Object(properties)) = get(schema, "properties") {
                for (name, sub) in properties {
                    if source.below(3) != 0 {
                        members.push((name.clone(), gen_value(source, sub, depth + 1)));
                    }
                }
            }
            if (wild || get(schema, "additionalProperties").is_none()) && source.below(3) == 0 {
                members.push(("z\u{e9}".to_owned(), gen_scalar(source)));
            }
            Value::Object(members)
        }
        _ => Value::Null,
    }
}

fn number_of(value: &Value) -> Option<f64> {
    match value {
        Value::Int(n) => Some(*n as f64),
        Value::Float(f) => Some(*f),
        _ => None,
    }
}

fn json_equal(a: &Value, b: &Value) -> bool {
    match (number_of(a), number_of(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// The supported keywords' meaning in JSON Schema (the generated numbers are exact in f64).
fn reference_valid(schema: &Value, value: &Value) -> bool {
    let kind_ok = match get(schema, "type") {
        Some(Value::Str(name)) => match (name.as_str(), value) {
            ("null", Value::Null) | ("boolean", Value::Bool(_)) => true,
            ("integer", Value::Int(_)) => true,
            ("integer", Value::Float(f)) => f.fract() == 0.0,
            ("number", Value::Int(_) | Value::Float(_)) => true,
            ("string", Value::Str(_)) | ("array", Value::Array(_)) => true,
            ("object", Value::Object(_)) => true,
            _ => false,
        },
        _ => true,
    };
    if !kind_ok {
        return false;
    }
    if let Some(Value::Array(options)) = get(schema, "enum") {
        if !options.iter().any(|option| json_equal(option, value)) {
            return false;
        }
    }
    if let (Some(Value::Int(max)), Value::Str(text)) = (get(schema, "maxLength"), value) {
        if text.chars().count() as i128 > *max {
            return false;
        }
    }
    if let Value::Array(items) = value {
        if let Some(Value::Int(max)) = get(schema, "maxItems") {
            if items.len() as i128 > *max {
                return false;
            }
        }
        if let Some(sub) = get(schema, "items") {
            if !items.iter().all(|item| reference_valid(sub, item)) {
                return false;
            }
        }
    }
    if let Some(x) = number_of(value) {
        for (keyword, ok) in [
            ("minimum", &(|b: f64| x >= b) as &dyn Fn(f64) -> bool),
            ("maximum", &|b: f64| x <= b),
            ("exclusiveMinimum", &|b: f64| x > b),
            ("exclusiveMaximum", &|b: f64| x < b),
        ] {
            if let Some(bound) = get(schema, keyword).and_then(number_of) {
                if !ok(bound) {
                    return false;
                }
            }
        }
    }
    if let Value::Object(members) = value {
        let properties = match get(schema, "properties") {
            Some(Value::Object(properties)) => properties.as_slice(),
            _ => &[],
        };
        let closed = matches!(
            get(schema, "additionalProperties"),
            Some(Value::Bool(false))
        );
        for (name, member) in members {
            match properties.iter().find(|(known, _)| known == name) {
                Some((_, sub)) if !reference_valid(sub, member) => return false,
                Some(_) => {}
                None if closed => return false,
                None => {}
            }
        }
    }
    true
}

/// `value` as JSON text with random whitespace, and strings with random escapes.
fn spell(source: &mut Source<'_>, value: &Value, out: &mut String) {
    match value {
        Value::Str(text) => spell_string(source, text, out),
        Value::Array(items) => spell_list(source, "[]", items, out, |source, item, out| {
            spell(source, item, out)
        }),
        Value::Object(members) => {
            spell_list(source, "{}", members, out, |source, (key, member), out| {
                spell_string(source, key, out);
                space(source, out);
                out.push(':');
                spell(source, member, out);
            })
        }
        Value::Float(f) if source.below(2) == 0 => out.push_str(&format!("{f:e}")),
        other => out.push_str(&other.to_json()),
    }
}

fn space(source: &mut Source<'_>, out: &mut String) {
    if source.below(4) == 0 {
        out.push([' ', '\n', '\t', '\r'][source.below(4)]);
    }
}

/// A container's elements between its brackets, with commas and random whitespace.
fn spell_list<T>(
    source: &mut Source<'_>,
    brackets: &str,
    items: &[T],
    out: &mut String,
    each: impl Fn(&mut Source<'_>, &T, &mut String),
) {
    let (open, close) = brackets.split_at(1);
    out.push_str(open);
    for (n, item) in items.iter().enumerate() {
        if n > 0 {
            out.push(',');
        }
        space(source, out);
        each(source, item, out);
        space(source, out);
    }
    out.push_str(close);
}

fn spell_string(source: &mut Source<'_>, text: &str, out: &mut String) {
    out.push('"');
    for c in text.chars() {
        let escape = source.below(3) == 0 || matches!(c, '"' | '\\' | '\n');
        if !escape {
            out.push(c);
            continue;
        }
        let mut units = [0u16; 2];
        for unit in c.encode_utf16(&mut units) {
            out.push_str(&format!("\\u{unit:04x}"));
        }
    }
    out.push('"');
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
