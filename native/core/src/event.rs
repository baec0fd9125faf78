//! The outcome event: the one JSON object emitted per call, written here and nowhere else.
//!
//! ```json
//! {"event_id": "…", "outcome": "rejected", "stream_id": "resp_1", "call_id": "call_1",
//!  "tool": "get_weather", "schema": {"id": "weather.get_weather", "version": "1"},
//!  "phase": "schema_validation", "error_code": "schema_violation", "reason": null,
//!  "violations": [{"path": "/units", "keyword": "required", "message": "…"}],
//!  "retry_feedback": {…}, "repairs": [{"kind": "markdown_fence"}], "retryable": true,
//!  "idempotency_key": null, "duplicate_of": null,
//!  "source": {"topic": "model-output", "partition": 2, "first_offset": 40, "last_offset": 43},
//!  "metrics": {"chunks": 4, "bytes": 17, "duplicate_chunks": 0, "phases_us": {"assembly": 3}},
//!  "arguments": {…}, "requires_approval": false, "call_kind": "custom_tool_call",
//!  "caller": {"type": "program", …}, "principal": "…", "trace_id": "…", …}
//! ```
//!
//! `arguments` and `requires_approval` only on accepted events; `arguments` is embedded as the
//! JSON text it was validated as (or re-encoded by a version adapter) without its insignificant
//! whitespace: its strings and number texts as they came, never re-serialized here, and the event
//! one line.
//! `call_kind` only for a call that is not a plain function call, `caller` (embedded as the
//! adapter gave it, a JSON object) only for a call the model did not make itself, `principal`
//! and the trace fields only when set, `early` (true) and `early_offset` (the record whose chunk
//! decided) only on a call rejected before its stream ended. [`encode`] returns None when the
//! event would exceed the byte
//! bound it is given: the caller decides what to send instead.
//!
//! [`encode`] writes it from plain borrowed fields ([`Call`], [`Verdict`]); the Python face reads
//! them out of its objects. The event id of a call is made here too ([`call_event_id`]).

use blake2::{Blake2b128, Digest};

use crate::origin::CallKind;

/// Appends JSON to a byte buffer.
struct Writer {
    out: Vec<u8>,
}

impl Writer {
    fn raw(&mut self, bytes: &[u8]) {
        self.out.extend_from_slice(bytes);
    }

    fn string(&mut self, text: &str) {
        self.out.push(b'"');
        let bytes = text.as_bytes();
        // bytes[start..i] need no escape and are copied as one run
        let (mut start, mut i) = (0, 0);
        while i < bytes.len() {
            if let Some(word) = bytes.get(i..i + 8) {
                if !any_escape(u64::from_le_bytes(word.try_into().expect("8 bytes"))) {
                    i += 8;
                    continue;
                }
            }
            let byte = bytes[i];
            let control;
            let escape: &[u8] = match byte {
                b'"' => b"\\\"",
                b'\\' => b"\\\\",
                b'\n' => b"\\n",
                b'\r' => b"\\r",
                b'\t' => b"\\t",
                0x08 => b"\\b",
                0x0c => b"\\f",
                0x00..=0x1f => {
                    let [high, low] = hex_digits(byte);
                    control = [b'\\', b'u', b'0', b'0', high, low];
                    &control
                }
                _ => {
                    i += 1;
                    continue;
                }
            };
            self.out.extend_from_slice(&bytes[start..i]);
            self.out.extend_from_slice(escape);
            i += 1;
            start = i;
        }
        self.out.extend_from_slice(&bytes[start..]);
        self.out.push(b'"');
    }

