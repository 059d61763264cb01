//! NBD: export a volume to any NBD client ([`NbdServer`]), and use exports on other hosts
//! as devices ([`NbdDevice`]). The protocol is the NBD protocol: the server speaks fixed
//! newstyle with structured replies, extended headers, metadata contexts and block status
//! (the `tagstripe-nbd-proto` crate's `session`, a state machine with no I/O, of which this
//! module is the tokio glue); the client speaks fixed newstyle with simple replies. Both interoperate with qemu-nbd, qemu's client, nbdkit, libnbd and the Linux
//! driver.
//!
//! Feature `nbd`.

mod allow;
mod client;
mod sendfile;
mod server;
mod splice;
#[cfg(feature = "tls")]
#[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
pub mod tls;

pub use allow::{AllowList, Network};
pub use client::{ClientConfig, NbdDevice, NbdUrl};
pub use server::{Export, NbdServer, ServerConfig, ServerCounters};
pub use tagstripe_nbd_proto::session::TlsPolicy;
