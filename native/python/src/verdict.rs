//! `Verdict`, the chain's decision for one call (`worker.model.Verdict`), a native value made once
//! per call; `encode_event`, which reads a call and its verdict out into the core's event
//! encoder (`callgate_core::event`), field by field rather than attribute by attribute; and
//! `event_members`, a written event's member spans (for an event derived from it).

use callgate_core::event::{self, Schema, Violation};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString, PyTuple};
use smallvec::SmallVec;

use crate::call::AssembledCall;

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

/// A Python value that is None or a str.
fn str_or_none<'a>(value: &'a Bound<'_, PyAny>) -> PyResult<Option<&'a str>> {
    if value.is_none() {
        Ok(None)
    } else {
        Ok(Some(value.cast::<PyString>()?.to_str()?))
    }
}

fn opt_str<'a, 'py: 'a>(
    py: Python<'py>,
    value: &'a Option<Py<PyString>>,
) -> PyResult<Option<&'a str>> {
    value.as_ref().map(|v| v.bind(py).to_str()).transpose()
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
    let verdict = verdict.get();
    // the Python values the fields borrow from, held for as long as the encoding
    let schema = match &verdict.schema {
        None => None,
        Some(schema) => {
            let schema = schema.bind(py);
            Some([
                schema.getattr(pyo3::intern!(py, "id"))?,
                schema.getattr(pyo3::intern!(py, "version"))?,
            ])
        }
    };
    // plain loops: collecting a Python iterator asks it for a length hint first (a method
    // object made and called per list, about 250 instructions a call)
    let mut violations: SmallVec<[[Bound<'py, PyAny>; 3]; 4]> = SmallVec::new();
    for violation in verdict.violations.bind(py).try_iter()? {
        let violation = violation?;
        violations.push([
            violation.getattr(pyo3::intern!(py, "path"))?,
            violation.getattr(pyo3::intern!(py, "keyword"))?,
            violation.getattr(pyo3::intern!(py, "message"))?,
        ]);
    }
    let mut repairs: SmallVec<[Bound<'py, PyAny>; 4]> = SmallVec::new();
    for kind in verdict.repairs.bind(py).try_iter()? {
        repairs.push(kind?);
    }
    let mut phases: SmallVec<[(Bound<'py, PyString>, i64); 8]> = SmallVec::new();
    for (phase, micros) in verdict.phases_us.bind(py).iter() {
        phases.push((phase.cast_into::<PyString>()?, micros.extract::<i64>()?));
    }
    // the fields, borrowed
    let mut violation_fields: SmallVec<[Violation<'_>; 4]> = SmallVec::new();
    for [path, keyword, message] in &violations {
        violation_fields.push(Violation {
            path: str_or_none(path)?,
            keyword: str_or_none(keyword)?,
            message: str_or_none(message)?,
        });
    }
    let mut repair_kinds: SmallVec<[Option<&str>; 4]> = SmallVec::new();
    for kind in &repairs {
        repair_kinds.push(str_or_none(kind)?);
    }
    let mut phases_us: SmallVec<[(&str, i64); 8]> = SmallVec::new();
    for (phase, micros) in &phases {
        phases_us.push((phase.to_str()?, *micros));
    }
    let fields = event::Verdict {
        outcome: verdict.outcome.bind(py).to_str()?,
        phase: opt_str(py, &verdict.phase)?,
        code: opt_str(py, &verdict.code)?,
        reason: opt_str(py, &verdict.reason)?,
        schema: match &schema {
            None => None,
            Some([id, version]) => Some(Schema {
                id: str_or_none(id)?,
                version: str_or_none(version)?,
            }),
        },
        violations: &violation_fields,
        feedback_json: verdict
            .feedback_json
            .as_ref()
            .map(|json| json.bind(py).as_bytes()),
        repairs: &repair_kinds,
        retryable: verdict.retryable,
        idempotency_key: opt_str(py, &verdict.idempotency_key)?,
        duplicate_of: opt_str(py, &verdict.duplicate_of)?,
        phases_us: &phases_us,
        arguments_json: verdict
            .arguments_json
            .as_ref()
            .map(|json| json.bind(py).as_bytes()),
        requires_approval: verdict.requires_approval,
    };
    let call = call.get();
    Ok(event::encode(&call.fields(py)?, &fields, max_bytes).map(|bytes| PyBytes::new(py, &bytes)))
}

/// The members of the JSON object `event`, in order: each one's name and where its text starts
/// (its name's quote) and ends (after its value). ValueError when `event` is not one JSON object
/// or names a member twice.
#[pyfunction]
pub fn event_members(event: &[u8]) -> PyResult<Vec<(String, usize, usize)>> {
    event::members(event)
        .map(|members| {
            members
                .into_iter()
                .map(|member| (member.name, member.start, member.end))
                .collect()
        })
        .map_err(|error| PyValueError::new_err(error.to_string()))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Verdict>()?;
    m.add_function(wrap_pyfunction!(encode_event, m)?)?;
    m.add_function(wrap_pyfunction!(event_members, m)?)?;
    Ok(())
}