    /// A member's name, from this file: a plain identifier, written without escaping.
    fn key(&mut self, name: &str, first: bool) {
        debug_assert!(name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'));
        if !first {
            self.out.push(b',');
        }
        self.out.push(b'"');
        self.out.extend_from_slice(name.as_bytes());
        self.out.extend_from_slice(b"\":");
    }

    fn opt_string(&mut self, value: Option<&str>) {
        match value {
            Some(text) => self.string(text),
            None => self.raw(b"null"),
        }
    }

    /// A decimal integer (`write!` goes through the formatting machinery: 10x the work).
    fn int(&mut self, value: i64) {
        let mut digits = [0u8; 20];
        let mut start = digits.len();
        let mut rest = value.unsigned_abs();
        loop {
            start -= 1;
            digits[start] = b'0' + (rest % 10) as u8;
            rest /= 10;
            if rest == 0 {
                break;
            }
        }
        if value < 0 {
            self.out.push(b'-');
        }
        self.out.extend_from_slice(&digits[start..]);
    }

    fn boolean(&mut self, value: bool) {
        self.raw(if value { b"true" } else { b"false" });
    }

    /// Already-encoded JSON, or null.
    fn raw_or_null(&mut self, json: Option<&[u8]>) {
        self.raw(json.unwrap_or(b"null"));
    }

    /// A JSON text without its insignificant whitespace: strings (their escapes too) and
    /// number texts are copied as they are, so the value is the one that was judged, and the
    /// event stays one line whatever layout the model streamed.
    fn compact_or_null(&mut self, json: Option<&[u8]>) {
        let Some(json) = json else {
            return self.raw(b"null");
        };
        let (mut in_string, mut escaped) = (false, false);
        // json[start..i] is copied as one run
        let mut start = 0;
        for (i, &byte) in json.iter().enumerate() {
            if in_string {
                if escaped {
                    escaped = false;
                } else if byte == b'\\' {
                    escaped = true;
                } else if byte == b'"' {
                    in_string = false;
                }
            } else if byte == b'"' {
                in_string = true;
            } else if matches!(byte, b' ' | b'\t' | b'\n' | b'\r') {
                self.raw(&json[start..i]);
                start = i + 1;
            }
        }
        self.raw(&json[start..]);
    }
}

/// Whether one of 8 bytes needs an escape in a JSON string (below 0x20, '"' or '\\'): the
/// bit tricks for "a byte below n" and "a zero byte", on the 8 bytes at once.
fn any_escape(word: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let below = |x: u64, n: u8| x.wrapping_sub(ONES * u64::from(n)) & !x & HIGH;
    let zero = |x: u64| below(x, 1);
    below(word, 0x20)
        | zero(word ^ (ONES * u64::from(b'"')))
        | zero(word ^ (ONES * u64::from(b'\\')))
        != 0
}

/// A byte's two lowercase hex digits.
fn hex_digits(byte: u8) -> [u8; 2] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    [
        DIGITS[usize::from(byte >> 4)],
        DIGITS[usize::from(byte & 0x0f)],
    ]
}

/// The call an event is about, as the reassembler closed it (or as made by hand).
#[derive(Clone, Copy, Debug)]
pub struct Call<'a> {
    pub event_id: &'a str,
    pub stream_id: &'a str,
    pub call_id: &'a str,
    pub tool: Option<&'a str>,
    /// The call's text as received (only its length is read: the buffer is sized for it).
    pub arguments: &'a [u8],
    pub topic: &'a str,
    pub partition: i32,
    pub first_offset: i64,
    pub last_offset: i64,
    pub chunks: u32,
    pub nbytes: u64,
    pub duplicate_chunks: u32,
    pub trace_id: Option<&'a str>,
    pub run_id: Option<&'a str>,
    pub step_id: Option<&'a str>,
    pub traceparent: Option<&'a str>,
    pub attempt: Option<u32>,
    pub call_kind: CallKind,
    /// JSON text of an object.
    pub caller: Option<&'a str>,
    /// Who the call is made for, as its records named it.
    pub principal: Option<&'a str>,
    /// The offset of the record whose chunk decided an early verdict.
    pub early_offset: Option<i64>,
}

/// The schema a call was judged against.
#[derive(Clone, Copy, Debug)]
pub struct Schema<'a> {
    pub id: Option<&'a str>,
    pub version: Option<&'a str>,
}

/// One violation of the schema.
#[derive(Clone, Copy, Debug)]
pub struct Violation<'a> {
    pub path: Option<&'a str>,
    pub keyword: Option<&'a str>,
    pub message: Option<&'a str>,
}

/// The chain's decision for one call, as the event states it. `feedback_json` and
/// `arguments_json` are JSON texts embedded as they are; `arguments_json` and
/// `requires_approval` are written on accepted events only.
#[derive(Clone, Copy, Debug)]
pub struct Verdict<'a> {
    pub outcome: &'a str,
    pub phase: Option<&'a str>,
    pub code: Option<&'a str>,
    pub reason: Option<&'a str>,
    pub schema: Option<Schema<'a>>,
    pub violations: &'a [Violation<'a>],
    pub feedback_json: Option<&'a [u8]>,
    /// Each repair's kind.
    pub repairs: &'a [Option<&'a str>],
    pub retryable: bool,
    pub idempotency_key: Option<&'a str>,
    pub duplicate_of: Option<&'a str>,
    /// Microseconds per phase, in the order they ran.
    pub phases_us: &'a [(&'a str, i64)],
    pub arguments_json: Option<&'a [u8]>,
    pub requires_approval: bool,
}

