//! The envelope decoder on arbitrary bytes (`_native::fuzzing`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    _native::fuzzing::envelope_check(data);
});
