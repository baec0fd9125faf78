//! `AssembledCall`: a call as the reassembler closed it (or as made by hand), what the chain
//! judges and `encode_event` writes the event of.

use callgate_core::assembler::{Channel, Closed, Ending, Limits, Scope};
use callgate_core::event::{self, call_event_id};
use callgate_core::origin::{self, CallKind};
use callgate_core::record::RecordCall;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString, PyTuple};

use crate::early::EarlyRejection;

/// Everything the chain needs to judge one call, as the reassembler closed it.
///
/// `incomplete` (a reason) or `assembly_error` (a code: `too_large`, `too_many_chunks`,
/// `call_id_reused`, `malformed_record`, ...) set means the verdict's first failing phase is
/// already known. `arguments` holds the text only for a call that ended complete; `nbytes`
/// counts what was received either way. `event_id` names the call: its partition, where it
/// began, its stream and call id. `call_kind`, `caller` and `double_encoded` are the origin its
/// adapter stated (`Chunk`): a plain function call the model made by default. `principal` is who
/// the call is made for, as its records named it (what the authorization phase judges). `early`
/// says why a call was rejected before its stream ended, `early_offset` the record whose chunk
/// decided.
#[pyclass(module = "worker._native", frozen, get_all)]
pub struct AssembledCall {
    stream_id: Py<PyString>,
    call_id: Py<PyString>,
    tool: Option<Py<PyString>>,
    arguments: Py<PyBytes>,
    channel: Py<PyString>,
    tool_version: Option<Py<PyString>>,
    idempotency_key: Option<Py<PyString>>,
    principal: Option<Py<PyString>>,
    trace_id: Option<Py<PyString>>,
    run_id: Option<Py<PyString>>,
    step_id: Option<Py<PyString>>,
    traceparent: Option<Py<PyString>>,
    attempt: Option<u32>,
    topic: Py<PyString>,
    partition: i32,
    first_offset: i64,
    last_offset: i64,
    chunks: u32,
    duplicate_chunks: u32,
    nbytes: u64,
    incomplete: Option<Py<PyString>>,
    assembly_error: Option<Py<PyString>>,
    assembly_detail: Option<Py<PyString>>,
    assembly_us: u64,
    event_id: Py<PyString>,
    call_kind: Py<PyString>,
    caller: Option<Py<PyString>>,
    double_encoded: bool,
    early: Option<Py<EarlyRejection>>,
    early_offset: Option<i64>,
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
        assembly_detail=None, assembly_us=0, call_kind="function_call", caller=None,
        double_encoded=false, principal=None, early=None, early_offset=None,
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
        call_kind: &str,
        caller: Option<&str>,
        double_encoded: bool,
        principal: Option<&str>,
        early: Option<Py<EarlyRejection>>,
        early_offset: Option<i64>,
    ) -> PyResult<Self> {
        if early.is_some() != early_offset.is_some() {
            return Err(PyValueError::new_err(
                "an early call names both its rejection and its deciding offset",
            ));
        }
        let kind = origin::call_kind(call_kind).map_err(PyValueError::new_err)?;
        if let Some(caller) = caller {
            origin::check_caller(caller).map_err(PyValueError::new_err)?;
        }
        let arguments = arguments.unwrap_or_default();
        let text = |s: Option<&str>| s.map(|s| PyString::new(py, s).unbind());
        Ok(AssembledCall {
            stream_id: PyString::new(py, stream_id).unbind(),
            call_id: PyString::new(py, call_id).unbind(),
            tool: text(tool),
            arguments: PyBytes::new(py, arguments).unbind(),
            channel: PyString::new(py, channel).unbind(),
            tool_version: text(tool_version),
            idempotency_key: text(idempotency_key),
            principal: text(principal),
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
            call_kind: PyString::intern(py, kind.as_str()).unbind(),
            caller: text(caller),
            double_encoded,
            early,
            early_offset,
        })
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

impl AssembledCall {
    /// A call the reassembler closed in `scope`.
    pub fn closed(
        py: Python<'_>,
        limits: &Limits,
        scope: &Scope,
        closed: Closed,
    ) -> PyResult<Self> {
        let text = |s: &Option<Box<str>>| s.as_deref().map(|s| PyString::new(py, s).unbind());
        let trace = closed.trace.as_deref().cloned().unwrap_or_default();
        let origin = closed.origin.map(|origin| *origin).unwrap_or_default();
        let error = closed.ending.assembly_error(limits);
        let id = call_event_id(
            &scope.0,
            scope.1,
            closed.first_offset,
            &closed.stream_id,
            &closed.call_id,
        );
        let (early, early_offset) = match &closed.ending {
            Ending::Early(verdict) => (
                Some(Py::new(py, EarlyRejection::of(py, &verdict.rejection)?)?),
                Some(verdict.offset),
            ),
            _ => (None, None),
        };
        Ok(AssembledCall {
            stream_id: PyString::new(py, &closed.stream_id).unbind(),
            call_id: PyString::new(py, &closed.call_id).unbind(),
            tool: text(&closed.tool),
            arguments: PyBytes::new(py, &closed.text).unbind(),
            channel: PyString::intern(py, closed.channel.as_str()).unbind(),
            tool_version: text(&closed.tool_version),
            idempotency_key: text(&closed.idempotency_key),
            principal: text(&closed.principal),
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
            incomplete: closed
                .ending
                .incomplete()
                .map(|reason| PyString::intern(py, reason.as_str()).unbind()),
            assembly_error: error
                .as_ref()
                .map(|e| PyString::intern(py, e.code).unbind()),
            assembly_detail: error.map(|e| PyString::new(py, &e.detail).unbind()),
            assembly_us: closed.busy_ns / 1000,
            event_id: PyString::new(py, &id).unbind(),
            call_kind: PyString::intern(py, origin.kind.as_str()).unbind(),
            caller: text(&origin.caller),
            double_encoded: origin.double_encoded,
            early,
            early_offset,
        })
    }

    /// The call of a record that could not be read, in `scope`, rejected with `code`.
    pub fn record(
        py: Python<'_>,
        scope: &Scope,
        offset: i64,
        code: &str,
        call: RecordCall,
    ) -> Self {
        AssembledCall {
            stream_id: PyString::new(py, &call.stream_id).unbind(),
            call_id: PyString::new(py, &call.call_id).unbind(),
            tool: None,
            arguments: PyBytes::new(py, b"").unbind(),
            channel: PyString::intern(py, Channel::ToolCall.as_str()).unbind(),
            tool_version: None,
            idempotency_key: None,
            principal: None,
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
            assembly_detail: Some(PyString::new(py, &call.detail).unbind()),
            assembly_us: 0,
            event_id: PyString::new(py, &call.event_id).unbind(),
            call_kind: PyString::intern(py, CallKind::Function.as_str()).unbind(),
            caller: None,
            double_encoded: false,
            early: None,
            early_offset: None,
        }
    }

    /// The call's fields as the core's event encoder reads them.
    pub fn fields<'a, 'py: 'a>(&'a self, py: Python<'py>) -> PyResult<event::Call<'a>> {
        let text = |value: &'a Option<Py<PyString>>| -> PyResult<Option<&'a str>> {
            value.as_ref().map(|v| v.bind(py).to_str()).transpose()
        };
        Ok(event::Call {
            event_id: self.event_id.bind(py).to_str()?,
            stream_id: self.stream_id.bind(py).to_str()?,
            call_id: self.call_id.bind(py).to_str()?,
            tool: text(&self.tool)?,
            arguments: self.arguments.bind(py).as_bytes(),
            topic: self.topic.bind(py).to_str()?,
            partition: self.partition,
            first_offset: self.first_offset,
            last_offset: self.last_offset,
            chunks: self.chunks,
            nbytes: self.nbytes,
            duplicate_chunks: self.duplicate_chunks,
            trace_id: text(&self.trace_id)?,
            run_id: text(&self.run_id)?,
            step_id: text(&self.step_id)?,
            traceparent: text(&self.traceparent)?,
            attempt: self.attempt,
            call_kind: origin::call_kind(self.call_kind.bind(py).to_str()?)
                .map_err(PyValueError::new_err)?,
            caller: text(&self.caller)?,
            principal: text(&self.principal)?,
            early_offset: self.early_offset,
        })
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<AssembledCall>()?;
    // the call kinds' names, in the core's order (`worker.model.CallKind` is held to them)
    let names = PyTuple::new(m.py(), CallKind::ALL.map(CallKind::as_str))?;
    m.add("CALL_KINDS", names)?;
    Ok(())
}
