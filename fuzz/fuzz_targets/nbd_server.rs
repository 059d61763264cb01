//! The NBD server's session (the whole protocol, no I/O, no runtime) fed arbitrary client
//! bytes in arbitrary pieces, with ops completed at once, some failing: it must never
//! panic, never hold more than its byte budget (plus one request's payload), never hand out
//! an op outside the export, and always either want more input or finish. With the first
//! byte's high bit set, write payloads of 4 KiB or more on the stream are handed off: the
//! harness takes those bytes from the input itself, as a server splicing them would.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use tagstripe_nbd_proto::session::{
    Catalog, ComponentLayout, ExportCaps, ExportEntry, ServerSession, SessionConfig,
};

/// Two components striped 16 sectors at a time, for the `tagstripe:component` context.
#[derive(Debug)]
struct Stripe2;

impl ComponentLayout for Stripe2 {
    fn component_map(&self, start: u64, sectors: u64) -> Option<Vec<(u64, usize, Option<usize>)>> {
        let mut out = Vec::new();
        let (mut at, end) = (start, start.checked_add(sectors)?);
        while at < end {
            let run = (16 - at % 16).min(end - at);
            out.push((run, ((at / 16) % 2) as usize, None));
            at += run;
        }
        Some(out)
    }
}

#[path = "common/ops.rs"]
mod ops;

fuzz_target!(|data: &[u8]| {
    let Some((&cut, data)) = data.split_first() else {
        return;
    };
    let size = 2048u64 * 512;
    let mut e = ExportEntry::new("x", size);
    e.caps = ExportCaps { flush: true, fua: true, trim: true, rotational: false };
    e.layout = Some(Arc::new(Stripe2));
    let ro = ExportEntry {
        read_only: true,
        ..ExportEntry::new("ro", 64 * 512)
    };
    let catalog = Arc::new(Catalog::new().with(e).with(ro));
    let config = SessionConfig {
        max_request: 64 << 10,
        max_buffered: 256 << 10,
        max_in_flight: 4,
        ..SessionConfig::default()
    };
    let mut s = ServerSession::new(catalog, config);
    let piece = usize::from(cut % 61) + 1;
    if cut & 0x80 != 0 {
        s.hand_off_payloads(Some((4096, 32 << 10)));
    }
    let mut n = 0u64;
    let mut at = 0usize;
    let mut handed = 0u64;
    loop {
        while s.take_output().is_some() {}
        let ran = ops::run_ops(&mut s, &mut n, 7, size, &mut handed);
        if handed > 0 {
            assert!(!s.wants_input(), "input wanted while the caller takes a payload");
            let left = data.len() - at;
            let take = usize::try_from(handed).map_or(left, |h| h.min(left));
            at += take;
            if take as u64 == handed {
                handed = 0;
                s.payload_taken();
            } else {
                handed = 0;
                s.end_of_input();
            }
            continue;
        }
        if s.is_finished() {
            break;
        }
        if ran {
            continue;
        }
        if !s.wants_input() {
            // Nothing in flight, nothing wanted, not finished would be a stall.
            assert!(s.in_flight() > 0 || s.take_output().is_some(), "the session stalled");
            continue;
        }
        if at < data.len() {
            let c = &data[at..(at + piece).min(data.len())];
            at += c.len();
            if s.receive(c).is_err() {
                break;
            }
        } else {
            s.end_of_input();
        }
    }
});
