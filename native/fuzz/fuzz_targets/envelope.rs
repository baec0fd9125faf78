//! The envelope decoder on arbitrary bytes (`callgate_core::fuzzing::envelope_check`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    callgate_core::fuzzing::envelope_check(data);
});
