//! The kept fuzz corpus as a regression suite: every input under `fuzz/corpus/parse/` goes
//! through the same checks as the fuzz target (`_native::json::fuzz_check`), on stable, in
//! `cargo test`.

use std::fs;
use std::path::Path;

#[test]
fn every_corpus_input_passes_the_parse_target_checks() {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/parse");
    let mut inputs = 0;
    for entry in fs::read_dir(&corpus).expect("the parse corpus is kept in the repository") {
        let path = entry.expect("a corpus entry").path();
        let data = fs::read(&path).expect("a corpus file");
        let checked = std::panic::catch_unwind(|| _native::json::fuzz_check(&data));
        assert!(
            checked.is_ok(),
            "corpus input {} fails the checks",
            path.display()
        );
        inputs += 1;
    }
    assert!(inputs >= 30, "the corpus has only {inputs} inputs");
}
