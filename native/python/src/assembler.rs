//! The reassembler's Python face: `Chunk` in, `AssembledCall` out, `Assembler` in between.
//!
//! `Assembler.feed_records` takes a fetched batch of one partition as it comes from the Kafka
//! client (objects with `offset`, `timestamp`, `key`, `value`, `headers`), decodes every
//! canonical envelope with the interpreter released, hands each vendor record (a
//! `content-format` header) to the Python adapter callback, and feeds everything, in offset
//! order, to the core's reassembler. A record it cannot read is a call of its own, rejected
//! `malformed_record`, and ends every call it could belong to (`stream_corrupt`).

use std::sync::Arc;
use std::time::Instant;

use callgate_core::assembler::{Assembler as Core, Closed, Limits, PartitionFeed, Piece, Scope};
use callgate_core::chunk::{self, Fed};
use callgate_core::envelope::{self, Malformed};
use callgate_core::record::{self, record_call, MALFORMED_RECORD};
use callgate_core::snapshot;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use crate::call::AssembledCall;
use crate::early::EarlyRules;

const CONTENT_FORMAT: &str = "content-format";
const TRACEPARENT: &str = "traceparent";
const PRINCIPAL: &str = "principal";

/// One piece of model output for one stream, as an adapter makes it.
///
/// `kind` is a channel (`tool_call`, `text`, `refusal`, `error`, `mcp_result`), `end` (the
/// stream ended; `finish_reason` says how; with a `call_id`, that call alone ended unreleased:
/// its choice or candidate finished so), `abort` (the adapter met an event it could not place:
/// the call `call_id` cannot be trusted) or `malformed` (the record is not what its format says:
/// `delta` says why, `error` names the code, `malformed_record` unless said otherwise).
/// `expected` on a final piece is the vendor's own final text of the whole call. A tool call's
/// first piece may state its origin: `call_kind` (a `worker.model.CallKind` value; a plain
/// function call when not given), `caller` (the vendor's JSON object naming who made the call)
/// and `double_encoded` (its server is known to double-encode arguments). `principal` names who
/// the call is made for (a vendor record's `principal` header).
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
    principal: Option<String>,
    trace_id: Option<String>,
    run_id: Option<String>,
    step_id: Option<String>,
    traceparent: Option<String>,
    attempt: Option<u32>,
    expected: Option<String>,
    error: Option<String>,
    call_kind: Option<String>,
    caller: Option<String>,
    double_encoded: bool,
}

#[pymethods]
impl Chunk {
    #[new]
    #[pyo3(signature = (
        stream_id, kind, call_id=None, *, seq=None, tool=None, tool_version=None,
        delta=String::new(), r#final=false, finish_reason=None, idempotency_key=None,
        principal=None, trace_id=None, run_id=None, step_id=None, traceparent=None, attempt=None,
        expected=None, error=None, call_kind=None, caller=None, double_encoded=false,
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
        principal: Option<String>,
        trace_id: Option<String>,
        run_id: Option<String>,
        step_id: Option<String>,
        traceparent: Option<String>,
        attempt: Option<u32>,
        expected: Option<String>,
        error: Option<String>,
        call_kind: Option<String>,
        caller: Option<String>,
        double_encoded: bool,
    ) -> PyResult<Self> {
        let chunk = Chunk {
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
            principal,
            trace_id,
            run_id,
            step_id,
            traceparent,
            attempt,
            expected,
            error,
            call_kind,
            caller,
            double_encoded,
        };
        chunk.fields().check().map_err(PyValueError::new_err)?;
        Ok(chunk)
    }

    fn __repr__(&self) -> String {
        format!(
            "Chunk(stream_id={:?}, kind={:?}, call_id={:?}, seq={:?}, tool={:?}, delta={:?}, final={})",
            self.stream_id, self.kind, self.call_id, self.seq, self.tool, self.delta, self.is_final
        )
    }
}

