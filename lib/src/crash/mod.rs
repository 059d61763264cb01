//! The crash lab: record what a device's clients write ([`Recorder`]),
//! then check every state a power cut could have left on it.
//!
//! - [`log`](CrashLog): the append-only, checksummed record of writes, write-zeroes, trims
//!   and flushes, with their data and flags, in submission and completion order
//!   (dm-log-writes' idea, in user space, under any device tagstripe can open);
//! - [`Timeline`] and [`CrashState`]: which writes are on the disk at a crash, by the
//!   rules of flush and FUA, in three modes: [`Mode::Prefix`] (dm-log-writes),
//!   [`Mode::Subset`] (CrashMonkey), [`Mode::Torn`] (LazyFS); pure and deterministic, each
//!   state named by a [`StateId`] that rebuilds it;
//! - [`Images`]: the states as image files a check (fsck, a database's recovery) reads and
//!   modifies, moved from state to state without copying the volume each time.
//!
//! A check over every state of a recorded flush:
//!
//! ```
//! use bytes::Bytes;
//! use tagstripe::crash::{CrashLog, Images, Mode, Tail, Timeline};
//! use tagstripe::{BlockDevice, IoOpts, MemDevice, Recorder};
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let dir = std::env::temp_dir().join(format!("ts-doc-crash-{}", std::process::id()));
//! std::fs::create_dir_all(&dir)?;
//! let rec = Recorder::create(dir.join("log"))?;
//! let dev = rec.record(MemDevice::new("m", 64)).await?;
//! dev.write(8, Bytes::from(vec![1u8; 512]), IoOpts::new()).await?; // the body
//! dev.flush(IoOpts::new()).await?;
//! dev.write(0, Bytes::from(vec![9u8; 512]), IoOpts::new()).await?; // the header
//! dev.flush(IoOpts::new()).await?;
//! rec.finish().await?;
//!
//! let log = CrashLog::open(dir.join("log"), Tail::Strict)?;
//! let t = Timeline::new(&log);
//! let mut images = Images::new(&log, dir.join("work"), &[])?;
//! for state in t.states(Mode::Subset, 200, 1) {
//!     images.materialize(&log, &t, &state)?;
//!     let img = std::fs::read(&images.paths()[0])?;
//!     // Whenever the header is there, so is the body it points at.
//!     assert!(img[0] != 9 || img[8 * 512] == 1, "state {}", state.id);
//! }
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

mod image;
mod log;
mod record;
mod states;

pub use image::Images;
pub use log::{CrashLog, LogDevice, LogEvent, LogOp, LogSummary, Submit, Tail};
pub use record::{Recorded, Recorder};
pub use states::{
    BaseCursor, BaseRule, CrashState, Mode, Overlay, Source, StateId, Timeline, Write,
};
