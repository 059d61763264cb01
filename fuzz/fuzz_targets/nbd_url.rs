//! Arbitrary text as an NBD URL: the parser never panics, and a URL it accepts, written
//! back out (percent-encoded), parses to the same URL.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tagstripe::nbd::NbdUrl;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(u) = NbdUrl::parse(text) else {
        return;
    };
    let written = u.to_string();
    let back = NbdUrl::parse(&written)
        .unwrap_or_else(|e| panic!("{text:?} was written as {written:?}, which does not parse: {e}"));
    assert_eq!(back, u, "{text:?} -> {written:?}");
});
