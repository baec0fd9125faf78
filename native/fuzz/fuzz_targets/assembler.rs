//! The reassembler under arbitrary scripts of records and state writes (`callgate_core::fuzzing::assembler_check`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    callgate_core::fuzzing::assembler_check(data);
});
