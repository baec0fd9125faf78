//! `parse_json`: the core's strict parser (`callgate_core::json`) building Python objects as it
//! goes, with the builder below; `depth_over`; and `ParseError`, a rejection as a value.

use std::borrow::Cow;

use callgate_core::json::{self, parse, Builder, Code, Failure, Stop};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyList, PyString};
use smallvec::SmallVec;

/// Builds Python objects: dict, list, str, int, float, bool, None. Array elements wait on one
/// shared stack and become a list, sized once, when their array closes. Keys and short strings
/// come from the thread's [`StringCaches`] when they are free.
struct PyBuilder<'py, 'c> {
    py: Python<'py>,
    items: SmallVec<[Bound<'py, PyAny>; 16]>,
    strings: Option<&'c mut StringCaches>,
}

/// Python strings seen lately on this thread, so a string that comes back is neither decoded nor
/// allocated again, and a key is not hashed again either (a `str` keeps its hash). That is the
/// common case: every call to a tool has the same keys, and its short values (units, currencies,
/// modes, flags) repeat. Keys and values have separate tables, so values cannot crowd out keys.
struct StringCaches {
    keys: StringCache,
    values: StringCache,
}

thread_local! {
    static STRING_CACHES: std::cell::RefCell<StringCaches> =
        std::cell::RefCell::new(StringCaches {
            keys: StringCache::new(9, 64),
            values: StringCache::new(8, SHORT_STRING),
        });
}

/// A fixed number of slots, each holding the last string that hashed there: a string an
/// attacker picks costs at most a miss (one compare more than no cache), and the memory stays
/// bounded. Few slots (a tool's keys are a few dozen), so the table stays in the L1 cache.
struct StringCache {
    slots: Box<[Option<CachedString>]>,
    bits: u32,
    max_len: usize,
}

/// A Python string and its fingerprint. Up to [`SHORT_STRING`] bytes the fingerprint is the
/// text (compared in three instructions); a longer one is compared with the string's UTF-8.
struct CachedString {
    fingerprint: Fingerprint,
    string: Py<PyString>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
struct Fingerprint {
    len: usize,
    head: u64,
    tail: u64,
}

const SHORT_STRING: usize = 16;

impl StringCache {
    fn new(bits: u32, max_len: usize) -> Self {
        StringCache {
            slots: (0..1 << bits).map(|_| None).collect(),
            bits,
            max_len,
        }
    }

    fn get<'py>(&mut self, py: Python<'py>, text: &str) -> Bound<'py, PyString> {
        if text.len() > self.max_len {
            return PyString::new(py, text);
        }
        let fingerprint = Fingerprint::of(text.as_bytes());
        let slot = &mut self.slots[fingerprint.slot(self.bits)];
        if let Some(cached) = slot {
            let string = cached.string.bind(py);
            if cached.fingerprint == fingerprint
                && (text.len() <= SHORT_STRING || string.to_str().is_ok_and(|s| s == text))
            {
                return string.clone();
            }
        }
        let string = PyString::new(py, text);
        *slot = Some(CachedString {
            fingerprint,
            string: string.clone().unbind(),
        });
        string
    }
}

impl Fingerprint {
    /// The length and the first and last bytes, in two words: every byte of a text up to
    /// [`SHORT_STRING`] long is in them.
    fn of(key: &[u8]) -> Self {
        let len = key.len();
        let word = |at: usize| u64::from_le_bytes(key[at..at + 8].try_into().unwrap_or([0; 8]));
        let half = |at: usize| {
            u64::from(u32::from_le_bytes(
                key[at..at + 4].try_into().unwrap_or([0; 4]),
            ))
        };
        let (head, tail) = match len {
            0 => (0, 0),
            1..=3 => (
                u64::from(key[0]) | u64::from(key[len / 2]) << 8 | u64::from(key[len - 1]) << 16,
                0,
            ),
            4..=7 => (half(0) | half(len - 4) << 32, 0),
            _ => (word(0), word(len - 8)),
        };
        Fingerprint { len, head, tail }
    }

    fn slot(self, bits: u32) -> usize {
        let mixed = (self.head ^ self.tail.rotate_left(29) ^ self.len as u64)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (mixed >> (64 - bits)) as usize
    }
}