impl Chunk {
    /// The chunk's fields as the core reads them.
    fn fields(&self) -> chunk::Chunk<'_> {
        chunk::Chunk {
            stream_id: &self.stream_id,
            kind: &self.kind,
            call_id: self.call_id.as_deref(),
            seq: self.seq,
            tool: self.tool.as_deref(),
            tool_version: self.tool_version.as_deref(),
            delta: &self.delta,
            is_final: self.is_final,
            finish_reason: self.finish_reason.as_deref(),
            idempotency_key: self.idempotency_key.as_deref(),
            principal: self.principal.as_deref(),
            trace_id: self.trace_id.as_deref(),
            run_id: self.run_id.as_deref(),
            step_id: self.step_id.as_deref(),
            traceparent: self.traceparent.as_deref(),
            attempt: self.attempt,
            expected: self.expected.as_deref(),
            error: self.error.as_deref(),
            call_kind: self.call_kind.as_deref(),
            caller: self.caller.as_deref(),
            double_encoded: self.double_encoded,
        }
    }

    fn to_fed(&self, max_id_bytes: usize) -> Fed<'_> {
        self.fields().to_fed(max_id_bytes)
    }
}

/// The reassembler of every partition this worker holds (the core's `assembler`).
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
    /// the `principal` header as it came (its bytes must be UTF-8)
    principal: Option<Vec<u8>>,
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

    /// One partition's records about to be fed, the calls they close going to `out`.
    fn batch<'py, 'a>(
        &'a mut self,
        py: Python<'py>,
        scope: &'a Scope,
        out: &'a Bound<'py, PyList>,
    ) -> Batch<'py, 'a> {
        let (max_id_bytes, max_detail_bytes) = (self.max_id_bytes, self.max_detail_bytes);
        let feed = self.core.partition(scope);
        let limits = feed.limits();
        Batch {
            py,
            scope,
            feed,
            limits,
            max_id_bytes,
            max_detail_bytes,
            out,
            closed: Vec::new(),
        }
    }
}

fn emit(
    py: Python<'_>,
    limits: &Limits,
    scope: &Scope,
    closed: impl IntoIterator<Item = Closed>,
    out: &Bound<'_, PyList>,
) -> PyResult<()> {
    for call in closed {
        out.append(Py::new(
            py,
            AssembledCall::closed(py, limits, scope, call)?,
        )?)?;
    }
    Ok(())
}

