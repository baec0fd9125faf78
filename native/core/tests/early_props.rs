//! The early judge's soundness as a property, on stable: many generated schemas and values
//! (`callgate_core::fuzzing::early_check`, the fuzz target's checks), from a fixed seed.

use callgate_core::fuzzing::early_check;

#[test]
fn a_value_the_schema_accepts_is_never_rejected_early_however_it_is_split() {
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut rejected = 0;
    for _ in 0..20_000 {
        let data: Vec<u8> = (0..96).map(|_| next() as u8).collect();
        rejected += usize::from(early_check(&data));
    }
    // the property is not vacuous: the invalid values generated are mostly caught early
    assert!(rejected > 2_000, "only {rejected} rejected");
}
