//! The reassembler under arbitrary scripts of records and state writes (`_native::fuzzing`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    _native::fuzzing::assembler_check(data);
});
