//! The canonical chunk envelope: one JSON object per record, decoded strictly into a [`Piece`].
//!
//! ```json
//! {"stream_id": "resp_1", "call_id": "call_1", "seq": 0, "kind": "tool_call",
//!  "tool": "get_weather", "tool_version": "1", "delta": "{\"city\":\"Hang", "final": false,
//!  "idempotency_key": null, "principal": null, "trace_id": null, "run_id": null,
//!  "step_id": null, "attempt": null}
//! ```
//!
//! `principal` names who the call is made for (what the gate's authorization phase judges); a
//! record may name it in its `principal` header instead. Both present and different is
//! malformed: a record names one principal.
//!
//! `kind` is `tool_call | text | refusal | error | end`; an `end` names its stream and an
//! optional `finish_reason`. Strict: the text must be one JSON object, no field twice, every
//! known field of its type, identifiers and trace fields at most `max_id_bytes` long. Unknown
//! fields are allowed (producers may add their own) but must be strict JSON too. What is wrong is
//! said in a [`Malformed`], together with whatever stream and call it could still name, so the
//! caller can end those calls instead of letting them go on without this piece.
//!
//! Pure Rust and no Python: `lib.rs` runs it on a whole batch with the interpreter released.

use std::borrow::Cow;
use std::collections::HashSet;

use jiter::{Jiter, NumberAny, NumberInt, Peek};

use crate::assembler::{CallPiece, Channel, Finish, Piece, Trace};
use crate::json;

/// Why a record is not an envelope, and the stream and call it still names, if any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Malformed {
    pub message: String,
    pub stream_id: Option<String>,
    pub call_id: Option<String>,
}

/// A field's value as the envelope rules need to see it; a string without escapes borrows the
/// record's bytes.
#[derive(Clone, Debug, PartialEq)]
enum Value<'a> {
    Null,
    Bool(bool),
    Int(i64),
    Str(Cow<'a, str>),
    /// A number that is not an integer, an array or an object: never right for a known field.
    Other,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    StreamId,
    CallId,
    Seq,
    Kind,
    Tool,
    ToolVersion,
    Delta,
    Final,
    IdempotencyKey,
    Principal,
    FinishReason,
    TraceId,
    RunId,
    StepId,
    Attempt,
}

impl Field {
    const COUNT: usize = 15;

    fn named(name: &str) -> Option<Field> {
        Some(match name {
            "stream_id" => Field::StreamId,
            "call_id" => Field::CallId,
            "seq" => Field::Seq,
            "kind" => Field::Kind,
            "tool" => Field::Tool,
            "tool_version" => Field::ToolVersion,
            "delta" => Field::Delta,
            "final" => Field::Final,
            "idempotency_key" => Field::IdempotencyKey,
            "principal" => Field::Principal,
            "finish_reason" => Field::FinishReason,
            "trace_id" => Field::TraceId,
            "run_id" => Field::RunId,
            "step_id" => Field::StepId,
            "attempt" => Field::Attempt,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Field::StreamId => "stream_id",
            Field::CallId => "call_id",
            Field::Seq => "seq",
            Field::Kind => "kind",
            Field::Tool => "tool",
            Field::ToolVersion => "tool_version",
            Field::Delta => "delta",
            Field::Final => "final",
            Field::IdempotencyKey => "idempotency_key",
            Field::Principal => "principal",
            Field::FinishReason => "finish_reason",
            Field::TraceId => "trace_id",
            Field::RunId => "run_id",
            Field::StepId => "step_id",
            Field::Attempt => "attempt",
        }
    }
}

const KINDS: &str = "['end', 'error', 'refusal', 'text', 'tool_call']";

/// The headers of a record that an envelope's piece takes (each at most `max_id_bytes`).
#[derive(Clone, Copy, Debug, Default)]
pub struct RecordHeaders<'h> {
    pub traceparent: Option<&'h str>,
    pub principal: Option<&'h str>,
}

