//! The reassembler's Python face: `Chunk` in, `AssembledCall` out, `Assembler` in between.
//!
//! `Assembler.feed_records` takes a fetched batch of one partition as it comes from the Kafka
//! client (objects with `offset`, `timestamp`, `key`, `value`, `headers`), decodes every
//! canonical envelope with the interpreter released, hands each vendor record (a
//! `content-format` header) to the Python adapter callback, and feeds everything, in offset
//! order, to the reassembler. A record it cannot read is a call of its own, rejected
//! `malformed_record`, and ends every call it could belong to (`stream_corrupt`).

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

use blake2::{Blake2b128, Digest};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString};

use crate::assembler::{
    Assembler as Core, CallPiece, Channel, Closed, Ending, Finish, Limits, Overflow, PartitionFeed,
    Piece, Scope, Trace,
};
use crate::envelope::{self, Malformed};
use crate::event::hex_digits;
use crate::snapshot;

const MALFORMED_RECORD: &str = "malformed_record";
const CONTENT_FORMAT: &str = "content-format";
const TRACEPARENT: &str = "traceparent";

/// One piece of model output for one stream, as an adapter makes it.
///
/// `kind` is a channel (`tool_call`, `text`, `refusal`, `error`, `mcp_result`), `end` (the
/// stream ended; `finish_reason` says how), `abort` (the adapter met an event it could not place:
/// the call `call_id` cannot be trusted) or `malformed` (the record is not what its format says:
/// `delta` says why, `error` names the code, `malformed_record` unless said otherwise).
/// `expected` on a final piece is the vendor's own final text of the whole call.
#[pyclass(module = "worker._native", frozen, get_all)]
#[derive(Clone)]
pub struct Chunk {
    stream_id: String,
    kind: String,
    call_id: Option<String>,
    seq: Option<u32>,
    tool: Option<String>,
    tool_version: Option<String>,
    delta: String,
    #[pyo3(name = "final")]
    is_final: bool,
    finish_reason: Option<String>,
    idempotency_key: Option<String>,
    trace_id: Option<String>,
    run_id: Option<String>,
    step_id: Option<String>,
    traceparent: Option<String>,
    attempt: Option<u32>,
    expected: Option<String>,
    error: Option<String>,
}

#[pymethods]
impl Chunk {
    #[new]
    #[pyo3(signature = (
        stream_id, kind, call_id=None, *, seq=None, tool=None, tool_version=None,
        delta=String::new(), r#final=false, finish_reason=None, idempotency_key=None,
        trace_id=None, run_id=None, step_id=None, traceparent=None, attempt=None,
        expected=None, error=None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        stream_id: String,
        kind: String,
        call_id: Option<String>,
        seq: Option<u32>,
        tool: Option<String>,
        tool_version: Option<String>,
        delta: String,
        r#final: bool,
        finish_reason: Option<String>,
        idempotency_key: Option<String>,
        trace_id: Option<String>,
        run_id: Option<String>,
        step_id: Option<String>,
        traceparent: Option<String>,
        attempt: Option<u32>,
        expected: Option<String>,
        error: Option<String>,
    ) -> PyResult<Self> {
        let known = matches!(kind.as_str(), "end" | "abort" | "malformed")
            || Channel::parse(&kind).is_some();
        if !known {
            return Err(PyValueError::new_err(format!(
                "unknown chunk kind {kind:?}"
            )));
        }
        if let Some(reason) = &finish_reason {
            if Finish::parse(reason).is_none() {
                return Err(PyValueError::new_err(format!(
                    "unknown finish reason {reason:?}"
                )));
            }
        }
        Ok(Chunk {
            stream_id,
            kind,
            call_id,
            seq,
            tool,
            tool_version,
            delta,
            is_final: r#final,
            finish_reason,
            idempotency_key,
            trace_id,
            run_id,
            step_id,
            traceparent,
            attempt,
            expected,
            error,
        })
    }

    fn __repr__(&self) -> String {
        format!(
            "Chunk(stream_id={:?}, kind={:?}, call_id={:?}, seq={:?}, tool={:?}, delta={:?}, final={})",
            self.stream_id, self.kind, self.call_id, self.seq, self.tool, self.delta, self.is_final
        )
    }
}

