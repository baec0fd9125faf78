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
//!  "arguments": {…}, "requires_approval": false, "trace_id": "…", …}
//! ```
//!
//! `arguments` and `requires_approval` only on accepted events; `arguments` is embedded as the
//! JSON text it was validated as (or re-encoded by a version adapter), never re-serialized here.
//! The trace fields only when set. `encode_event` returns None when the event would exceed the
//! byte bound it is given: the caller decides what to send instead.
//!
//! The `Verdict` it is written from is a native value too (`worker.model.Verdict`): made once
//! per call and read by field here, not attribute by attribute through the Python API.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString, PyTuple};

use crate::face::AssembledCall;

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

    fn opt_py_str(&mut self, py: Python<'_>, value: &Option<Py<PyString>>) -> PyResult<()> {
        match value {
            Some(text) => self.string(text.bind(py).to_str()?),
            None => self.raw(b"null"),
        }
        Ok(())
    }

    /// A Python value that is None or a str.
    fn py_str_or_null(&mut self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        if value.is_none() {
            self.raw(b"null");
        } else {
            self.string(value.cast::<PyString>()?.to_str()?);
        }
        Ok(())
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
pub(crate) fn hex_digits(byte: u8) -> [u8; 2] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    [
        DIGITS[usize::from(byte >> 4)],
        DIGITS[usize::from(byte & 0x0f)],
    ]
}

/// The chain's decision for one call. `phase`/`code` name the first phase that failed.
///
/// An accepted verdict carries `arguments_json`, the arguments as the JSON text the event
/// embeds (validated as is, or re-encoded by a version adapter); a rejection its retry feedback,
/// as `retry_feedback` (the fields) and `feedback_json` (their JSON text, which the event
/// embeds), both from the `feedback` it is made with. `idempotency_key` is the call's effective
/// key; an accepted verdict with `idempotency_digest` set is pending the decision of the key's
/// owner. `duplicate_of` names the event of the first acceptance of the key, on a `duplicate` or
/// `idempotency_conflict` rejection. The enum-valued fields (`outcome`, `phase`, `code`,
/// `reason`, `repairs`) hold the `worker.model` str enum members they were given.
#[pyclass(module = "worker._native", frozen, get_all)]
pub struct Verdict {
    outcome: Py<PyString>,
    phase: Option<Py<PyString>>,
    code: Option<Py<PyString>>,
    reason: Option<Py<PyString>>,
    schema: Option<Py<PyAny>>,
    arguments_json: Option<Py<PyBytes>>,
    violations: Py<PyAny>,
    repairs: Py<PyAny>,
    retryable: bool,
    retry_feedback: Option<Py<PyDict>>,
    feedback_json: Option<Py<PyBytes>>,
    requires_approval: bool,
    idempotency_key: Option<Py<PyString>>,
    idempotency_digest: Option<Py<PyBytes>>,
    duplicate_of: Option<Py<PyString>>,
    phases_us: Py<PyDict>,
}

#[pymethods]
impl Verdict {
    /// `feedback` is a `worker.model.Feedback` (its `fields` and their `json`).
    #[new]
    #[pyo3(signature = (
        outcome, *, phase=None, code=None, reason=None, schema=None, arguments_json=None,
        violations=None, repairs=None, retryable=false, feedback=None, requires_approval=false,
        idempotency_key=None, idempotency_digest=None, duplicate_of=None, phases_us=None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        outcome: Py<PyString>,
        phase: Option<Py<PyString>>,
        code: Option<Py<PyString>>,
        reason: Option<Py<PyString>>,
        schema: Option<Py<PyAny>>,
        arguments_json: Option<Py<PyBytes>>,
        violations: Option<Py<PyAny>>,
        repairs: Option<Py<PyAny>>,
        retryable: bool,
        feedback: Option<&Bound<'_, PyAny>>,
        requires_approval: bool,
        idempotency_key: Option<Py<PyString>>,
        idempotency_digest: Option<Py<PyBytes>>,
        duplicate_of: Option<Py<PyString>>,
        phases_us: Option<Py<PyDict>>,
    ) -> PyResult<Self> {
        let (retry_feedback, feedback_json) = match feedback {
            Some(feedback) => (
                Some(
                    feedback
                        .getattr(pyo3::intern!(py, "fields"))?
                        .cast_into::<PyDict>()?
                        .unbind(),
                ),
                Some(
                    feedback
                        .getattr(pyo3::intern!(py, "json"))?
                        .cast_into::<PyBytes>()?
                        .unbind(),
                ),
            ),
            None => (None, None),
        };
        let empty = || PyTuple::empty(py).into_any().unbind();
        Ok(Verdict {
            outcome,
            phase,
            code,
            reason,
            schema,
            arguments_json,
            violations: violations.unwrap_or_else(empty),
            repairs: repairs.unwrap_or_else(empty),
            retryable,
            retry_feedback,
            feedback_json,
            requires_approval,
            idempotency_key,
            idempotency_digest,
            duplicate_of,
            phases_us: phases_us.unwrap_or_else(|| PyDict::new(py).unbind()),
        })
    }

    /// The accepted arguments as a value (for tests and tools; the event embeds the text).
    #[getter]
    fn arguments<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        match &self.arguments_json {
            None => Ok(py.None().into_bound(py)),
            Some(text) => py
                .import(pyo3::intern!(py, "orjson"))?
                .call_method1(pyo3::intern!(py, "loads"), (text.bind(py),)),
        }
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let repr = |value: Option<&Bound<'_, PyAny>>| -> PyResult<String> {
            Ok(match value {
                Some(value) => value.repr()?.to_str()?.to_owned(),
                None => "None".to_owned(),
            })
        };
        let text = |value: &Option<Py<PyString>>| repr(value.as_ref().map(|v| v.bind(py).as_any()));
        Ok(format!(
            "Verdict(outcome={}, phase={}, code={}, reason={})",
            repr(Some(self.outcome.bind(py).as_any()))?,
            text(&self.phase)?,
            text(&self.code)?,
            text(&self.reason)?,
        ))
    }
}

