//! NBD: export a volume to any NBD client ([`NbdServer`]), and use exports on other hosts
//! as devices ([`NbdDevice`]). The protocol is the NBD protocol (fixed newstyle, simple
//! replies), interoperating with qemu-nbd, qemu's client, nbdkit and the Linux driver.
//!
//! Feature `nbd`.

mod allow;
mod client;
pub mod proto;
mod server;
pub mod session;

pub use allow::{AllowList, Network};
pub use client::{ClientConfig, NbdDevice, NbdUrl};
pub use server::{NbdServer, ServerConfig, ServerCounters};