/// What a chunk is to the reassembler, once its identifiers passed their bound.
enum Fed<'a> {
    Piece(Piece<'a>),
    Malformed { code: String, detail: String },
}

impl Chunk {
    fn to_fed(&self, max_id_bytes: usize) -> Fed<'_> {
        let ids = [
            ("stream_id", Some(&self.stream_id)),
            ("call_id", self.call_id.as_ref()),
            ("tool", self.tool.as_ref()),
            ("tool_version", self.tool_version.as_ref()),
            ("idempotency_key", self.idempotency_key.as_ref()),
            ("trace_id", self.trace_id.as_ref()),
            ("run_id", self.run_id.as_ref()),
            ("step_id", self.step_id.as_ref()),
            ("traceparent", self.traceparent.as_ref()),
        ];
        for (name, value) in ids {
            if value.is_some_and(|v| v.len() > max_id_bytes) {
                return Fed::Malformed {
                    code: MALFORMED_RECORD.to_owned(),
                    detail: format!("{name} is longer than {max_id_bytes} bytes"),
                };
            }
        }
        let stream_id = Cow::Borrowed(self.stream_id.as_str());
        let call_id = || match &self.call_id {
            Some(id) => Cow::Borrowed(id.as_str()),
            None => Cow::Owned(format!("{}:{}", self.stream_id, self.kind)),
        };
        let piece = match self.kind.as_str() {
            "end" => Piece::End {
                stream_id,
                finish: self.finish_reason.as_deref().and_then(Finish::parse),
            },
            "abort" => Piece::Abort {
                stream_id,
                call_id: call_id(),
            },
            "malformed" => {
                return Fed::Malformed {
                    code: self
                        .error
                        .clone()
                        .unwrap_or_else(|| MALFORMED_RECORD.to_owned()),
                    detail: self.delta.clone(),
                }
            }
            kind => {
                let trace = Trace {
                    trace_id: self.trace_id.as_deref().map(Into::into),
                    run_id: self.run_id.as_deref().map(Into::into),
                    step_id: self.step_id.as_deref().map(Into::into),
                    traceparent: self.traceparent.as_deref().map(Into::into),
                    attempt: self.attempt,
                };
                Piece::Call(CallPiece {
                    stream_id,
                    call_id: call_id(),
                    channel: Channel::parse(kind).expect("checked at construction"),
                    seq: self.seq,
                    tool: self.tool.as_deref().map(Cow::Borrowed),
                    tool_version: self.tool_version.as_deref().map(Cow::Borrowed),
                    delta: Cow::Borrowed(&self.delta),
                    is_final: self.is_final,
                    idempotency_key: self.idempotency_key.as_deref().map(Cow::Borrowed),
                    trace: (!trace.is_empty()).then(|| Box::new(trace)),
                    expected: self.expected.as_deref().map(Cow::Borrowed),
                    // an adapter names the tool on a tool call's first piece only: what
                    // follows continues a call and never opens one
                    opens: self.tool.is_some() || kind != "tool_call",
                })
            }
        };
        Fed::Piece(piece)
    }
}

