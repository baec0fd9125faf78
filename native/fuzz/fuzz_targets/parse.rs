//! Arbitrary bytes through the strict JSON parser (with the pure-Rust builder): it never panics,
//! a parsed value round-trips through its serialization, and `depth_over` agrees with the depth
//! the parser sees. The checks live in `_native::json::fuzz_check`, so `cargo test` runs the kept
//! corpus through them too.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    _native::json::fuzz_check(data);
});
