//! Corpus files as another tool or a person might write them: arbitrary JSON bytes and
//! an arbitrary sibling safetensors blob. Loading must return a case that validates or
//! an error naming a field; never panic, never allocate from an unchecked size.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    // Layout: [u16 LE json length][json][tensors]; a short input is all JSON.
    let (json, tensors) = if data.len() >= 2 {
        let n = u16::from_le_bytes([data[0], data[1]]) as usize;
        let rest = &data[2..];
        if n <= rest.len() {
            (&rest[..n], Some(&rest[n..]))
        } else {
            (rest, None)
        }
    } else {
        (data, None)
    };
    if let Ok(file) = mqa_fuzz::case::load_case_bytes(Path::new("fuzz.json"), json, tensors) {
        // What loads must validate, and its rows' valid sets must be computable.
        let case = &file.case;
        case.validate().expect("a loaded case validates");
        for r in 0..case.rows() {
            assert!(case.valid_len(r) <= case.max_model_len);
        }
    }
});
