//! Strict RFC 8259 parsing into Python values (placeholder until the parser lands).

use pyo3::prelude::*;

pub fn register(_m: &Bound<'_, PyModule>) -> PyResult<()> {
    Ok(())
}
