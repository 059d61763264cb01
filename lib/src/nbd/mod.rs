//! NBD: export a volume to any NBD client ([`NbdServer`]), and use exports on other hosts
//! as devices ([`NbdDevice`]). The protocol is the NBD protocol: the server speaks fixed
//! newstyle with structured replies, extended headers, metadata contexts and block status
//! ([`session`], a state machine with no I/O); the client speaks fixed newstyle with simple
//! replies. Both interoperate with qemu-nbd, qemu's client, nbdkit, libnbd and the Linux
//! driver.
//!
//! Feature `nbd`.

mod allow;
mod client;
pub mod client_session;
pub mod proto;
mod server;
pub mod session;
#[cfg(feature = "tls")]
#[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
pub mod tls;

pub use allow::{AllowList, Network};
pub use client::{ClientConfig, NbdDevice, NbdUrl};
pub use server::{NbdServer, ServerConfig, ServerCounters};
pub use session::TlsPolicy;
