//! callgate's native core, seen from Python as `worker._native`.
//!
//! The per-record work lives here; Python keeps composition, engines, plugins, vendor adapters
//! and the Kafka shell. Each module owns one job and registers its Python face below.

use pyo3::prelude::*;

mod assembler;
mod envelope;
mod event;
mod face;
pub mod fuzzing;
pub mod json;
mod partition;
mod snapshot;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    json::register(m)?;
    face::register(m)?;
    event::register(m)?;
    partition::register(m)?;
    Ok(())
}