/// Decode one envelope record with its headers. The piece borrows the record's text where it
/// can.
pub fn decode<'a>(
    text: &'a [u8],
    headers: RecordHeaders<'_>,
    max_id_bytes: usize,
) -> Result<Piece<'a>, Malformed> {
    decode_with(text, headers, max_id_bytes, &mut Vec::new())
}

/// [`decode`] with a buffer for unescaping strings that the caller keeps from one record to the
/// next (a batch decodes its records through one).
pub fn decode_with<'a>(
    text: &'a [u8],
    headers: RecordHeaders<'_>,
    max_id_bytes: usize,
    tape: &mut Vec<u8>,
) -> Result<Piece<'a>, Malformed> {
    let unreadable = |message: String| {
        let (stream_id, call_id) = readable_ids(text, max_id_bytes);
        Malformed {
            message,
            stream_id,
            call_id,
        }
    };
    if headers
        .traceparent
        .is_some_and(|tp| tp.len() > max_id_bytes)
    {
        return Err(unreadable(format!(
            "header 'traceparent' is longer than {max_id_bytes} bytes"
        )));
    }
    let mut values = Values::default();
    read_fields(text, tape, &mut values).map_err(unreadable)?;
    Fields {
        values: &mut values,
        max_id_bytes,
    }
    .piece(headers)
}

/// The `stream_id` and `call_id` a record that cannot be decoded still names: read from its
/// top-level members as far as the text can be read, each a non-empty string within
/// `max_id_bytes` given once (or twice alike). Whatever else is wrong with the record, a piece
/// that names its stream ends that stream's calls (and is rejected under its call), on every
/// path: keyed, unkeyed and offline alike.
pub fn readable_ids(text: &[u8], max_id_bytes: usize) -> (Option<String>, Option<String>) {
    /// Nothing read yet, one value, or values that disagree (or are not identifiers).
    enum Seen {
        None,
        One(String),
        Unusable,
    }
    impl Seen {
        fn add(&mut self, value: Option<&str>, max_id_bytes: usize) {
            *self = match (std::mem::replace(self, Seen::Unusable), value) {
                (Seen::None, Some(v)) if !v.is_empty() && v.len() <= max_id_bytes => {
                    Seen::One(v.to_owned())
                }
                (Seen::One(known), Some(v)) if known == v => Seen::One(known),
                _ => Seen::Unusable,
            };
        }
        fn get(self) -> Option<String> {
            match self {
                Seen::One(value) => Some(value),
                _ => None,
            }
        }
    }
    let (mut stream, mut call) = (Seen::None, Seen::None);
    let mut jiter = Jiter::new(text);
    if jiter.peek().ok() == Some(Peek::Object) {
        let mut key = jiter.known_object().ok().flatten().map(str::to_owned);
        while let Some(name) = key {
            let seen = match name.as_str() {
                "stream_id" => &mut stream,
                "call_id" => &mut call,
                _ => {
                    if jiter.next_skip().is_err() {
                        break;
                    }
                    key = jiter.next_key().ok().flatten().map(str::to_owned);
                    continue;
                }
            };
            match jiter.peek() {
                Ok(Peek::String) => match jiter.known_str() {
                    Ok(value) => seen.add(Some(value), max_id_bytes),
                    Err(_) => break,
                },
                Ok(_) => {
                    seen.add(None, max_id_bytes);
                    if jiter.next_skip().is_err() {
                        break;
                    }
                }
                Err(_) => break,
            }
            key = jiter.next_key().ok().flatten().map(str::to_owned);
        }
    }
    (stream.get(), call.get())
}

type Values<'a> = [Option<Value<'a>>; Field::COUNT];

fn read_fields<'a>(
    text: &'a [u8],
    tape: &mut Vec<u8>,
    values: &mut Values<'a>,
) -> Result<(), String> {
    let mut jiter = Jiter::with_tape(text, std::mem::take(tape));
    let read = read_object(&mut jiter, text, values);
    *tape = jiter.into_tape();
    read
}

