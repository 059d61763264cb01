//! Arbitrary text as a force string: the parser never panics, and accepted overrides apply
//! to a device without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tagstripe_quirks::{ForceString, Identity, Limits, QuirkSet};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(f) = ForceString::parse(text) {
        let id = Identity::parse("SEAGATE|ST34520N|1444");
        let _ = f.settings_for(&id).to_force_string();
        if let Ok(set) = QuirkSet::builtin().with_force(text) {
            let _ = set.apply(&id, &Limits::default());
        }
    }
});
