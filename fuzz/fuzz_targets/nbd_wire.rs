//! The NBD wire parsers: every message tagstripe reads from a peer. No input may panic,
//! and whatever parses re-encodes to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tagstripe::nbd::proto::{
    ExportInfo, InfoRequest, OptionHeader, OptionReply, Request, SimpleReply,
};

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = Request::parse(data) {
        assert_eq!(&r.encode()[..], &data[..Request::LEN]);
    }
    if let Ok(r) = SimpleReply::parse(data) {
        assert_eq!(&r.encode()[..], &data[..SimpleReply::LEN]);
    }
    if let Ok(h) = OptionHeader::parse(data) {
        assert_eq!(&h.encode()[..], &data[..OptionHeader::LEN]);
    }
    if let Ok(h) = OptionReply::parse(data) {
        // The header re-encodes to the same magic, option and reply type (the length
        // field is the data's own length).
        let enc = OptionReply::encode(h.option, h.reply, &[]);
        assert_eq!(&enc[..16], &data[..16]);
    }
    if let Ok(q) = InfoRequest::parse(data) {
        assert_eq!(q.encode(), data);
    }
    let mut info = ExportInfo::default();
    if info.absorb(data).is_ok() {
        if let Some((min, pref, max)) = info.block_sizes {
            assert!(min.is_power_of_two() && pref >= min && max >= min);
        }
    }
});
