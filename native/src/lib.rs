//! callgate's native core, seen from Python as `worker._native`.
//!
//! The per-record work lives here; Python keeps composition, engines, plugins, vendor adapters
//! and the Kafka shell. Each module owns one job and registers its Python face below.

use pyo3::prelude::*;

mod json;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    json::register(m)?;
    Ok(())
}