/// Everything the chain needs to judge one call, as the reassembler closed it.
///
/// `incomplete` (a reason) or `assembly_error` (a code: `too_large`, `too_many_chunks`,
/// `call_id_reused`, `malformed_record`, ...) set means the verdict's first failing phase is
/// already known. `arguments` holds the text only for a call that ended complete; `nbytes`
/// counts what was received either way. `event_id` names the call: its partition, where it
/// began, its stream and call id.
#[pyclass(module = "worker._native", frozen, get_all)]
pub struct AssembledCall {
    pub(crate) stream_id: Py<PyString>,
    pub(crate) call_id: Py<PyString>,
    pub(crate) tool: Option<Py<PyString>>,
    pub(crate) arguments: Py<PyBytes>,
    pub(crate) channel: Py<PyString>,
    pub(crate) tool_version: Option<Py<PyString>>,
    pub(crate) idempotency_key: Option<Py<PyString>>,
    pub(crate) trace_id: Option<Py<PyString>>,
    pub(crate) run_id: Option<Py<PyString>>,
    pub(crate) step_id: Option<Py<PyString>>,
    pub(crate) traceparent: Option<Py<PyString>>,
    pub(crate) attempt: Option<u32>,
    pub(crate) topic: Py<PyString>,
    pub(crate) partition: i32,
    pub(crate) first_offset: i64,
    pub(crate) last_offset: i64,
    pub(crate) chunks: u32,
    pub(crate) duplicate_chunks: u32,
    pub(crate) nbytes: u64,
    pub(crate) incomplete: Option<Py<PyString>>,
    pub(crate) assembly_error: Option<Py<PyString>>,
    pub(crate) assembly_detail: Option<Py<PyString>>,
    pub(crate) assembly_us: u64,
    pub(crate) event_id: Py<PyString>,
}

#[pymethods]
impl AssembledCall {
    /// A call made by hand (tests, the offline tools); the reassembler makes the others.
    #[new]
    #[pyo3(signature = (
        stream_id, call_id, tool=None, arguments=None, *, channel="tool_call", tool_version=None,
        idempotency_key=None, trace_id=None, run_id=None, step_id=None, traceparent=None,
        attempt=None, topic="", partition=0, first_offset=0, last_offset=None, chunks=1,
        duplicate_chunks=0, nbytes=None, incomplete=None, assembly_error=None,
        assembly_detail=None, assembly_us=0,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        stream_id: &str,
        call_id: &str,
        tool: Option<&str>,
        arguments: Option<&[u8]>,
        channel: &str,
        tool_version: Option<&str>,
        idempotency_key: Option<&str>,
        trace_id: Option<&str>,
        run_id: Option<&str>,
        step_id: Option<&str>,
        traceparent: Option<&str>,
        attempt: Option<u32>,
        topic: &str,
        partition: i32,
        first_offset: i64,
        last_offset: Option<i64>,
        chunks: u32,
        duplicate_chunks: u32,
        nbytes: Option<u64>,
        incomplete: Option<&str>,
        assembly_error: Option<&str>,
        assembly_detail: Option<&str>,
        assembly_us: u64,
    ) -> Self {
        let arguments = arguments.unwrap_or_default();
        let text = |s: Option<&str>| s.map(|s| PyString::new(py, s).unbind());
        AssembledCall {
            stream_id: PyString::new(py, stream_id).unbind(),
            call_id: PyString::new(py, call_id).unbind(),
            tool: text(tool),
            arguments: PyBytes::new(py, arguments).unbind(),
            channel: PyString::new(py, channel).unbind(),
            tool_version: text(tool_version),
            idempotency_key: text(idempotency_key),
            trace_id: text(trace_id),
            run_id: text(run_id),
            step_id: text(step_id),
            traceparent: text(traceparent),
            attempt,
            topic: PyString::new(py, topic).unbind(),
            partition,
            first_offset,
            last_offset: last_offset.unwrap_or(first_offset),
            chunks,
            duplicate_chunks,
            nbytes: nbytes.unwrap_or(arguments.len() as u64),
            incomplete: text(incomplete),
            assembly_error: text(assembly_error),
            assembly_detail: text(assembly_detail),
            assembly_us,
            event_id: PyString::new(
                py,
                &call_event_id(topic, partition, first_offset, stream_id, call_id),
            )
            .unbind(),
        }
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "AssembledCall(stream_id={}, call_id={}, tool={:?}, first_offset={}, incomplete={:?}, assembly_error={:?})",
            self.stream_id.bind(py),
            self.call_id.bind(py),
            self.tool.as_ref().map(|t| t.bind(py).to_string()),
            self.first_offset,
            self.incomplete.as_ref().map(|t| t.bind(py).to_string()),
            self.assembly_error.as_ref().map(|t| t.bind(py).to_string()),
        )
    }
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

