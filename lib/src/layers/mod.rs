//! Layers: each wraps devices and is a device itself.

mod component;
pub(crate) mod mirror;
mod queue;
mod raid;
mod split;
mod striped;
mod tenants;

pub(crate) use component::Component;
pub(crate) use queue::queues_for;
pub use queue::{Queue, QueueHandle};
pub use raid::{Raid, read_md_superblock};
pub use split::Split;
pub use striped::Striped;
pub use tenants::{Tenant, TenantError, TenantSpec, TenantStats, Tenants};