/// The event of `call` judged as `verdict`, or None when it would be longer than `max_bytes`.
pub fn encode(call: &Call<'_>, verdict: &Verdict<'_>, max_bytes: usize) -> Option<Vec<u8>> {
    let mut w = Writer {
        // an accepted event of a small call is about 800 bytes: one allocation, never grown
        out: Vec::with_capacity(1024 + call.arguments.len()),
    };
    w.raw(b"{");
    w.key("event_id", true);
    w.string(call.event_id);
    w.key("outcome", false);
    w.string(verdict.outcome);
    w.key("stream_id", false);
    w.string(call.stream_id);
    w.key("call_id", false);
    w.string(call.call_id);
    w.key("tool", false);
    w.opt_string(call.tool);
    w.key("schema", false);
    match &verdict.schema {
        None => w.raw(b"null"),
        Some(schema) => {
            w.raw(b"{");
            w.key("id", true);
            w.opt_string(schema.id);
            w.key("version", false);
            w.opt_string(schema.version);
            w.raw(b"}");
        }
    }
    w.key("phase", false);
    w.opt_string(verdict.phase);
    w.key("error_code", false);
    w.opt_string(verdict.code);
    w.key("reason", false);
    w.opt_string(verdict.reason);
    w.key("violations", false);
    w.raw(b"[");
    for (index, violation) in verdict.violations.iter().enumerate() {
        if index > 0 {
            w.raw(b",");
        }
        w.raw(b"{");
        w.key("path", true);
        w.opt_string(violation.path);
        w.key("keyword", false);
        w.opt_string(violation.keyword);
        w.key("message", false);
        w.opt_string(violation.message);
        w.raw(b"}");
    }
    w.raw(b"]");
    w.key("retry_feedback", false);
    w.raw_or_null(verdict.feedback_json);
    w.key("repairs", false);
    w.raw(b"[");
    for (index, kind) in verdict.repairs.iter().enumerate() {
        if index > 0 {
            w.raw(b",");
        }
        w.raw(b"{");
        w.key("kind", true);
        w.opt_string(*kind);
        w.raw(b"}");
    }
    w.raw(b"]");
    w.key("retryable", false);
    w.boolean(verdict.retryable);
    w.key("idempotency_key", false);
    w.opt_string(verdict.idempotency_key);
    w.key("duplicate_of", false);
    w.opt_string(verdict.duplicate_of);
    w.key("source", false);
    w.raw(b"{");
    w.key("topic", true);
    w.string(call.topic);
    w.key("partition", false);
    w.int(i64::from(call.partition));
    w.key("first_offset", false);
    w.int(call.first_offset);
    w.key("last_offset", false);
    w.int(call.last_offset);
    w.raw(b"}");
    w.key("metrics", false);
    w.raw(b"{");
    w.key("chunks", true);
    w.int(i64::from(call.chunks));
    w.key("bytes", false);
    w.int(call.nbytes as i64);
    w.key("duplicate_chunks", false);
    w.int(i64::from(call.duplicate_chunks));
    w.key("phases_us", false);
    w.raw(b"{");
    for (index, (phase, micros)) in verdict.phases_us.iter().enumerate() {
        if index > 0 {
            w.raw(b",");
        }
        w.string(phase);
        w.raw(b":");
        w.int(*micros);
    }
    w.raw(b"}}");
    if verdict.outcome == "accepted" {
        w.key("arguments", false);
        w.compact_or_null(verdict.arguments_json);
        w.key("requires_approval", false);
        w.boolean(verdict.requires_approval);
    }
    if call.call_kind != CallKind::Function {
        w.key("call_kind", false);
        w.string(call.call_kind.as_str());
    }
    if let Some(caller) = call.caller {
        w.key("caller", false);
        w.raw(caller.as_bytes());
    }
    if let Some(offset) = call.early_offset {
        w.key("early", false);
        w.boolean(true);
        w.key("early_offset", false);
        w.int(offset);
    }
    let trace = [
        ("principal", call.principal),
        ("trace_id", call.trace_id),
        ("run_id", call.run_id),
        ("step_id", call.step_id),
        ("traceparent", call.traceparent),
    ];
    for (name, value) in trace {
        if let Some(value) = value {
            w.key(name, false);
            w.string(value);
        }
    }
    if let Some(attempt) = call.attempt {
        w.key("attempt", false);
        w.int(i64::from(attempt));
    }
    w.raw(b"}");
    (w.out.len() <= max_bytes).then_some(w.out)
}