fn read_object<'a>(
    jiter: &mut Jiter<'a>,
    text: &'a [u8],
    values: &mut Values<'a>,
) -> Result<(), String> {
    // checked once here rather than string by string (a record that is not all UTF-8 is
    // refused by the parse, which says where)
    let whole = std::str::from_utf8(text).ok();
    let not_json = |e: jiter::JiterError| format!("record is not JSON: {e}");
    if jiter.peek().map_err(not_json)? != Peek::Object {
        return Err("envelope must be a JSON object".to_owned());
    }
    // a hash set (made at the first): a record of many distinct unknown fields costs linear
    // time, not quadratic
    let mut unknown: Option<HashSet<String>> = None;
    let mut key = jiter.known_object().map_err(not_json)?.map(Key::of);
    while let Some(name) = key {
        match name {
            Key::Known(field) => {
                let slot = &mut values[field as usize];
                if slot.is_some() {
                    return Err(format!("envelope has the field {:?} twice", field.name()));
                }
                *slot = Some(
                    read_value(jiter, text, whole)
                        .map_err(|e| format!("envelope field {:?}: {e}", field.name()))?,
                );
            }
            // an unknown field's name is the producer's text: it is never echoed
            Key::Unknown(name) => {
                let unknown = unknown.get_or_insert_with(HashSet::new);
                if unknown.contains(&name) {
                    return Err("envelope has an unknown field twice".to_owned());
                }
                check_strict(jiter, text).map_err(|e| format!("an unknown envelope field: {e}"))?;
                unknown.insert(name);
            }
        }
        key = jiter.next_key().map_err(not_json)?.map(Key::of);
    }
    jiter.finish().map_err(not_json)
}

/// An object key: a known field, or the name of an unknown one (kept to refuse it twice).
enum Key {
    Known(Field),
    Unknown(String),
}

impl Key {
    #[inline(always)]
    fn of(name: &str) -> Key {
        match Field::named(name) {
            Some(field) => Key::Known(field),
            None => Key::Unknown(name.to_owned()),
        }
    }
}

/// `whole`: the record's text as a `str`, when all of it is UTF-8 (its strings borrow from it).
fn read_value<'j>(
    jiter: &mut Jiter<'j>,
    text: &'j [u8],
    whole: Option<&'j str>,
) -> Result<Value<'j>, String> {
    let peek = jiter.peek().map_err(|e| e.to_string())?;
    Ok(match peek {
        Peek::Null => {
            jiter.known_null().map_err(|e| e.to_string())?;
            Value::Null
        }
        Peek::True | Peek::False => Value::Bool(jiter.known_bool(peek).map_err(|e| e.to_string())?),
        Peek::String => {
            // the string's first byte, after its quote
            let at = jiter.current_index() + 1;
            let decoded = jiter.known_str().map_err(|e| e.to_string())?;
            // a string without escapes is decoded as the input's own bytes: borrowed, not copied
            let borrowed = whole
                .and_then(|whole| whole.get(at..at + decoded.len()))
                .filter(|raw| std::ptr::eq(raw.as_bytes(), decoded.as_bytes()));
            Value::Str(borrowed.map_or_else(|| Cow::Owned(decoded.to_owned()), Cow::Borrowed))
        }
        _ if peek.is_num() => match jiter.known_number(peek).map_err(|e| e.to_string())? {
            NumberAny::Int(NumberInt::Int(i)) => Value::Int(i),
            _ => Value::Other,
        },
        _ => {
            check_strict(jiter, text)?;
            Value::Other
        }
    })
}

/// Nesting allowed inside an unknown field's value (and a known field's container, which is
/// refused for its type once it is known to be strict JSON): the record, an object around them,
/// nests at most [`json::MAX_DEPTH`] levels, as every JSON callgate reads.
const MAX_FIELD_DEPTH: usize = json::MAX_DEPTH - 1;

