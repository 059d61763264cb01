//! The NBD server's session (the whole protocol, no I/O, no runtime) fed arbitrary client
//! bytes in arbitrary pieces, with ops completed at once, some failing: it must never
//! panic, never hold more than its byte budget (plus one request's payload), never hand out
//! an op outside the export, and always either want more input or finish.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use tagstripe::nbd::session::{Catalog, ExportEntry, ServerSession, SessionConfig};
use tagstripe::{DynBlockDevice, MemDevice, Volume};

#[path = "common/ops.rs"]
mod ops;

fuzz_target!(|data: &[u8]| {
    let Some((&cut, data)) = data.split_first() else {
        return;
    };
    let size = 2048u64 * 512;
    let a: Arc<dyn DynBlockDevice> = Arc::new(MemDevice::new("a", 1024));
    let b: Arc<dyn DynBlockDevice> = Arc::new(MemDevice::new("b", 1024));
    let vol = Arc::new(Volume::builder([a, b]).interleave(16).no_offset(true).build().unwrap());
    let mut e = ExportEntry::new("x", Arc::clone(&vol) as Arc<dyn DynBlockDevice>);
    e.volume = Some(vol);
    let ro = ExportEntry {
        read_only: true,
        ..ExportEntry::new("ro", Arc::new(MemDevice::new("r", 64)))
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
    let mut n = 0u64;
    let mut feed = data.chunks(piece);
    loop {
        while s.take_output().is_some() {}
        let ran = ops::run_ops(&mut s, &mut n, 7, size);
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
        match feed.next() {
            Some(c) => {
                if s.receive(c).is_err() {
                    break;
                }
            }
            None => {
                s.end_of_input();
            }
        }
    }
});