/// An event id: 128 bits of BLAKE2b over the parts, each ended by a NUL, as 32 hex digits.
fn event_id(parts: &[&[u8]]) -> String {
    let mut hasher = Blake2b128::new();
    for part in parts {
        hasher.update(part);
        hasher.update([0u8]);
    }
    let mut hex = Vec::with_capacity(32);
    for byte in hasher.finalize() {
        hex.extend_from_slice(&hex_digits(byte));
    }
    String::from_utf8(hex).expect("hex digits are ASCII")
}

/// The event id of a call: its partition, where it began, its stream and call id.
pub fn call_event_id(
    topic: &str,
    partition: i32,
    first_offset: i64,
    stream: &str,
    call: &str,
) -> String {
    event_id(&[
        topic.as_bytes(),
        partition.to_string().as_bytes(),
        first_offset.to_string().as_bytes(),
        stream.as_bytes(),
        call.as_bytes(),
    ])
}

/// The event id of the `nth` call (from 0) a record that could not be read, or not all of it,
/// made of its own (a rejection at the record): where it is, and which of its rejections.
///
/// One record can make several (a Gemini record whose candidates each end malformed, a record
/// whose chunks name two calls each malformed): each names one event. The first keeps the id
/// the record always had; a later one's tag holds a byte no UTF-8 text holds, so its id is never
/// the id of a call (whose parts are all text) nor of another record's rejection.
pub fn record_event_id(topic: &str, partition: i32, offset: i64, nth: u32) -> String {
    let (partition, offset) = (partition.to_string(), offset.to_string());
    let place = [topic.as_bytes(), partition.as_bytes(), offset.as_bytes()];
    if nth == 0 {
        return event_id(&[place[0], place[1], place[2], b"record"]);
    }
    let nth = nth.to_string();
    event_id(&[place[0], place[1], place[2], b"record\xff", nth.as_bytes()])
}

/// A written event's top-level member: its name, where its text starts (its name's opening quote)
/// and where it ends (just past its value), as byte offsets into the event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub name: String,
    pub start: usize,
    pub end: usize,
}

/// Why [`members`] refused a text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MembersError {
    /// Not UTF-8, not JSON, not an object, or followed by more than whitespace.
    NotAnObject(String),
    /// A name written twice (the gate never writes one).
    Duplicate(String),
}

impl std::fmt::Display for MembersError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MembersError::NotAnObject(why) => write!(f, "an event is one JSON object: {why}"),
            MembersError::Duplicate(name) => write!(f, "an event names {name:?} twice"),
        }
    }
}