/// The event of `call` judged as `verdict`, or None when it would be longer than `max_bytes`.
///
/// Of the verdict's Python values, `schema` is read by attribute (`id`, `version`), and so is
/// each violation (`path`, `keyword`, `message`); `repairs` holds str kinds.
#[pyfunction]
pub fn encode_event<'py>(
    py: Python<'py>,
    call: &Bound<'py, AssembledCall>,
    verdict: &Bound<'py, Verdict>,
    max_bytes: usize,
) -> PyResult<Option<Bound<'py, PyBytes>>> {
    let call = call.get();
    let verdict = verdict.get();
    let mut w = Writer {
        // an accepted event of a small call is about 800 bytes: one allocation, never grown
        out: Vec::with_capacity(1024 + call.arguments.bind(py).as_bytes().len()),
    };
    w.raw(b"{");
    w.key("event_id", true);
    w.string(call.event_id.bind(py).to_str()?);
    let outcome = verdict.outcome.bind(py).to_str()?;
    w.key("outcome", false);
    w.string(outcome);
    w.key("stream_id", false);
    w.string(call.stream_id.bind(py).to_str()?);
    w.key("call_id", false);
    w.string(call.call_id.bind(py).to_str()?);
    w.key("tool", false);
    w.opt_py_str(py, &call.tool)?;
    w.key("schema", false);
    match &verdict.schema {
        None => w.raw(b"null"),
        Some(schema) => {
            let schema = schema.bind(py);
            w.raw(b"{");
            w.key("id", true);
            w.py_str_or_null(&schema.getattr(pyo3::intern!(py, "id"))?)?;
            w.key("version", false);
            w.py_str_or_null(&schema.getattr(pyo3::intern!(py, "version"))?)?;
            w.raw(b"}");
        }
    }
    w.key("phase", false);
    w.opt_py_str(py, &verdict.phase)?;
    w.key("error_code", false);
    w.opt_py_str(py, &verdict.code)?;
    w.key("reason", false);
    w.opt_py_str(py, &verdict.reason)?;
    w.key("violations", false);
    w.raw(b"[");
    for (index, violation) in verdict.violations.bind(py).try_iter()?.enumerate() {
        let violation = violation?;
        if index > 0 {
            w.raw(b",");
        }
        w.raw(b"{");
        w.key("path", true);
        w.py_str_or_null(&violation.getattr(pyo3::intern!(py, "path"))?)?;
        w.key("keyword", false);
        w.py_str_or_null(&violation.getattr(pyo3::intern!(py, "keyword"))?)?;
        w.key("message", false);
        w.py_str_or_null(&violation.getattr(pyo3::intern!(py, "message"))?)?;
        w.raw(b"}");
    }
    w.raw(b"]");
    w.key("retry_feedback", false);
    raw_or_null(&mut w, &verdict.feedback_json, py);
    w.key("repairs", false);
    w.raw(b"[");
    for (index, kind) in verdict.repairs.bind(py).try_iter()?.enumerate() {
        if index > 0 {
            w.raw(b",");
        }
        w.raw(b"{");
        w.key("kind", true);
        w.py_str_or_null(&kind?)?;
        w.raw(b"}");
    }
    w.raw(b"]");
    w.key("retryable", false);
    w.boolean(verdict.retryable);
    w.key("idempotency_key", false);
    w.opt_py_str(py, &verdict.idempotency_key)?;
    w.key("duplicate_of", false);
    w.opt_py_str(py, &verdict.duplicate_of)?;
    w.key("source", false);
    w.raw(b"{");
    w.key("topic", true);
    w.string(call.topic.bind(py).to_str()?);
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
    for (index, (phase, micros)) in verdict.phases_us.bind(py).iter().enumerate() {
        if index > 0 {
            w.raw(b",");
        }
        w.string(phase.cast::<PyString>()?.to_str()?);
        w.raw(b":");
        w.int(micros.extract()?);
    }
    w.raw(b"}}");
    if outcome == "accepted" {
        w.key("arguments", false);
        raw_or_null(&mut w, &verdict.arguments_json, py);
        w.key("requires_approval", false);
        w.boolean(verdict.requires_approval);
    }
    let trace = [
        ("trace_id", &call.trace_id),
        ("run_id", &call.run_id),
        ("step_id", &call.step_id),
        ("traceparent", &call.traceparent),
    ];
    for (name, value) in trace {
        if let Some(value) = value {
            w.key(name, false);
            w.string(value.bind(py).to_str()?);
        }
    }
    if let Some(attempt) = call.attempt {
        w.key("attempt", false);
        w.int(i64::from(attempt));
    }
    w.raw(b"}");
    if w.out.len() > max_bytes {
        return Ok(None);
    }
    Ok(Some(PyBytes::new(py, &w.out)))
}

/// Already-encoded JSON (bytes), or null.
fn raw_or_null(w: &mut Writer, value: &Option<Py<PyBytes>>, py: Python<'_>) {
    match value {
        Some(json) => w.raw(json.bind(py).as_bytes()),
        None => w.raw(b"null"),
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Verdict>()?;
    m.add_function(wrap_pyfunction!(encode_event, m)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Writer;

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
