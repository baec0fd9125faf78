//! Generated schemas and values through the early judge, split anywhere: a value the schema
//! accepts is never rejected early, and a rejection is of a value the schema rejects
//! (`callgate_core::fuzzing::early_check`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = callgate_core::fuzzing::early_check(data);
});
