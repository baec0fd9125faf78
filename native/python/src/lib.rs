//! callgate's native core seen from Python as `worker._native`: this crate only converts.
//!
//! Everything that decides lives in the pure core (`callgate_core`, `native/core`); each module
//! here takes Python objects apart into the core's types, hands the core's results back as Python
//! objects, and registers its classes and functions below.
//!
//! - `json`: `parse_json` (the core's parser with a builder that makes Python objects),
//!   `depth_over`, `ParseError`;
//! - `call`: `AssembledCall`, the call the reassembler hands the judge;
//! - `early`: `EarlySchema`, `EarlyRules` and `EarlyRejection`, the early judge's;
//! - `assembler`: `Chunk` in, `AssembledCall`s out, `Assembler` in between;
//! - `verdict`: `Verdict`, `encode_event` and `event_members`;
//! - `partition`: `partition_for_key`.

use pyo3::prelude::*;

mod assembler;
mod call;
mod early;
mod json;
mod partition;
mod verdict;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    json::register(m)?;
    call::register(m)?;
    early::register(m)?;
    assembler::register(m)?;
    verdict::register(m)?;
    partition::register(m)?;
    Ok(())
}
