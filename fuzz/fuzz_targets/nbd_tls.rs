//! The NBD session with TLS required, fed arbitrary client bytes: before TLS nothing but
//! STARTTLS and ABORT may be answered with anything other than an error (no export's name,
//! size or data in the clear); once the client's STARTTLS is acknowledged the handshake is
//! taken as done and the rest of the input is the TLS-wrapped session (negotiation again,
//! then transmission), which must neither panic nor stall.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use tagstripe_nbd_proto::proto::{self, OptionReply};
use tagstripe_nbd_proto::session::{Catalog, ExportEntry, ServerSession, SessionConfig, TlsPolicy};

#[path = "common/ops.rs"]
mod ops;

/// Checks the option replies sent in the clear (after the 18-byte greeting).
fn check_clear(out: &[u8]) {
    let mut b = &out[18.min(out.len())..];
    while b.len() >= OptionReply::LEN {
        let r = OptionReply::parse(b).expect("the server's own option reply parses");
        assert!(
            matches!(
                r.reply,
                proto::REP_ACK | proto::REP_ERR_TLS_REQD | proto::REP_ERR_INVALID | proto::REP_ERR_TOO_BIG
            ),
            "reply {:#x} to option {} before TLS",
            r.reply,
            r.option
        );
        let n = OptionReply::LEN + r.length as usize;
        b = &b[n.min(b.len())..];
    }
}

fuzz_target!(|data: &[u8]| {
    let catalog = Arc::new(Catalog::new().with(ExportEntry::new("secret", 64 * 512)));
    let config = SessionConfig {
        max_request: 64 << 10,
        max_buffered: 256 << 10,
        max_in_flight: 4,
        tls: TlsPolicy::Require,
        ..SessionConfig::default()
    };
    let mut s = ServerSession::new(catalog, config);
    let mut clear = Vec::new();
    let mut inside = false;
    let mut feed = data.chunks(7);
    let mut n = 0u64;
    loop {
        while let Some(b) = s.take_output() {
            if !inside {
                clear.extend_from_slice(&b);
            }
        }
        if !inside && s.take_starttls() {
            check_clear(&clear);
            if s.tls_established().is_err() {
                return;
            }
            inside = true;
            continue;
        }
        let ran = ops::run_ops(&mut s, &mut n, 5, 64 * 512, &mut 0);
        if s.is_finished() {
            break;
        }
        if ran {
            continue;
        }
        if !s.wants_input() {
            assert!(s.in_flight() > 0, "the session stalled");
            continue;
        }
        match feed.next() {
            Some(c) => {
                if s.receive(c).is_err() {
                    break;
                }
            }
            None => s.end_of_input(),
        }
    }
    if !inside {
        check_clear(&clear);
        assert!(!s.transmitting(), "transmission without TLS");
    }
});
