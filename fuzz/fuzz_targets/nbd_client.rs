//! The client's negotiation and reply decoding (sans-IO) fed arbitrary server bytes in
//! arbitrary pieces: they must never panic, and every reply decoded must be to a handle in
//! flight with data only on success, of the length its request asked.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tagstripe_nbd_proto::client_session::{ClientHandshake, Expect, ReplyDecoder, Status};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, data)) = data.split_first() else {
        return;
    };
    let mut h = ClientHandshake::new("x", mode & 1 == 1).with_allocation(mode & 2 == 2);
    let piece = usize::from(mode >> 2) % 31 + 1;
    let mut rest = data;
    let mut ready = false;
    while !rest.is_empty() {
        let (now, later) = rest.split_at(piece.min(rest.len()));
        rest = later;
        let _ = h.take_output();
        match h.receive(now) {
            Ok(Status::NeedInput) => {}
            Ok(Status::StartTls) => h.tls_established(),
            Ok(Status::Ready(info)) => {
                if let Some((min, pref, max)) = info.block_sizes {
                    assert!(min.is_power_of_two() && pref >= min && max >= min);
                }
                ready = true;
                break;
            }
            Err(_) => return,
        }
    }
    if !ready {
        return;
    }
    // Handles 1-8 are in flight: odd ones are reads of handle * 512 bytes at handle * 4096.
    let left = h.take_leftover();
    let mut dec = if h.structured() {
        ReplyDecoder::structured(left)
    } else {
        ReplyDecoder::new(left)
    };
    let len = |handle: u64| {
        (1..=8).contains(&handle).then(|| Expect {
            read_len: if handle % 2 == 1 { handle as usize * 512 } else { 0 },
            offset: handle * 4096,
        })
    };
    for chunk in rest.chunks(piece) {
        dec.input_buffer().extend_from_slice(chunk);
        loop {
            match dec.next(len) {
                Ok(Some(r)) => {
                    let want = len(r.handle).expect("decoded a reply to a handle not in flight");
                    assert_eq!(r.data.len(), if r.error == 0 { want.read_len } else { 0 });
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
});
