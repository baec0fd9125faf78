//! Arbitrary bytes through the strict JSON parser (with the pure-Rust builder): it never panics,
//! a parsed value round-trips through its serialization, and `depth_over` agrees with the depth
//! the parser sees (`callgate_core::fuzzing::parse_check`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    callgate_core::fuzzing::parse_check(data);
});
