//! `partition_for_key`: Kafka's default partitioner (the core's `partition`).

use callgate_core::partition;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// The index (0..partitions) of the partition a record with this key goes to.
#[pyfunction]
pub fn partition_for_key(key: &[u8], partitions: u32) -> PyResult<u32> {
    partition::partition_for_key(key, partitions)
        .ok_or_else(|| PyValueError::new_err("a topic has at least one partition"))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(partition_for_key, m)?)?;
    Ok(())
}