fn call_event_id(
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

fn cut(text: &str, max_bytes: usize) -> &str {
    if text.len() <= max_bytes {
        return text;
    }
    let mut end = max_bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The reassembler of every partition this worker holds (see `assembler.rs`).
#[pyclass(module = "worker._native")]
pub struct Assembler {
    core: Core,
    max_id_bytes: usize,
    max_detail_bytes: usize,
}

/// One record of a fetched batch, read once from its Python object.
struct Record<'py> {
    offset: i64,
    timestamp: Option<i64>,
    object: Bound<'py, PyAny>,
    value: Option<Bound<'py, PyBytes>>,
    key: Option<RecordKey<'py>>,
    format: Option<String>,
    traceparent: Option<String>,
}

/// A record's key: the bytes object itself (read without a copy), or any other bytes-like.
enum RecordKey<'py> {
    Bytes(Bound<'py, PyBytes>),
    Other(Vec<u8>),
}

impl RecordKey<'_> {
    fn as_bytes(&self) -> &[u8] {
        match self {
            RecordKey::Bytes(bytes) => bytes.as_bytes(),
            RecordKey::Other(bytes) => bytes,
        }
    }
}

impl Assembler {
    fn scope(topic: &str, partition: i32) -> Scope {
        (Arc::from(topic), partition)
    }

    fn bounds(&self) -> Bounds {
        Bounds {
            max_call_bytes: self.core.limits.max_call_bytes,
            max_call_chunks: self.core.limits.max_call_chunks,
            max_id_bytes: self.max_id_bytes,
            max_detail_bytes: self.max_detail_bytes,
        }
    }

    /// One partition's records about to be fed, the calls they close going to `out`.
    fn batch<'py, 'a>(
        &'a mut self,
        py: Python<'py>,
        scope: &'a Scope,
        out: &'a Bound<'py, PyList>,
    ) -> Batch<'py, 'a> {
        let bounds = self.bounds();
        Batch {
            py,
            scope,
            feed: self.core.partition(scope),
            bounds,
            out,
            closed: Vec::new(),
        }
    }
}

/// The bounds the calls handed to Python are made with.
#[derive(Clone, Copy)]
struct Bounds {
    max_call_bytes: usize,
    max_call_chunks: u32,
    max_id_bytes: usize,
    max_detail_bytes: usize,
}

fn to_python(
    py: Python<'_>,
    bounds: Bounds,
    scope: &Scope,
    closed: Closed,
) -> PyResult<Py<AssembledCall>> {
    let text = |s: &Option<Box<str>>| s.as_deref().map(|s| PyString::new(py, s).unbind());
    let trace = closed.trace.as_deref().cloned().unwrap_or_default();
    let (incomplete, error, detail) = match &closed.ending {
        Ending::Complete => (None, None, None),
        Ending::Incomplete(reason) => (Some(reason.as_str()), None, None),
        Ending::Overflow(Overflow::TooLarge) => (
            None,
            Some("too_large"),
            Some(format!("the call exceeded {} bytes", bounds.max_call_bytes)),
        ),
        Ending::Overflow(Overflow::TooManyChunks) => (
            None,
            Some("too_many_chunks"),
            Some(format!(
                "the call exceeded {} chunks",
                bounds.max_call_chunks
            )),
        ),
        Ending::Reused => (
            None,
            Some("call_id_reused"),
            Some("the call id was already used by another call of this stream".to_owned()),
        ),
    };
    let id = call_event_id(
        &scope.0,
        scope.1,
        closed.first_offset,
        &closed.stream_id,
        &closed.call_id,
    );
    Py::new(
        py,
        AssembledCall {
            stream_id: PyString::new(py, &closed.stream_id).unbind(),
            call_id: PyString::new(py, &closed.call_id).unbind(),
            tool: text(&closed.tool),
            arguments: PyBytes::new(py, &closed.text).unbind(),
            channel: PyString::intern(py, closed.channel.as_str()).unbind(),
            tool_version: text(&closed.tool_version),
            idempotency_key: text(&closed.idempotency_key),
            trace_id: text(&trace.trace_id),
            run_id: text(&trace.run_id),
            step_id: text(&trace.step_id),
            traceparent: text(&trace.traceparent),
            attempt: trace.attempt,
            topic: PyString::new(py, &scope.0).unbind(),
            partition: scope.1,
            first_offset: closed.first_offset,
            last_offset: closed.last_offset,
            chunks: closed.chunks,
            duplicate_chunks: closed.duplicates,
            nbytes: closed.received,
            incomplete: incomplete.map(|s| PyString::intern(py, s).unbind()),
            assembly_error: error.map(|s| PyString::intern(py, s).unbind()),
            assembly_detail: detail.map(|s| PyString::new(py, &s).unbind()),
            assembly_us: closed.busy_ns / 1000,
            event_id: PyString::new(py, &id).unbind(),
        },
    )
}

