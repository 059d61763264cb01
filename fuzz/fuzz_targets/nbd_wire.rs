//! The NBD wire parsers: every message tagstripe reads from a peer. No input may panic,
//! and whatever parses re-encodes to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tagstripe_nbd_proto::proto::{
    Chunk, ChunkHeader, ExportInfo, ExportNameReply, ExtendedRequest, Hello, InfoRequest,
    MetaContextRequest, OptionHeader, OptionReply, Request, SimpleReply, meta_context,
    parse_meta_context, parse_server_entry, server_entry,
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
    if let Ok(h) = Hello::parse(data) {
        assert_eq!(&h.encode()[..], &data[..Hello::LEN]);
    }
    if let Ok(r) = ExportNameReply::parse(data) {
        assert_eq!(&r.encode(true)[..], &data[..ExportNameReply::LEN]);
    }
    if let Ok((name, details)) = parse_server_entry(data) {
        if details.is_empty() {
            assert_eq!(server_entry(&name), data);
        }
    }
    if let Ok(r) = ExtendedRequest::parse(data) {
        assert_eq!(&r.encode()[..], &data[..ExtendedRequest::LEN]);
    }
    if let Ok((h, ext)) = ChunkHeader::parse(data) {
        let mut b = Vec::new();
        h.encode_into(ext, &mut b);
        assert_eq!(&b[..], &data[..b.len()]);
    }
    if let Ok(q) = MetaContextRequest::parse(data) {
        assert_eq!(q.encode(), data);
    }
    if let Ok((id, name)) = parse_meta_context(data) {
        assert_eq!(meta_context(id, &name), data);
    }
    // Chunk payloads: the first two bytes pick the type, the third the header form.
    if data.len() >= 3 {
        let kind = u16::from_be_bytes([data[0], data[1]]);
        let ext = data[2] & 1 == 1;
        if let Ok(c) = Chunk::parse(kind, ext, &data[3..]) {
            if !matches!(c, Chunk::OffsetData { .. }) {
                assert_eq!(c.kind(ext), kind);
                let again = Chunk::parse(kind, ext, &c.encode(ext)).unwrap();
                assert_eq!(again, c);
            }
        }
    }
    let mut info = ExportInfo::default();
    if info.absorb(data).is_ok() {
        if let Some((min, pref, max)) = info.block_sizes {
            assert!(min.is_power_of_two() && pref >= min && max >= min);
        }
    }
});