/// Takes one field value that is not read, checked as strictly as any JSON callgate parses (the
/// one rule, in `json.rs`). The message says what and where (line, column) without echoing the
/// text.
fn check_strict<'j>(jiter: &mut Jiter<'j>, text: &'j [u8]) -> Result<(), String> {
    json::check_value(jiter, text, MAX_FIELD_DEPTH).map_err(|failure| failure.message)
}

/// An envelope's fields besides its stream, call and kind, checked.
struct Common<'a> {
    seq: Option<u32>,
    delta: Cow<'a, str>,
    is_final: bool,
    tool: Option<Cow<'a, str>>,
    tool_version: Option<Cow<'a, str>>,
    idempotency_key: Option<Cow<'a, str>>,
    principal: Option<Cow<'a, str>>,
    trace: Option<Box<Trace>>,
    finish: Option<Finish>,
}

struct Fields<'v, 'a> {
    values: &'v mut Values<'a>,
    max_id_bytes: usize,
}

impl<'a> Fields<'_, 'a> {
    fn take(&mut self, field: Field) -> Value<'a> {
        self.values[field as usize].take().unwrap_or(Value::Null)
    }

    /// An optional string field, at most `max_id_bytes` long.
    fn id(&mut self, field: Field) -> Result<Option<Cow<'a, str>>, String> {
        match self.take(field) {
            Value::Null => Ok(None),
            Value::Str(s) if s.len() > self.max_id_bytes => Err(format!(
                "envelope field {:?} is longer than {} bytes",
                field.name(),
                self.max_id_bytes
            )),
            Value::Str(s) => Ok(Some(s)),
            _ => Err(format!(
                "envelope field {:?} must be a string or null",
                field.name()
            )),
        }
    }

    /// A non-empty string field.
    fn required_id(&mut self, field: Field) -> Result<Cow<'a, str>, String> {
        match self.id(field)? {
            Some(s) if !s.is_empty() => Ok(s),
            _ => Err(format!(
                "envelope needs a non-empty string {:?}",
                field.name()
            )),
        }
    }

    fn piece(mut self, headers: RecordHeaders<'_>) -> Result<Piece<'a>, Malformed> {
        let fail = |message: String, stream: Option<&str>, call: Option<&str>| Malformed {
            message,
            stream_id: stream.map(str::to_owned),
            call_id: call.map(str::to_owned),
        };
        // the call is named whenever its id can be read, whatever else is wrong
        let call_id = self.id(Field::CallId);
        let stream_id = match self.required_id(Field::StreamId) {
            Ok(stream_id) => stream_id,
            Err(message) => return Err(fail(message, None, None)),
        };
        let stream = Some(&*stream_id);
        let readable_call = call_id.as_ref().ok().and_then(|c| c.as_deref());
        let readable_call = readable_call.filter(|c| !c.is_empty());
        let bad_kind = || format!("envelope 'kind' must be one of {KINDS}");
        let kind = match self.take(Field::Kind) {
            Value::Str(kind) if kind == "end" => None,
            Value::Str(kind) => match Channel::parse(&kind) {
                Some(Channel::McpResult) | None => {
                    return Err(fail(bad_kind(), stream, readable_call))
                }
                Some(channel) => Some(channel),
            },
            _ => return Err(fail(bad_kind(), stream, readable_call)),
        };
        // every known field is checked on every kind of envelope, used or not
        let fields = self
            .common(headers)
            .map_err(|m| fail(m, stream, readable_call))?;
        let Some(channel) = kind else {
            call_id.map_err(|m| fail(m, stream, None))?;
            return Ok(Piece::End {
                stream_id,
                finish: fields.finish,
            });
        };
        let call_id = match call_id {
            Ok(Some(call_id)) if !call_id.is_empty() => call_id,
            Ok(_) => {
                return Err(fail(
                    format!(
                        "a '{}' envelope needs a non-empty string \"call_id\"",
                        channel.as_str()
                    ),
                    stream,
                    None,
                ))
            }
            Err(message) => return Err(fail(message, stream, None)),
        };
        let Common {
            seq,
            delta,
            is_final,
            tool,
            tool_version,
            idempotency_key,
            trace,
            principal,
            finish: _,
        } = fields;
        Ok(Piece::Call(CallPiece {
            stream_id,
            call_id,
            channel,
            seq,
            tool,
            tool_version,
            delta,
            is_final,
            idempotency_key,
            principal,
            trace,
            expected: None,
            opens: true,
            origin: None,
        }))
    }

    /// The fields besides the stream, call and kind, each checked for its type and bound.
    fn common(&mut self, headers: RecordHeaders<'_>) -> Result<Common<'a>, String> {
        let finish = match self.take(Field::FinishReason) {
            Value::Null => None,
            Value::Str(name) if Finish::parse(&name).is_some() => Finish::parse(&name),
            _ => {
                let names = Finish::NAMES.map(|n| format!("'{n}'")).join(", ");
                return Err(format!("'finish_reason' must be one of [{names}]"));
            }
        };
        let seq = match self.take(Field::Seq) {
            Value::Null => None,
            Value::Int(seq) if (0..=i64::from(u32::MAX)).contains(&seq) => Some(seq as u32),
            _ => return Err("envelope field 'seq' must be an integer >= 0".to_owned()),
        };
        let delta = match self.take(Field::Delta) {
            Value::Null => Cow::Borrowed(""),
            Value::Str(delta) => delta,
            _ => return Err("envelope field 'delta' must be a string".to_owned()),
        };
        let is_final = match self.take(Field::Final) {
            Value::Null => false,
            Value::Bool(b) => b,
            _ => return Err("envelope field 'final' must be true or false".to_owned()),
        };
        let tool = self.id(Field::Tool)?;
        let tool_version = match self.take(Field::ToolVersion) {
            Value::Null => None,
            Value::Int(v) => Some(Cow::Owned(v.to_string())),
            Value::Str(v) if v.len() <= self.max_id_bytes => Some(v),
            Value::Str(_) => {
                return Err(format!(
                    "envelope field 'tool_version' is longer than {} bytes",
                    self.max_id_bytes
                ))
            }
            _ => {
                return Err(
                    "envelope field 'tool_version' must be a string, an integer or null".to_owned(),
                )
            }
        };
        let idempotency_key = self.id(Field::IdempotencyKey)?;
        let principal = self.principal(headers.principal)?;
        let trace = self.trace(headers.traceparent)?;
        Ok(Common {
            seq,
            delta,
            is_final,
            tool,
            tool_version,
            idempotency_key,
            principal,
            trace,
            finish,
        })
    }

    /// The envelope's `principal`, or its record's header; both, only when they are the same.
    fn principal(&mut self, header: Option<&str>) -> Result<Option<Cow<'a, str>>, String> {
        let field = self.id(Field::Principal)?;
        let Some(header) = header else {
            return Ok(field);
        };
        if header.len() > self.max_id_bytes {
            return Err(format!(
                "header 'principal' is longer than {} bytes",
                self.max_id_bytes
            ));
        }
        match field {
            Some(field) if field != header => Err(
                "the envelope's 'principal' differs from the record's 'principal' header"
                    .to_owned(),
            ),
            _ => Ok(Some(Cow::Owned(header.to_owned()))),
        }
    }

    fn trace(&mut self, traceparent: Option<&str>) -> Result<Option<Box<Trace>>, String> {
        const FIELDS: [Field; 4] = [Field::Attempt, Field::TraceId, Field::RunId, Field::StepId];
        if traceparent.is_none() && FIELDS.iter().all(|f| self.values[*f as usize].is_none()) {
            return Ok(None); // most records carry none of them
        }
        let attempt = match self.take(Field::Attempt) {
            Value::Null => None,
            Value::Int(a) if (1..=i64::from(u32::MAX)).contains(&a) => Some(a as u32),
            _ => return Err("envelope field 'attempt' must be an integer >= 1".to_owned()),
        };
        let trace = Trace {
            trace_id: self.id(Field::TraceId)?.map(Into::into),
            run_id: self.id(Field::RunId)?.map(Into::into),
            step_id: self.id(Field::StepId)?.map(Into::into),
            traceparent: traceparent.map(Into::into),
            attempt,
        };
        Ok((!trace.is_empty()).then(|| Box::new(trace)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(text: &str) -> CallPiece<'_> {
        match decode(text.as_bytes(), RecordHeaders::default(), 64) {
            Ok(Piece::Call(piece)) => piece,
            other => panic!("not a call piece: {other:?}"),
        }
    }

    fn malformed(text: &str) -> Malformed {
        decode(text.as_bytes(), RecordHeaders::default(), 64).expect_err("must be malformed")
    }

    #[test]
    fn a_middle_chunk() {
        let piece = call(
            r#"{"stream_id":"s","call_id":"c","seq":2,"kind":"tool_call","delta":"x","final":false}"#,
        );
        assert_eq!(
            (&*piece.stream_id, &*piece.call_id, piece.seq),
            ("s", "c", Some(2))
        );
        assert_eq!(piece.delta, "x");
        assert!(!piece.is_final && piece.trace.is_none());
    }

    #[test]
    fn a_record_that_cannot_be_read_names_the_stream_and_call_it_can_read() {
        let bad = malformed(
            r#"{"stream_id":"s","call_id":"c","kind":"tool_call","delta":"a","delta":"b"}"#,
        );
        assert_eq!(bad.message, "envelope has the field \"delta\" twice");
        assert_eq!(
            (bad.stream_id.as_deref(), bad.call_id.as_deref()),
            (Some("s"), Some("c"))
        );
        // read as far as the text goes; an id given twice alike is still one id
        let bad = malformed(r#"{"call_id":"c","stream_id":"s","stream_id":"s","delta":"x"#);
        assert_eq!(
            (bad.stream_id.as_deref(), bad.call_id.as_deref()),
            (Some("s"), Some("c"))
        );
        // ids that disagree, or are not ids, name nothing
        let long = format!(
            r#"{{"x":{{"a":1,"a":2}},"stream_id":"{}"}}"#,
            "s".repeat(65)
        );
        for text in [
            &br#"{"stream_id":"s","stream_id":"t","call_id":"c","call_id":1}"#[..],
            br#"{"stream_id":"","call_id":["c"],"x":{"a":1,"a":2}}"#,
            long.as_bytes(),
            br#"["s"]"#,
            b"{\"stream_id\":\"\xff\"}",
        ] {
            let bad = decode(text, RecordHeaders::default(), 64).expect_err("malformed");
            assert_eq!((bad.stream_id, bad.call_id), (None, None), "{text:?}");
        }
        // a bad header too
        let bad = decode(
            br#"{"stream_id":"s","call_id":"c","kind":"tool_call"}"#,
            RecordHeaders {
                traceparent: Some(&"0".repeat(65)),
                ..RecordHeaders::default()
            },
            64,
        )
        .expect_err("traceparent too long");
        assert_eq!(
            (bad.stream_id.as_deref(), bad.call_id.as_deref()),
            (Some("s"), Some("c"))
        );
    }

    #[test]
    fn every_known_field_is_checked_on_every_kind() {
        let end = r#"{"stream_id":"s","kind":"end","finish_reason":"stop""#;
        for field in [
            r#""seq":1e400"#,
            r#""seq":-1"#,
            r#""final":"yes""#,
            r#""delta":7"#,
            r#""call_id":["x"]"#,
            r#""tool":false"#,
            r#""tool_version":1.5"#,
            r#""idempotency_key":{}"#,
            r#""attempt":0"#,
            r#""trace_id":1"#,
            r#""principal":5"#,
        ] {
            let bad = malformed(&format!("{end},{field}}}"));
            assert_eq!(bad.stream_id.as_deref(), Some("s"), "{field}");
            let bad = malformed(&format!(
                r#"{{"stream_id":"s","call_id":"c","kind":"tool_call",{field}}}"#
            ));
            assert_eq!(bad.stream_id.as_deref(), Some("s"), "{field}");
        }
        let bad =
            malformed(r#"{"stream_id":"s","call_id":"c","kind":"text","finish_reason":1e400}"#);
        assert_eq!(bad.call_id.as_deref(), Some("c"));
        // each of its type: taken
        decode(
            br#"{"stream_id":"s","kind":"end","seq":3,"final":true,"delta":"","call_id":"c","tool":"t","tool_version":2}"#,
            RecordHeaders::default(),
            64,
        )
        .expect("an end whose fields are each of their type");
    }

    #[test]
    fn a_bad_kind_names_the_call() {
        let bad = malformed(r#"{"stream_id":"s","call_id":"c","kind":"tool"}"#);
        assert_eq!(
            (bad.stream_id.as_deref(), bad.call_id.as_deref()),
            (Some("s"), Some("c"))
        );
    }

    #[test]
    fn a_bad_field_names_the_stream_and_call_it_belongs_to() {
        let bad = malformed(r#"{"stream_id":"s","call_id":"c","kind":"tool_call","delta":{}}"#);
        assert_eq!(bad.message, "envelope field 'delta' must be a string");
        assert_eq!(
            (bad.stream_id.as_deref(), bad.call_id.as_deref()),
            (Some("s"), Some("c"))
        );
    }

    #[test]
    fn identifiers_are_bounded() {
        let long = "x".repeat(65);
        let bad = malformed(&format!(
            r#"{{"stream_id":"s","call_id":"{long}","kind":"tool_call"}}"#
        ));
        assert_eq!(
            bad.message,
            "envelope field \"call_id\" is longer than 64 bytes"
        );
        assert_eq!(bad.stream_id.as_deref(), Some("s"));
    }

    #[test]
    fn an_integer_version_is_its_decimal_text() {
        let piece = call(
            r#"{"stream_id":"s","call_id":"c","kind":"tool_call","tool":"t","tool_version":2}"#,
        );
        assert_eq!(piece.tool_version.as_deref(), Some("2"));
    }

    #[test]
    fn a_principal_from_the_envelope_or_the_header_never_two() {
        let text = r#"{"stream_id":"s","call_id":"c","kind":"tool_call","principal":"alice"}"#;
        assert_eq!(call(text).principal.as_deref(), Some("alice"));
        let header = |value| RecordHeaders {
            principal: Some(value),
            ..RecordHeaders::default()
        };
        let bare = br#"{"stream_id":"s","call_id":"c","kind":"tool_call"}"#;
        match decode(bare, header("bob"), 64) {
            Ok(Piece::Call(piece)) => assert_eq!(piece.principal.as_deref(), Some("bob")),
            other => panic!("not a call piece: {other:?}"),
        }
        match decode(text.as_bytes(), header("alice"), 64) {
            Ok(Piece::Call(piece)) => assert_eq!(piece.principal.as_deref(), Some("alice")),
            other => panic!("not a call piece: {other:?}"),
        }
        let two = decode(text.as_bytes(), header("bob"), 64).expect_err("two principals");
        assert!(two.message.contains("differs"), "{}", two.message);
        assert_eq!(two.call_id.as_deref(), Some("c"));
        let long = "p".repeat(65);
        let over = decode(bare, header(&long), 64).expect_err("too long");
        assert_eq!(over.message, "header 'principal' is longer than 64 bytes");
        let field =
            format!(r#"{{"stream_id":"s","call_id":"c","kind":"tool_call","principal":"{long}"}}"#);
        assert!(malformed(&field)
            .message
            .contains("\"principal\" is longer than 64"));
        assert!(
            malformed(r#"{"stream_id":"s","call_id":"c","kind":"tool_call","principal":1}"#)
                .message
                .contains("must be a string or null")
        );
    }

    #[test]
    fn an_end_with_a_finish_reason() {
        let piece = decode(
            br#"{"stream_id":"s","kind":"end","finish_reason":"length"}"#,
            RecordHeaders::default(),
            64,
        );
        assert!(matches!(
            piece,
            Ok(Piece::End {
                finish: Some(Finish::Length),
                ..
            })
        ));
    }

    #[test]
    fn unknown_fields_pass_but_must_be_strict() {
        call(r#"{"stream_id":"s","call_id":"c","kind":"tool_call","x-mine":{"a":[1,2]}}"#);
        let bad =
            malformed(r#"{"stream_id":"s","call_id":"c","kind":"tool_call","x":{"a":1,"a":2}}"#);
        assert!(
            bad.message.starts_with("an unknown envelope field: ")
                && !bad.message.contains("\"x\""),
            "{}",
            bad.message
        );
    }

    #[test]
    fn a_duplicate_key_nested_in_an_unknown_field_is_malformed() {
        let bad = malformed(
            r#"{"stream_id":"s","call_id":"c","kind":"tool_call","x-meta":{"a":[1,{"b":{},"b":[]}]}}"#,
        );
        assert_eq!(
            bad.message,
            "an unknown envelope field: an object has the same key twice (line 1, column 76)"
        );
        // equal once unescaped, and only in one object: sibling objects may share keys
        let bad = malformed(
            r#"{"stream_id":"s","call_id":"c","kind":"tool_call","x":[{"k":1},{"k":2,"\u006b":3}]}"#,
        );
        assert!(bad.message.contains("same key twice"), "{}", bad.message);
        call(r#"{"stream_id":"s","call_id":"c","kind":"tool_call","x":[{"k":1},{"k":{"k":2}}]}"#);
    }

    #[test]
    fn an_unknown_field_is_held_to_the_strict_json_rules() {
        for (value, what) in [
            ("\"\\udc00\"", "lone UTF-16 surrogate"),
            ("[18446744073709551616]", "neither a 64-bit integer"),
            ("{\"n\":1e400}", "neither a 64-bit integer"),
            ("[NaN]", "NaN and Infinity"),
        ] {
            let bad = malformed(&format!(
                r#"{{"stream_id":"s","call_id":"c","kind":"tool_call","x":{value}}}"#
            ));
            assert!(bad.message.contains(what), "{value}: {}", bad.message);
        }
        let mut text = br#"{"stream_id":"s","call_id":"c","kind":"tool_call","x":"#.to_vec();
        text.extend_from_slice(b"[\"\xff\"]}");
        let bad = decode(&text, RecordHeaders::default(), 64).expect_err("not UTF-8");
        assert!(bad.message.contains("not valid UTF-8"), "{}", bad.message);
        let deep = format!("{}{}", "[".repeat(254), "]".repeat(254));
        let bad = malformed(&format!(
            r#"{{"stream_id":"s","call_id":"c","kind":"tool_call","x":{deep}}}"#
        ));
        assert!(bad.message.contains("deeper than 253"), "{}", bad.message);
        // the record nests json::MAX_DEPTH levels: read
        let deep = format!("{}{}", "[".repeat(253), "]".repeat(253));
        call(&format!(
            r#"{{"stream_id":"s","call_id":"c","kind":"tool_call","x":{deep}}}"#
        ));
    }

    #[test]
    fn not_an_object() {
        assert_eq!(malformed("[1]").message, "envelope must be a JSON object");
        assert!(malformed("{").message.starts_with("record is not JSON"));
        assert!(malformed(r#"{"a":1} x"#)
            .message
            .starts_with("record is not JSON"));
    }
}