fn emit(
    py: Python<'_>,
    bounds: Bounds,
    scope: &Scope,
    closed: impl IntoIterator<Item = Closed>,
    out: &Bound<'_, PyList>,
) -> PyResult<()> {
    for call in closed {
        out.append(to_python(py, bounds, scope, call)?)?;
    }
    Ok(())
}

/// One partition's records being fed: the calls they close go to `out`, in order.
struct Batch<'py, 'a> {
    py: Python<'py>,
    scope: &'a Scope,
    feed: PartitionFeed<'a>,
    bounds: Bounds,
    out: &'a Bound<'py, PyList>,
    /// Calls closed and not yet emitted.
    closed: Vec<Closed>,
}

impl Batch<'_, '_> {
    /// The calls closed since the last emit, to `out` in the order they closed.
    #[inline]
    fn emit(&mut self) -> PyResult<()> {
        if self.closed.is_empty() {
            return Ok(());
        }
        self.emit_closed()
    }

    fn emit_closed(&mut self) -> PyResult<()> {
        emit(
            self.py,
            self.bounds,
            self.scope,
            self.closed.drain(..),
            self.out,
        )
    }

    /// A record that could not be read: a rejected call of its own.
    fn malformed(&self, offset: i64, key: Option<&[u8]>, code: &str, detail: &str) -> PyResult<()> {
        let (py, scope) = (self.py, self.scope);
        let stream = String::from_utf8_lossy(key.unwrap_or_default());
        let stream = cut(&stream, self.bounds.max_id_bytes);
        let call_id = format!("record:{}:{}:{}", scope.0, scope.1, offset);
        let id = event_id(&[
            scope.0.as_bytes(),
            scope.1.to_string().as_bytes(),
            offset.to_string().as_bytes(),
            b"record",
        ]);
        let call = Py::new(
            py,
            AssembledCall {
                stream_id: PyString::new(py, stream).unbind(),
                call_id: PyString::new(py, &call_id).unbind(),
                tool: None,
                arguments: PyBytes::new(py, b"").unbind(),
                channel: PyString::intern(py, Channel::ToolCall.as_str()).unbind(),
                tool_version: None,
                idempotency_key: None,
                trace_id: None,
                run_id: None,
                step_id: None,
                traceparent: None,
                attempt: None,
                topic: PyString::new(py, &scope.0).unbind(),
                partition: scope.1,
                first_offset: offset,
                last_offset: offset,
                chunks: 0,
                duplicate_chunks: 0,
                nbytes: 0,
                incomplete: None,
                assembly_error: Some(PyString::intern(py, code).unbind()),
                assembly_detail: Some(
                    PyString::new(py, cut(detail, self.bounds.max_detail_bytes)).unbind(),
                ),
                assembly_us: 0,
                event_id: PyString::new(py, &id).unbind(),
            },
        )?;
        self.out.append(call)
    }

