//! The early judge's Python face: a contract's `EarlySchema` (compiled at load), the table of
//! them the reassembler reads (`EarlyRules`), and a call's `EarlyRejection`.

use std::sync::Arc;

use callgate_core::early::{self, Draft, Rejection, Token};
use callgate_core::origin::{self, CallKind};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyInt, PyString, PyTuple};

/// One contract's early rules: its input schema's keywords that decide a prefix.
#[pyclass(module = "worker._native", frozen)]
pub struct EarlySchema {
    pub schema: Arc<early::EarlySchema>,
}

#[pymethods]
impl EarlySchema {
    /// `schema` is the schema's JSON text, `draft` its draft (`draft7`, `draft2020-12`),
    /// `judges` the kinds of call its contract judges (`function_call`, ...).
    #[new]
    fn new(schema: &[u8], draft: &str, judges: Vec<String>) -> PyResult<Self> {
        let draft = Draft::parse(draft)
            .ok_or_else(|| PyValueError::new_err(format!("unknown draft {draft:?}")))?;
        let judges = judges
            .iter()
            .map(|kind| origin::call_kind(kind))
            .collect::<Result<Vec<CallKind>, String>>()
            .map_err(PyValueError::new_err)?;
        let schema =
            early::EarlySchema::compile(schema, draft, &judges).map_err(PyValueError::new_err)?;
        Ok(EarlySchema {
            schema: Arc::new(schema),
        })
    }

    /// Whether it decides anything (a schema of only undecidable keywords decides nothing).
    #[getter]
    fn decides_anything(&self) -> bool {
        self.schema.decides_anything()
    }

    fn __eq__(&self, other: PyRef<'_, EarlySchema>) -> bool {
        *self.schema == *other.schema
    }
}

/// The early rules of every (tool, version) a call may name; `None` as the version is what a
/// call that names none gets.
#[pyclass(module = "worker._native", frozen)]
pub struct EarlyRules {
    pub rules: Arc<early::EarlyRules>,
}

#[pymethods]
impl EarlyRules {
    #[new]
    fn new(
        entries: Vec<(String, Option<String>, PyRef<'_, EarlySchema>)>,
        max_depth: usize,
    ) -> Self {
        let mut rules = early::EarlyRules::new(max_depth);
        for (tool, version, schema) in entries {
            rules.insert(&tool, version.as_deref(), schema.schema.clone());
        }
        EarlyRules {
            rules: Arc::new(rules),
        }
    }

    /// Only the entries both tables hold with equal rules.
    fn agreeing(&self, other: PyRef<'_, EarlyRules>) -> Self {
        EarlyRules {
            rules: Arc::new(self.rules.agreeing(&other.rules)),
        }
    }

    fn __len__(&self) -> usize {
        self.rules.len()
    }
}

/// Why a call was rejected before its stream ended.
///
/// `kind` is `schema` (a keyword failed: `path` the place as tokens, `keyword`, `detail` the
/// keyword's schema value as JSON text or None), `root` (the arguments are not an object) or
/// `json` (no JSON value starts so: `keyword` is the parse error's code, `pointer` its place,
/// `detail` its message).
#[pyclass(module = "worker._native", frozen, get_all)]
pub struct EarlyRejection {
    kind: &'static str,
    path: Py<PyTuple>,
    pointer: String,
    keyword: String,
    detail: Option<String>,
}

#[pymethods]
impl EarlyRejection {
    #[new]
    #[pyo3(signature = (kind, keyword, *, path=None, pointer=String::new(), detail=None))]
    fn new(
        py: Python<'_>,
        kind: &str,
        keyword: String,
        path: Option<Py<PyTuple>>,
        pointer: String,
        detail: Option<String>,
    ) -> PyResult<Self> {
        let kind = ["schema", "root", "json"]
            .into_iter()
            .find(|known| *known == kind)
            .ok_or_else(|| PyValueError::new_err(format!("unknown kind {kind:?}")))?;
        Ok(EarlyRejection {
            kind,
            path: path.unwrap_or_else(|| PyTuple::empty(py).unbind()),
            pointer,
            keyword,
            detail,
        })
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "EarlyRejection(kind={:?}, keyword={:?}, path={}, pointer={:?}, detail={:?})",
            self.kind,
            self.keyword,
            self.path.bind(py),
            self.pointer,
            self.detail
        )
    }
}

impl EarlyRejection {
    pub fn of(py: Python<'_>, rejection: &Rejection) -> PyResult<Self> {
        Ok(match rejection {
            Rejection::Schema {
                path,
                keyword,
                param,
            } => {
                let tokens: Vec<Bound<'_, PyAny>> = path
                    .iter()
                    .map(|token| match token {
                        Token::Key(key) => PyString::new(py, key).into_any(),
                        Token::Index(index) => PyInt::new(py, *index).into_any(),
                    })
                    .collect();
                EarlyRejection {
                    kind: "schema",
                    path: PyTuple::new(py, tokens)?.unbind(),
                    pointer: String::new(),
                    keyword: (*keyword).to_owned(),
                    detail: param.as_deref().map(str::to_owned),
                }
            }
            Rejection::RootNotObject => EarlyRejection {
                kind: "root",
                path: PyTuple::empty(py).unbind(),
                pointer: String::new(),
                keyword: "type".to_owned(),
                detail: None,
            },
            Rejection::Json(failure) => EarlyRejection {
                kind: "json",
                path: PyTuple::empty(py).unbind(),
                pointer: failure.path.clone(),
                keyword: failure.code.as_str().to_owned(),
                detail: Some(failure.message.clone()),
            },
        })
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<EarlySchema>()?;
    m.add_class::<EarlyRules>()?;
    m.add_class::<EarlyRejection>()?;
    Ok(())
}