/// One partition's records being fed: the calls they close go to `out`, in order.
struct Batch<'py, 'a> {
    py: Python<'py>,
    scope: &'a Scope,
    feed: PartitionFeed<'a>,
    limits: &'a Limits,
    max_id_bytes: usize,
    max_detail_bytes: usize,
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
            self.limits,
            self.scope,
            self.closed.drain(..),
            self.out,
        )
    }

    /// A record that could not be read: a rejected call of its own, under the stream and call
    /// it names (`named`) when they could be read; `at` is its offset and which of the record's
    /// rejections this is (from 0), each an event of its own.
    fn malformed(
        &self,
        at: (i64, u32),
        key: Option<&[u8]>,
        named: (Option<&str>, Option<&str>),
        code: &str,
        detail: &str,
    ) -> PyResult<()> {
        let (py, scope) = (self.py, self.scope);
        let call = record_call(
            scope,
            at,
            key,
            named,
            detail,
            self.max_id_bytes,
            self.max_detail_bytes,
        );
        let call = Py::new(py, AssembledCall::record(py, scope, at.0, code, call))?;
        self.out.append(call)
    }

    /// Feed the pieces of one record; a record that is not what it says is its own call, as is
    /// one whose pieces a stream of envelopes refuses (once, however many it refuses).
    fn feed_fed(&mut self, offset: i64, key: Option<&[u8]>, fed: Vec<Fed<'_>>) -> PyResult<()> {
        let mut refused = false;
        let mut rejections = 0; // the record's rejections so far: each has its own event id
        for item in fed {
            match item {
                Fed::Piece(mut piece) => {
                    let taken = self.feed.feed(offset, &mut piece, &mut self.closed);
                    if let (Err(bad), false) = (taken, refused) {
                        refused = true;
                        let named = (bad.stream_id.as_deref(), bad.call_id.as_deref());
                        self.malformed(
                            (offset, rejections),
                            key,
                            named,
                            MALFORMED_RECORD,
                            &bad.message,
                        )?;
                        rejections += 1;
                    }
                }
                Fed::Malformed {
                    code,
                    detail,
                    named,
                } => {
                    let named = named.map_or((None, None), |(s, c)| (Some(s), Some(c)));
                    self.malformed((offset, rejections), key, named, &code, &detail)?;
                    rejections += 1;
                }
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
        let named = (bad.stream_id.as_deref(), bad.call_id.as_deref());
        self.malformed((offset, 0), key, named, MALFORMED_RECORD, &bad.message)?;
        record::abort_unreadable(&mut self.feed, offset, key, bad, &mut self.closed);
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
    let mut principal = None;
    if !headers.is_none() && headers.len()? > 0 {
        for header in headers.try_iter()? {
            let (name, value): (String, Option<Vec<u8>>) = header?.extract()?;
            let text = || String::from_utf8_lossy(&value.clone().unwrap_or_default()).into_owned();
            if name == CONTENT_FORMAT {
                format = Some(text());
            } else if name == TRACEPARENT {
                traceparent = Some(text());
            } else if name == PRINCIPAL {
                principal = value;
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
        principal,
    })
}

#[pymethods]
impl Assembler {
    #[new]
    #[pyo3(signature = (
        *, max_call_bytes, max_call_chunks, max_open_calls_per_partition, max_id_bytes,
        max_detail_bytes, idle_timeout_ms, max_call_lifetime_ms, recently_closed_per_partition,
        early=None,
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
        early: Option<PyRef<'_, EarlyRules>>,
    ) -> PyResult<Self> {
        let limits = Limits {
            max_call_bytes,
            max_call_chunks,
            max_open_calls: max_open_calls_per_partition,
            idle_timeout_ms,
            max_call_lifetime_ms,
            recently_closed: recently_closed_per_partition,
        };
        limits.check().map_err(PyValueError::new_err)?;
        let mut core = Core::new(limits);
        core.early = early.map(|rules| rules.rules.clone());
        Ok(Assembler {
            core,
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
        // each canonical envelope's text, traceparent and principal (a record's own objects stay
        // here)
        type Envelope<'r> = (&'r [u8], Option<&'r str>, Option<&'r [u8]>);
        let envelopes: Vec<Option<Envelope<'_>>> = records
            .iter()
            .map(|r| match (&r.value, &r.format) {
                (Some(value), None) => Some((
                    value.as_bytes(),
                    r.traceparent.as_deref(),
                    r.principal.as_deref(),
                )),
                _ => None,
            })
            .collect();
        let max_id_bytes = self.max_id_bytes;
        let mut decoded: Vec<Option<Result<Piece<'_>, Malformed>>> = py.detach(|| {
            let mut tape = Vec::new();
            envelopes
                .into_iter()
                .map(|envelope| {
                    let (value, traceparent, principal) = envelope?;
                    Some(match principal.map(std::str::from_utf8).transpose() {
                        Err(_) => {
                            // named as any record that cannot be read (the core's one rule)
                            let (stream_id, call_id) = envelope::readable_ids(value, max_id_bytes);
                            Err(Malformed {
                                message: "header 'principal' is not UTF-8".to_owned(),
                                stream_id,
                                call_id,
                            })
                        }
                        Ok(principal) => {
                            let headers = envelope::RecordHeaders {
                                traceparent,
                                principal,
                            };
                            envelope::decode_with(value, headers, max_id_bytes, &mut tape)
                        }
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
                    match batch
                        .feed
                        .feed_envelope(record.offset, piece, &mut batch.closed)
                    {
                        Ok(()) => batch.emit()?,
                        Err(bad) => batch.feed_malformed_envelope(record.offset, key, bad)?,
                    }
                }
                (None, Some(Err(bad))) => {
                    batch.feed_malformed_envelope(record.offset, key, bad.clone())?
                }
                (None, None) => unreachable!("a record with a value and no format is decoded"),
                (Some(format), _) => {
                    // every event of a vendor stream keeps it active, pieces or not (a stream
                    // of envelopes it cannot add to)
                    if let Some(stream) = key.and_then(|k| std::str::from_utf8(k).ok()) {
                        if !batch.feed.other_source(stream, false) {
                            batch.feed.touch(stream);
                        }
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
        for (scope, closed) in self.core.flush() {
            emit(py, &self.core.limits, &scope, closed, &out)?;
        }
        Ok(out)
    }

    fn drop_partition(&mut self, topic: &str, partition: i32) {
        self.core.drop_partition(&Self::scope(topic, partition));
    }

    /// The partition's whole state, serialized (the core's `snapshot`); starts a new delta epoch.
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

    /// Pieces of calls already rejected early, dropped unread.
    #[getter]
    fn early_dropped_chunks(&self) -> u64 {
        self.core.counters.early_dropped_chunks
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Chunk>()?;
    m.add_class::<AssembledCall>()?;
    m.add_class::<Assembler>()?;
    Ok(())
}
