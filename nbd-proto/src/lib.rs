//! The NBD protocol with no I/O, in the manner of quinn-proto and rustls: the wire format
//! ([`proto`]) and the two sides of a connection as state machines fed bytes and yielding
//! bytes ([`session`] for a server, [`client_session`] for a client). No runtime, no
//! sockets, no clock: the caller moves the bytes and runs the requests, so the same logic
//! serves a tokio server, a test that feeds it by hand, and a fuzzer.
//!
//! What it speaks: fixed-newstyle negotiation (`INFO`, `GO`, `LIST`, `STARTTLS`,
//! structured replies, extended headers, metadata contexts), every transmission command,
//! and simple, structured or extended replies, as the NBD protocol document describes them.
//! The `tagstripe` library's `nbd` module is the runtime glue around these sessions.
//!
//! ```
//! use tagstripe_nbd_proto::proto::{Request, Command};
//! let r = Request { flags: 0, command: Command::Read, handle: 1, offset: 4096, length: 512 };
//! assert_eq!(Request::parse(&r.encode()).unwrap(), r);
//! ```

pub mod client_session;
pub mod proto;
pub mod session;