impl<'py> Builder for PyBuilder<'py, '_> {
    type Value = Bound<'py, PyAny>;
    type Key = Bound<'py, PyString>;
    type Array = usize;
    type Object = Bound<'py, PyDict>;
    type Error = PyErr;

    fn null(&mut self) -> Self::Value {
        self.py.None().into_bound(self.py)
    }
    fn bool(&mut self, value: bool) -> Self::Value {
        PyBool::new(self.py, value).to_owned().into_any()
    }
    fn int(&mut self, value: i64) -> Self::Value {
        match value.into_pyobject(self.py) {
            Ok(int) => int.into_any(),
            Err(never) => match never {},
        }
    }
    fn uint(&mut self, value: u64) -> Self::Value {
        match value.into_pyobject(self.py) {
            Ok(int) => int.into_any(),
            Err(never) => match never {},
        }
    }
    fn float(&mut self, value: f64) -> Self::Value {
        PyFloat::new(self.py, value).into_any()
    }
    fn string(&mut self, value: &str) -> Self::Value {
        match &mut self.strings {
            Some(caches) if value.len() <= SHORT_STRING => caches.values.get(self.py, value),
            _ => PyString::new(self.py, value),
        }
        .into_any()
    }
    fn key(&mut self, key: &str) -> Self::Key {
        match &mut self.strings {
            Some(caches) => caches.keys.get(self.py, key),
            None => PyString::new(self.py, key),
        }
    }
    fn array(&mut self) -> usize {
        self.items.len()
    }
    fn push(&mut self, _array: &mut usize, value: Self::Value) {
        self.items.push(value);
    }
    fn end_array(&mut self, start: usize) -> PyResult<Self::Value> {
        Ok(PyList::new(self.py, self.items.drain(start..))?.into_any())
    }
    fn object(&mut self) -> Self::Object {
        PyDict::new(self.py)
    }
    fn insert(
        &mut self,
        object: &mut Self::Object,
        key: &Self::Key,
        value: Self::Value,
    ) -> PyResult<bool> {
        let before = object.len();
        object.set_item(key, value)?;
        Ok(object.len() > before)
    }
    fn end_object(&mut self, object: Self::Object) -> Self::Value {
        object.into_any()
    }
    fn key_text<'k>(key: &'k Self::Key) -> Cow<'k, str> {
        key.to_cow().unwrap_or_else(|_| key.to_string_lossy())
    }
}

/// Why a text is not strict JSON; returned by `parse_json`, never raised.
#[pyclass(frozen, eq, hash, module = "worker._native")]
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ParseError {
    #[pyo3(get)]
    code: &'static str,
    #[pyo3(get)]
    message: String,
    #[pyo3(get)]
    path: String,
}

#[pymethods]
impl ParseError {
    #[new]
    #[pyo3(signature = (code, message, path = String::new()))]
    fn new(code: &str, message: String, path: String) -> PyResult<Self> {
        let Some(code) = Code::parse(code) else {
            let known = Code::ALL.map(Code::as_str).join(", ");
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "code must be one of {known}"
            )));
        };
        Ok(ParseError {
            code: code.as_str(),
            message,
            path,
        })
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let repr = |text: &str| -> PyResult<String> {
            Ok(PyString::new(py, text).repr()?.to_cow()?.into_owned())
        };
        Ok(format!(
            "ParseError(code={}, message={}, path={})",
            repr(self.code)?,
            repr(&self.message)?,
            repr(&self.path)?
        ))
    }
}

impl From<Failure> for ParseError {
    fn from(failure: Failure) -> Self {
        ParseError {
            code: failure.code.as_str(),
            message: failure.message,
            path: failure.path,
        }
    }
}

/// `parse_json(text, max_depth)`: the JSON value of `text`, or a `ParseError`. Never raises for
/// bad input.
#[pyfunction]
fn parse_json<'py>(py: Python<'py>, text: &[u8], max_depth: usize) -> PyResult<Bound<'py, PyAny>> {
    // A parse can run Python code (a garbage collection, a finalizer) that parses in turn: that
    // inner parse finds the caches taken and goes without them.
    STRING_CACHES.with(|caches| {
        let mut caches = caches.try_borrow_mut().ok();
        let mut builder = PyBuilder {
            py,
            items: SmallVec::new(),
            strings: caches.as_deref_mut(),
        };
        match parse(text, max_depth, &mut builder) {
            Ok(value) => Ok(value),
            Err(Stop::Invalid(failure)) => {
                Ok(Bound::new(py, ParseError::from(failure))?.into_any())
            }
            Err(Stop::Build(error)) => Err(error),
        }
    })
}

/// `depth_over(text, limit)`: the nesting depth of `text` if deeper than `limit`, else None.
#[pyfunction(name = "depth_over")]
fn py_depth_over(text: &[u8], limit: usize) -> Option<usize> {
    json::depth_over(text, limit)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("MAX_DEPTH", json::MAX_DEPTH)?;
    m.add_class::<ParseError>()?;
    m.add_function(wrap_pyfunction!(parse_json, m)?)?;
    m.add_function(wrap_pyfunction!(py_depth_over, m)?)?;
    Ok(())
}