    /// Feed the pieces of one record; a record that is not what it says is its own call.
    fn feed_fed(&mut self, offset: i64, key: Option<&[u8]>, fed: Vec<Fed<'_>>) -> PyResult<()> {
        for item in fed {
            match item {
                Fed::Piece(mut piece) => self.feed.feed(offset, &mut piece, &mut self.closed),
                Fed::Malformed { code, detail } => self.malformed(offset, key, &code, &detail)?,
            }
        }
        self.emit()
    }

    fn feed_malformed_envelope(
        &mut self,
        offset: i64,
        key: Option<&[u8]>,
        bad: Malformed,
    ) -> PyResult<()> {
        self.malformed(offset, key, MALFORMED_RECORD, &bad.message)?;
        let closed = &mut self.closed;
        match (bad.stream_id, bad.call_id) {
            (Some(stream), Some(call)) => self.feed.feed(
                offset,
                &mut Piece::Abort {
                    stream_id: Cow::Owned(stream),
                    call_id: Cow::Owned(call),
                },
                closed,
            ),
            (Some(stream), None) => self.feed.abort_stream(offset, &stream, closed),
            (None, _) => {
                if let Some(stream) = key.and_then(|k| std::str::from_utf8(k).ok()) {
                    self.feed.abort_stream(offset, stream, closed);
                }
            }
        }
        self.emit()
    }
}

fn read_record<'py>(py: Python<'py>, object: Bound<'py, PyAny>) -> PyResult<Record<'py>> {
    let offset: i64 = object.getattr(pyo3::intern!(py, "offset"))?.extract()?;
    let timestamp: Option<i64> = object.getattr(pyo3::intern!(py, "timestamp"))?.extract()?;
    let value = object.getattr(pyo3::intern!(py, "value"))?;
    let value = if value.is_none() {
        None
    } else {
        Some(value.cast_into::<PyBytes>()?)
    };
    let key = object.getattr(pyo3::intern!(py, "key"))?;
    let key = if key.is_none() {
        None
    } else if let Ok(bytes) = key.cast::<PyBytes>() {
        Some(RecordKey::Bytes(bytes.clone()))
    } else {
        Some(RecordKey::Other(key.extract()?))
    };
    let headers = object.getattr(pyo3::intern!(py, "headers"))?;
    let mut format = None;
    let mut traceparent = None;
    if !headers.is_none() && headers.len()? > 0 {
        for header in headers.try_iter()? {
            let (name, value): (String, Option<Vec<u8>>) = header?.extract()?;
            let text = || String::from_utf8_lossy(&value.clone().unwrap_or_default()).into_owned();
            if name == CONTENT_FORMAT {
                format = Some(text());
            } else if name == TRACEPARENT {
                traceparent = Some(text());
            }
        }
    }
    Ok(Record {
        offset,
        timestamp: timestamp.filter(|ts| *ts >= 0),
        object,
        value,
        key,
        format,
        traceparent,
    })
}

