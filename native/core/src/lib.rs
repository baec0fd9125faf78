//! callgate's per-record core in pure Rust: no Python in it, tested and fuzzed with `cargo test`
//! alone. The Python face (`native/python`, `worker._native`) converts between Python objects
//! and these types and decides nothing.
//!
//! - [`json`]: strict RFC 8259 parsing, generic over the [`json::Builder`] that makes the value
//!   ([`value`] is the pure-Rust one);
//! - [`envelope`]: the canonical envelope, decoded in one pass;
//! - [`chunk`]: an adapter's chunk, checked and turned into a reassembler piece;
//! - [`early`]: the early judge, a call's verdict before its stream ends;
//! - [`origin`]: what an adapter says of a call besides its text (its kind, its caller);
//! - [`assembler`]: pieces of interleaved streams in, closed calls out;
//! - [`record`]: a record that cannot be read, as a call of its own;
//! - [`snapshot`]: a partition's reassembly state written out and restored;
//! - [`event`]: the outcome event's bytes, its members' spans and the event ids;
//! - [`partition`]: Kafka's default partitioner;
//! - `fuzzing` (feature `fuzzing`): the fuzz targets' checks.

pub mod assembler;
pub mod chunk;
pub mod early;
pub mod envelope;
pub mod event;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod json;
pub mod origin;
pub mod partition;
pub mod record;
pub mod snapshot;
pub mod value;
