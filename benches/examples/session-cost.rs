//! What the NBD protocol's state machine costs a 4 KiB request: a session in transmission
//! with structured replies (`tagstripe_nbd_proto::session::ServerSession`, no I/O) is fed
//! 32 requests at a time, as a server reads them from its socket (half 4 KiB writes with
//! their payloads, half 4 KiB reads), hands out their ops, is told each op's outcome and
//! gives back the replies. Prints the time a request; `benches/layer-instructions.sh` runs
//! this under callgrind and counts the instructions a request instead (the same from run to
//! run; the copies of the requests into the session's buffer and of the payloads included).
//!
//! `cargo run --release -p tagstripe-benches --example session-cost -- [COUNT] [copy]`
//! (COUNT requests, 1,000,000 by default, rounded up to a batch of 32). With `copy`, only
//! the batches' copies into a buffer, which a server's socket reads make (the kernel's
//! work there, not the session's): the script takes them off the session's count.

use std::sync::Arc;
use std::time::Instant;

use bytes::{BufMut, Bytes};
use tagstripe_nbd_proto::proto;
use tagstripe_nbd_proto::session::{
    Catalog, ExportEntry, OpKind, Outcome, ServerSession, SessionConfig,
};

/// Requests fed at a time (a client's queue depth).
const DEPTH: u64 = 32;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let count: u64 = args.next().map_or(Ok(1_000_000), |s| s.parse())?;
    let copy_only = match args.next().as_deref() {
        None => false,
        Some("copy") => true,
        Some(other) => return Err(format!("the second argument is `copy`, not {other:?}").into()),
    };
    let catalog = Arc::new(Catalog::new().with(ExportEntry::new("disk", 1 << 21)));
    let mut s = ServerSession::new(catalog, SessionConfig::default());
    // Fixed newstyle, no zeroes; structured replies (as libnbd, qemu and fio's nbd engine
    // ask), then GO "disk": in transmission.
    let mut hello = (proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES)
        .to_be_bytes()
        .to_vec();
    hello.extend(
        proto::OptionHeader {
            option: proto::OPT_STRUCTURED_REPLY,
            length: 0,
        }
        .encode(),
    );
    let go = proto::InfoRequest {
        name: "disk".to_owned(),
        requests: vec![],
    }
    .encode();
    hello.extend(
        proto::OptionHeader {
            option: proto::OPT_GO,
            length: u32::try_from(go.len())?,
        }
        .encode(),
    );
    hello.extend(go);
    s.receive(&hello)?;
    while s.take_output().is_some() {}
    if !s.transmitting() {
        return Err("the session did not reach transmission".into());
    }
    // One batch as the client sends it: a write's header and payload, a read's header...
    let mut batch = Vec::new();
    for i in 0..DEPTH {
        let write = i % 2 == 0;
        let command = if write {
            proto::Command::Write
        } else {
            proto::Command::Read
        };
        batch.extend(
            proto::Request {
                flags: 0,
                command,
                handle: i,
                offset: i * 4096,
                length: 4096,
            }
            .encode(),
        );
        if write {
            batch.extend([0x5Au8; 4096]);
        }
    }
    let data = Bytes::from(vec![0xA5u8; 4096]);
    let mut ops = Vec::with_capacity(DEPTH as usize);
    let t = Instant::now();
    let mut done = 0u64;
    if copy_only {
        let mut buf = bytes::BytesMut::with_capacity(batch.len());
        while done < count {
            buf.put_slice(&batch);
            std::hint::black_box(&buf);
            buf.clear();
            done += DEPTH;
        }
    }
    while done < count {
        // As a server's socket read lands in the session's input buffer.
        s.input_buffer().put_slice(&batch);
        s.process()?;
        ops.extend(std::iter::from_fn(|| s.poll_op()).map(|op| (op.id, op.kind)));
        for (id, kind) in ops.drain(..) {
            let outcome = if kind == OpKind::Read {
                Outcome::Data(data.clone())
            } else {
                Outcome::Done
            };
            s.complete(id, Ok(outcome));
            done += 1;
        }
        while let Some(out) = s.take_output() {
            std::hint::black_box(out);
        }
    }
    let took = t.elapsed();
    println!(
        "{done} requests, {:.1} ns a request",
        took.as_nanos() as f64 / done as f64
    );
    Ok(())
}