#[pymethods]
impl Assembler {
    #[new]
    #[pyo3(signature = (
        *, max_call_bytes, max_call_chunks, max_open_calls_per_partition, max_id_bytes,
        max_detail_bytes, idle_timeout_ms, max_call_lifetime_ms, recently_closed_per_partition,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        max_call_bytes: usize,
        max_call_chunks: u32,
        max_open_calls_per_partition: usize,
        max_id_bytes: usize,
        max_detail_bytes: usize,
        idle_timeout_ms: i64,
        max_call_lifetime_ms: i64,
        recently_closed_per_partition: usize,
    ) -> PyResult<Self> {
        if max_open_calls_per_partition == 0 || recently_closed_per_partition == 0 {
            return Err(PyValueError::new_err(
                "the per-partition bounds must be at least 1",
            ));
        }
        Ok(Assembler {
            core: Core::new(Limits {
                max_call_bytes,
                max_call_chunks,
                max_open_calls: max_open_calls_per_partition,
                idle_timeout_ms,
                max_call_lifetime_ms,
                recently_closed: recently_closed_per_partition,
            }),
            max_id_bytes,
            max_detail_bytes,
        })
    }

    /// One partition's fetched records, in offset order, to the calls they closed.
    ///
    /// `decode_vendor(record, format)` turns a record with a `content-format` header into
    /// chunks (the Python adapters); it must not raise for bad input (a `malformed` chunk says
    /// what is wrong).
    fn feed_records<'py>(
        &mut self,
        py: Python<'py>,
        topic: &str,
        partition: i32,
        records: &Bound<'py, PyAny>,
        decode_vendor: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let started = Instant::now();
        let scope = Self::scope(topic, partition);
        let mut read = Vec::with_capacity(records.len().unwrap_or(0));
        for object in records.try_iter()? {
            read.push(read_record(py, object?)?);
        }
        let records = read;
        // each canonical envelope's text and traceparent (a record's own objects stay here)
        let envelopes: Vec<Option<(&[u8], Option<&str>)>> = records
            .iter()
            .map(|r| match (&r.value, &r.format) {
                (Some(value), None) => Some((value.as_bytes(), r.traceparent.as_deref())),
                _ => None,
            })
            .collect();
        let max_id_bytes = self.max_id_bytes;
        let mut decoded: Vec<Option<Result<Piece<'_>, Malformed>>> = py.detach(|| {
            let mut tape = Vec::new();
            envelopes
                .into_iter()
                .map(|envelope| {
                    let (value, traceparent) = envelope?;
                    Some(match traceparent {
                        Some(tp) if tp.len() > max_id_bytes => Err(Malformed {
                            message: format!(
                                "header 'traceparent' is longer than {max_id_bytes} bytes"
                            ),
                            stream_id: None,
                            call_id: None,
                        }),
                        _ => envelope::decode_with(value, traceparent, max_id_bytes, &mut tape),
                    })
                })
                .collect()
        });
        // a call's assembly time: its records' share of reading and decoding their batch, the
        // bulk of the native work per record (one clock read pair per batch)
        self.core.record_ns = (started.elapsed().as_nanos() / records.len().max(1) as u128) as u64;
        let out = PyList::empty(py);
        if records.is_empty() {
            return Ok(out);
        }
        let mut batch = self.batch(py, &scope, &out);
        for (record, decoded) in records.iter().zip(decoded.iter_mut()) {
            let fresh = batch
                .feed
                .begin_record(record.offset, record.timestamp, &mut batch.closed);
            batch.emit()?;
            if !fresh {
                continue; // fed before: its decode goes unused
            }
            let key = record.key.as_ref().map(RecordKey::as_bytes);
            if record.value.is_none() {
                let bad = Malformed {
                    message: "record has no value (a tombstone is not a chunk)".to_owned(),
                    stream_id: None,
                    call_id: None,
                };
                batch.feed_malformed_envelope(record.offset, key, bad)?;
                continue;
            }
            match (&record.format, decoded) {
                (None, Some(Ok(piece))) => {
                    batch.feed.feed(record.offset, piece, &mut batch.closed);
                    batch.emit()?;
                }
                (None, Some(Err(bad))) => {
                    batch.feed_malformed_envelope(record.offset, key, bad.clone())?
                }
                (None, None) => unreachable!("a record with a value and no format is decoded"),
                (Some(format), _) => {
                    // every event of a vendor stream keeps it active, pieces or not
                    if let Some(stream) = key.and_then(|k| std::str::from_utf8(k).ok()) {
                        batch.feed.touch(stream);
                    }
                    let chunks: Vec<Bound<'py, Chunk>> = decode_vendor
                        .call1((&record.object, format))?
                        .try_iter()?
                        .map(|chunk| Ok(chunk?.cast_into::<Chunk>()?))
                        .collect::<PyResult<_>>()?;
                    let mut fed = Vec::new();
                    for chunk in &chunks {
                        let chunk = chunk.get();
                        let item = chunk.to_fed(max_id_bytes);
                        if let Fed::Malformed { .. } = &item {
                            if chunk.kind != "malformed" {
                                // an identifier past its bound: the stream cannot be trusted
                                batch.feed.abort_stream(
                                    record.offset,
                                    &chunk.stream_id,
                                    &mut batch.closed,
                                );
                                batch.emit()?;
                            }
                        }
                        fed.push(item);
                    }
                    batch.feed_fed(record.offset, key, fed)?;
                }
            }
        }
        Ok(out)
    }

    /// Chunks in hand (one record's worth at `offset`), for callers that decoded them already.
    #[pyo3(signature = (topic, partition, offset, timestamp, chunks))]
    fn feed_chunks<'py>(
        &mut self,
        py: Python<'py>,
        topic: &str,
        partition: i32,
        offset: i64,
        timestamp: Option<i64>,
        chunks: Vec<PyRef<'py, Chunk>>,
    ) -> PyResult<Bound<'py, PyList>> {
        let scope = Self::scope(topic, partition);
        let out = PyList::empty(py);
        let started = Instant::now();
        let fed = chunks.iter().map(|c| c.to_fed(self.max_id_bytes)).collect();
        self.core.record_ns = started.elapsed().as_nanos() as u64;
        let mut batch = self.batch(py, &scope, &out);
        if !batch
            .feed
            .begin_record(offset, timestamp, &mut batch.closed)
        {
            return Ok(out);
        }
        batch.emit()?;
        batch.feed_fed(offset, None, fed)?;
        Ok(out)
    }

    /// End of all input (offline): every open call ends `stream_ended`.
    fn flush<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        let bounds = self.bounds();
        for (scope, closed) in self.core.flush() {
            emit(py, bounds, &scope, closed, &out)?;
        }
        Ok(out)
    }

    fn drop_partition(&mut self, topic: &str, partition: i32) {
        self.core.drop_partition(&Self::scope(topic, partition));
    }

    /// The partition's whole state, serialized (see `snapshot.rs`); starts a new delta epoch.
    fn snapshot<'py>(
        &mut self,
        py: Python<'py>,
        topic: &str,
        partition: i32,
    ) -> Bound<'py, PyBytes> {
        let bytes = snapshot::write_base(&mut self.core, &Self::scope(topic, partition));
        PyBytes::new(py, &bytes)
    }

    /// What changed in the partition since the last snapshot or delta, serialized.
    fn delta<'py>(&mut self, py: Python<'py>, topic: &str, partition: i32) -> Bound<'py, PyBytes> {
        let bytes = snapshot::write_delta(&mut self.core, &Self::scope(topic, partition));
        PyBytes::new(py, &bytes)
    }

    /// Rebuild a partition from a snapshot and the deltas written after it, in order.
    fn restore(&mut self, topic: &str, partition: i32, frames: Vec<Vec<u8>>) -> PyResult<()> {
        snapshot::restore(&mut self.core, &Self::scope(topic, partition), &frames)
            .map_err(PyValueError::new_err)
    }

    /// The partition's time (largest record timestamp seen, ms), None if never fed.
    fn clock(&self, topic: &str, partition: i32) -> Option<i64> {
        self.core.clock(&Self::scope(topic, partition))
    }

    /// The offset after the last record fed to the partition, None if never fed.
    fn next_offset(&self, topic: &str, partition: i32) -> Option<i64> {
        self.core.next_offset(&Self::scope(topic, partition))
    }

    #[getter]
    fn open_calls(&self) -> usize {
        self.core.open_calls()
    }

    #[getter]
    fn buffered_bytes(&self) -> usize {
        self.core.buffered_bytes()
    }

    #[getter]
    fn duplicate_chunks(&self) -> u64 {
        self.core.counters.duplicate_chunks
    }

    #[getter]
    fn late_chunks(&self) -> u64 {
        self.core.counters.late_chunks
    }

    #[getter]
    fn stale_records(&self) -> u64 {
        self.core.counters.stale_records
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Chunk>()?;
    m.add_class::<AssembledCall>()?;
    m.add_class::<Assembler>()?;
    Ok(())
}