/// The members of `event`, one JSON object, in order: the spans a later event is derived from,
/// each member's text kept byte for byte. Values are skipped by jiter, never built, so a number
/// no double or 64-bit integer holds is kept as it is written.
pub fn members(event: &[u8]) -> Result<Vec<Member>, MembersError> {
    let not_json = |error: jiter::JiterError| MembersError::NotAnObject(error.to_string());
    std::str::from_utf8(event).map_err(|error| MembersError::NotAnObject(error.to_string()))?;
    let mut jiter = jiter::Jiter::new(event);
    if jiter.peek().map_err(not_json)? != jiter::Peek::Object {
        return Err(MembersError::NotAnObject("not an object".to_owned()));
    }
    let mut found: Vec<Member> = Vec::new();
    let mut seen = hashbrown::HashSet::new();
    // jiter stands on the `{` or just past the previous value: only whitespace and one `{` or `,`
    // come before the name's quote, so the first quote from here is where the member starts
    let mut from = jiter.current_index();
    let mut name = jiter.known_object().map_err(not_json)?.map(str::to_owned);
    while let Some(key) = name {
        let start = from
            + event[from..]
                .iter()
                .position(|&byte| byte == b'"')
                .expect("jiter read a name from here");
        jiter.next_skip().map_err(not_json)?;
        let end = jiter.current_index();
        if !seen.insert(key.clone()) {
            return Err(MembersError::Duplicate(key));
        }
        found.push(Member {
            name: key,
            start,
            end,
        });
        from = end;
        name = jiter.next_key().map_err(not_json)?.map(str::to_owned);
    }
    jiter.finish().map_err(not_json)?;
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spans(event: &str) -> Vec<(String, &str)> {
        members(event.as_bytes())
            .expect("an object")
            .into_iter()
            .map(|m| (m.name, &event[m.start..m.end]))
            .collect()
    }

    fn owned<'a>(pairs: &[(&str, &'a str)]) -> Vec<(String, &'a str)> {
        pairs
            .iter()
            .map(|&(name, text)| (name.to_owned(), text))
            .collect()
    }

    #[test]
    fn members_are_cut_at_their_names_and_values() {
        let event = r#"{"a":1,"b":"x","c":{"d":[1,{"e":null}]},"f":[],"g":true}"#;
        assert_eq!(
            spans(event),
            owned(&[
                ("a", r#""a":1"#),
                ("b", r#""b":"x""#),
                ("c", r#""c":{"d":[1,{"e":null}]}"#),
                ("f", r#""f":[]"#),
                ("g", r#""g":true"#),
            ])
        );
        assert_eq!(spans("{}"), vec![]);
        assert_eq!(spans(" \n{ } \t"), vec![]);
    }

    #[test]
    fn members_keep_escapes_and_whitespace_inside_and_leave_it_outside() {
        let event = " {\n \"a\\\"b\" : \"x\\\"}\\u00e9,\" , \"\\u00e9\":[ 1 , {\"k\" : \"}\"} ] \r\n, \"z\":false } ";
        assert_eq!(
            spans(event),
            owned(&[
                ("a\"b", "\"a\\\"b\" : \"x\\\"}\\u00e9,\""),
                ("\u{e9}", "\"\\u00e9\":[ 1 , {\"k\" : \"}\"} ]"),
                ("z", "\"z\":false"),
            ])
        );
    }

    #[test]
    fn members_keep_numbers_as_written_even_past_64_bits() {
        let event = r#"{"a":1e15,"b":-0,"c":1E+2,"d":1180591620717411303424,"e":[-123456789012345678901234567890.5e-3],"f":0.1}"#;
        assert_eq!(
            spans(event),
            owned(&[
                ("a", r#""a":1e15"#),
                ("b", r#""b":-0"#),
                ("c", r#""c":1E+2"#),
                ("d", r#""d":1180591620717411303424"#),
                ("e", r#""e":[-123456789012345678901234567890.5e-3]"#),
                ("f", r#""f":0.1"#),
            ])
        );
    }

    #[test]
    fn members_refuse_what_is_not_one_object_or_names_a_member_twice() {
        for text in [
            "",
            "[]",
            "1",
            "\"a\"",
            "{",
            "{\"a\":1",
            "{\"a\":1,}",
            "{\"a\"}",
            "{\"a\":1} x",
            "{\"a\":1}{}",
            "{\"a\":[1,}",
            "{a:1}",
            "{\"a\":01}",
            "{\"a\":NaN}",
        ] {
            assert!(
                matches!(members(text.as_bytes()), Err(MembersError::NotAnObject(_))),
                "{text:?}"
            );
        }
        assert!(matches!(
            members(b"{\"a\":\"\xff\"}"),
            Err(MembersError::NotAnObject(_))
        ));
        assert_eq!(
            members(br#"{"a":1,"b":2,"\u0061":3}"#),
            Err(MembersError::Duplicate("a".to_owned()))
        );
        // a name a nested object repeats is the nested object's
        assert_eq!(spans(r#"{"a":{"a":1}}"#), owned(&[("a", r#""a":{"a":1}"#)]));
    }

    fn call() -> Call<'static> {
        Call {
            event_id: "e1",
            stream_id: "s",
            call_id: "c",
            tool: Some("get_weather"),
            arguments: b"{}",
            topic: "in",
            partition: 2,
            first_offset: 40,
            last_offset: 43,
            chunks: 4,
            nbytes: 2,
            duplicate_chunks: 1,
            trace_id: None,
            run_id: Some("r"),
            step_id: None,
            traceparent: None,
            attempt: Some(3),
            call_kind: CallKind::Function,
            caller: None,
            principal: None,
            early_offset: None,
        }
    }

    fn verdict(outcome: &'static str) -> Verdict<'static> {
        Verdict {
            outcome,
            phase: None,
            code: None,
            reason: None,
            schema: Some(Schema {
                id: Some("w.get"),
                version: None,
            }),
            violations: &[],
            feedback_json: None,
            repairs: &[Some("markdown_fence")],
            retryable: false,
            idempotency_key: None,
            duplicate_of: None,
            phases_us: &[("assembly", 3), ("parse", -1)],
            arguments_json: Some(b"{\"a\":1}"),
            requires_approval: true,
        }
    }

    #[test]
    fn an_accepted_event_has_every_field_in_order() {
        let event = encode(&call(), &verdict("accepted"), 4096).expect("within the bound");
        assert_eq!(
            String::from_utf8(event).expect("UTF-8"),
            concat!(
                r#"{"event_id":"e1","outcome":"accepted","stream_id":"s","call_id":"c","#,
                r#""tool":"get_weather","schema":{"id":"w.get","version":null},"phase":null,"#,
                r#""error_code":null,"reason":null,"violations":[],"retry_feedback":null,"#,
                r#""repairs":[{"kind":"markdown_fence"}],"retryable":false,"#,
                r#""idempotency_key":null,"duplicate_of":null,"#,
                r#""source":{"topic":"in","partition":2,"first_offset":40,"last_offset":43},"#,
                r#""metrics":{"chunks":4,"bytes":2,"duplicate_chunks":1,"#,
                r#""phases_us":{"assembly":3,"parse":-1}},"arguments":{"a":1},"#,
                r#""requires_approval":true,"run_id":"r","attempt":3}"#,
            )
        );
    }

    #[test]
    fn a_call_that_is_no_plain_function_call_names_its_kind_and_caller_on_every_outcome() {
        let custom = Call {
            call_kind: CallKind::Custom,
            caller: Some(r#"{"type":"program","caller_id":"p1"}"#),
            ..call()
        };
        for outcome in ["accepted", "rejected", "incomplete"] {
            let event = encode(&custom, &verdict(outcome), 4096).expect("fits");
            let event = String::from_utf8(event).expect("UTF-8");
            assert!(
                event.contains(
                    r#","call_kind":"custom_tool_call","caller":{"type":"program","caller_id":"p1"},"run_id":"r","#
                ),
                "{event}"
            );
        }
        let plain = encode(&call(), &verdict("accepted"), 4096).expect("fits");
        let plain = String::from_utf8(plain).expect("UTF-8");
        assert!(!plain.contains("call_kind") && !plain.contains("caller"));
    }

    #[test]
    fn a_call_made_for_a_principal_names_it_on_every_outcome() {
        let named = Call {
            principal: Some("team-a\"x"),
            ..call()
        };
        for outcome in ["accepted", "rejected", "incomplete"] {
            let event = encode(&named, &verdict(outcome), 4096).expect("fits");
            let event = String::from_utf8(event).expect("UTF-8");
            assert!(
                event.contains(r#","principal":"team-a\"x","run_id":"r","#),
                "{event}"
            );
        }
        let plain = encode(&call(), &verdict("accepted"), 4096).expect("fits");
        assert!(!String::from_utf8(plain)
            .expect("UTF-8")
            .contains("principal"));
    }

    #[test]
    fn arguments_are_embedded_without_insignificant_whitespace() {
        let pretty = b"{\n  \"a b\" : [ 1.50e+3 ,\t-0.0 ],\r\n  \"s\": \" x\\\" \\\\\" }\n";
        let verdict = Verdict {
            arguments_json: Some(pretty),
            ..verdict("accepted")
        };
        let event = String::from_utf8(encode(&call(), &verdict, 1 << 20).expect("fits")).unwrap();
        assert!(!event.contains('\n'), "{event}");
        assert!(
            event.contains(r#""arguments":{"a b":[1.50e+3,-0.0],"s":" x\" \\"},"#),
            "{event}"
        );
        // every value the parser reads back is the one that was judged
        let embedded = event.split(r#""arguments":"#).nth(1).unwrap();
        let embedded = &embedded[..embedded.find(r#","requires_approval""#).unwrap()];
        assert_eq!(
            crate::value::parse_value(embedded.as_bytes(), 8),
            crate::value::parse_value(pretty, 8)
        );
    }

    #[test]
    fn a_rejection_carries_its_violations_and_feedback_and_no_arguments() {
        let violations = [Violation {
            path: Some("/units"),
            keyword: Some("required"),
            message: None,
        }];
        let rejected = Verdict {
            phase: Some("schema_validation"),
            code: Some("schema_violation"),
            violations: &violations,
            feedback_json: Some(b"{\"f\":[]}"),
            retryable: true,
            ..verdict("rejected")
        };
        let event =
            String::from_utf8(encode(&call(), &rejected, 4096).expect("fits")).expect("UTF-8");
        assert!(event.contains(
            r#""violations":[{"path":"/units","keyword":"required","message":null}],"retry_feedback":{"f":[]},"#
        ));
        assert!(!event.contains("arguments") && !event.contains("requires_approval"));
    }

    #[test]
    fn an_event_past_the_bound_is_none_and_one_at_it_is_written() {
        let length = encode(&call(), &verdict("accepted"), usize::MAX)
            .expect("unbounded")
            .len();
        assert!(encode(&call(), &verdict("accepted"), length).is_some());
        assert!(encode(&call(), &verdict("accepted"), length - 1).is_none());
    }

    #[test]
    fn event_ids_are_32_hex_digits_that_tell_every_part_apart() {
        let id = call_event_id("t", 0, 5, "s", "c");
        assert_eq!(id.len(), 32);
        assert!(id
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert_eq!(id, call_event_id("t", 0, 5, "s", "c"));
        // the NUL after each part: moving a byte across a boundary changes the id
        assert_ne!(id, call_event_id("t", 0, 5, "sc", ""));
        assert_ne!(
            record_event_id("t", 0, 5, 0),
            call_event_id("t", 0, 5, "record", "")
        );
    }

    #[test]
    fn each_rejection_at_a_record_has_an_id_of_its_own() {
        let ids: Vec<String> = (0..4).map(|nth| record_event_id("t", 0, 5, nth)).collect();
        for (i, id) in ids.iter().enumerate() {
            assert_eq!(*id, record_event_id("t", 0, 5, i as u32));
            assert!(ids[..i].iter().all(|earlier| earlier != id));
            assert_ne!(*id, record_event_id("t", 0, 51, 0));
            assert_ne!(*id, call_event_id("t", 0, 5, "record", &i.to_string()));
        }
    }

    fn string(text: &str) -> String {
        let mut w = Writer { out: Vec::new() };
        w.string(text);
        String::from_utf8(w.out).expect("UTF-8 in, UTF-8 out")
    }

    #[test]
    fn strings_are_escaped_as_rfc_8259_asks() {
        assert_eq!(string("a\"b\\c"), r#""a\"b\\c""#);
        assert_eq!(string("\n\r\t\u{8}\u{c}"), r#""\n\r\t\b\f""#);
        assert_eq!(string("\u{0}\u{1f}"), r#""\u0000\u001f""#);
        assert_eq!(string("é€😀/"), "\"é€😀/\"");
    }

    #[test]
    fn escaped_strings_read_back_as_they_were() {
        for text in [
            "",
            "plain",
            "\u{0}\u{7f}\u{80}",
            "\"\\\"",
            "tab\tend\u{2028}",
        ] {
            let read: String = serde_json_free_parse(&string(text));
            assert_eq!(read, text);
        }
    }

    /// Reads back one JSON string with the crate's own strict parser.
    fn serde_json_free_parse(json: &str) -> String {
        let mut jiter = jiter::Jiter::new(json.as_bytes());
        jiter.next_str().expect("a JSON string").to_owned()
    }

    /// Every ASCII byte at every place before, in and after the 8-byte steps.
    #[test]
    fn every_ascii_byte_anywhere_reads_back() {
        for byte in 0u8..0x80 {
            for at in 0..19 {
                let mut text = b"abcdefghijklmnopqrs".to_vec();
                text[at] = byte;
                let text = String::from_utf8(text).expect("ASCII");
                let json = string(&text);
                assert!(json.bytes().all(|b| b >= 0x20), "{byte:#x} at {at}");
                assert_eq!(serde_json_free_parse(&json), text, "{byte:#x} at {at}");
            }
        }
    }
}
