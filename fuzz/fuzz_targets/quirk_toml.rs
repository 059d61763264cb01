//! Arbitrary text as a quirk TOML file: the loader never panics, and a table it accepts can
//! be matched and applied.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tagstripe_quirks::{Identity, Limits, QuirkSet, QuirkTable};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(t) = QuirkTable::from_toml(text, "fuzz.toml") {
        let id = Identity::new("ATA", "ST380023AS", "3.01");
        let _ = t.first_match(&id);
        if let Ok(set) = QuirkSet::empty().with_file(text, "fuzz.toml") {
            let _ = set.apply(&id, &Limits::default());
        }
    }
});
