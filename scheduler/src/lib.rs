//! A CAM-like tagged-command queue as a sans-IO state machine, its dispatch policies, and a
//! deterministic disk model to measure them.
//!
//! Nothing here does I/O, reads a clock or spawns a task: every call takes `now` in
//! nanoseconds, randomness comes from a seed, and the same inputs give the same outputs bit
//! for bit. The async layer in the `tagstripe` crate drives a [`TagQueue`] on tokio; the
//! fairness simulation ([`sim`]) drives it against a [`DiskModel`] on a virtual clock.
//!
//! ```text
//!            submit(now, req, meta)                    handle_completion(now, tag, outcome)
//!  caller ─────────────────────────► TagQueue ◄─────────────────────────────────── device
//!                                   │  per-class host queues, epochs for ordered tags,
//!                                   │  openings (QUEUE FULL back-off, ramp-up), BUSY
//!                                   │  Policy::choose(View) → class, ordered?
//!                                   └──► poll_dispatch(now) → Dispatch { tag, kind, req } ──►
//! ```
//!
//! [`TagQueue::submit_now`] is `submit` and the `poll_dispatch` after it in one call for the
//! common case, a request with nothing waiting before it: the same decision, and the
//! request never passes through the host queue.
//!
//! The story it answers (FreeBSD, 1999): a disk with 64 tags ran a bonnie write and logins on
//! another terminal waited 10-15 s, because a drive that reorders by head position never
//! picks a far-away read while near-by writes keep coming, until da(4)'s ordered tag every
//! 15 s forces it. [`Fair`] bounds bulk's share of the tag window while interactive I/O is
//! active, keeps tags for interactive requests, and sends a barrier after an interactive
//! command has waited too long at the device.
#![forbid(unsafe_code)]

mod disk;
mod error;
mod policy;
mod queue;
mod rng;
pub mod sim;
mod tenant;
mod types;

pub use disk::{
    CacheMode, DeviceOrder, DiskCommand, DiskConfig, DiskEvent, DiskModel, DiskOp, Profile,
    SsdConfig,
};
pub use error::Error;
pub use policy::{
    Choice, Deadline, Fair, FairConfig, Fifo, Head, PeriodicOrdered, Policy, Release, Shape,
    ShapeKey, View,
};
pub use queue::{QueueConfig, TagQueue};
pub use rng::Rng;
pub use tenant::{
    Idle, TenantCounters, TenantDispatch, TenantError, TenantId, TenantScheduler, TenantSpec,
    weight_cost,
};
pub use types::{
    Dir, Dispatch, Event, IoClass, Meta, Nanos, Outcome, Refusal, SubmitError, Submitted, Tag,
    TagKind, Ticket,
};
