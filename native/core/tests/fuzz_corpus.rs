//! The kept fuzz corpora as a regression suite: every input under `native/fuzz/corpus/<target>/`
//! goes through the same checks as its fuzz target (`callgate_core::fuzzing`), on stable, in
//! `cargo test`.

use std::fs;
use std::path::Path;

use callgate_core::fuzzing;

fn every_input_passes(target: &str, check: fn(&[u8]), at_least: usize) {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target);
    let mut inputs = 0;
    for entry in fs::read_dir(&corpus).expect("the corpus is kept in the repository") {
        let path = entry.expect("a corpus entry").path();
        let data = fs::read(&path).expect("a corpus file");
        let checked = std::panic::catch_unwind(|| check(&data));
        assert!(
            checked.is_ok(),
            "corpus input {} fails the {target} checks",
            path.display()
        );
        inputs += 1;
    }
    assert!(
        inputs >= at_least,
        "the {target} corpus has only {inputs} inputs"
    );
}

#[test]
fn every_parse_input_passes_its_checks() {
    every_input_passes("parse", fuzzing::parse_check, 30);
}

#[test]
fn every_assembler_input_passes_its_checks() {
    every_input_passes("assembler", fuzzing::assembler_check, 30);
}

#[test]
fn every_envelope_input_passes_its_checks() {
    every_input_passes("envelope", fuzzing::envelope_check, 30);
}
