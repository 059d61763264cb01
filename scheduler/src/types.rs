//! The vocabulary of the tagged queue: classes, tag kinds, requests' metadata, outcomes and
//! events.

/// Nanoseconds on the caller's clock. The queue never reads a clock: every call takes `now`.
pub type Nanos = u64;

/// I/O classes, highest priority first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IoClass {
    /// Someone is waiting: a login, a page fault, a query.
    Interactive,
    /// The default class.
    #[default]
    BestEffort,
    /// Throughput work: backups, copies, a bonnie write.
    Bulk,
    /// Only when nothing else wants the device.
    Idle,
}

impl IoClass {
    /// Every class, highest priority first.
    pub const ALL: [IoClass; 4] = [
        IoClass::Interactive,
        IoClass::BestEffort,
        IoClass::Bulk,
        IoClass::Idle,
    ];

    /// Index into per-class arrays (0 = interactive).
    #[must_use]
    pub fn index(self) -> usize {
        self as usize
    }

    /// `"interactive"`, `"best-effort"`, `"bulk"` or `"idle"`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Interactive => "interactive",
            Self::BestEffort => "best-effort",
            Self::Bulk => "bulk",
            Self::Idle => "idle",
        }
    }
}

/// SCSI task attributes (SAM): how a command may be reordered by the device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum TagKind {
    /// May be reordered freely.
    #[default]
    Simple,
    /// A barrier both ways: runs after every earlier command and before every later one.
    /// Flushes are ordered.
    Ordered,
    /// Runs next, ahead of queued simple commands.
    HeadOfQueue,
}

/// Whether a request reads or writes (policies such as deadline treat them differently).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Dir {
    /// A read.
    #[default]
    Read,
    /// A write (or anything that changes the device: discard, flush).
    Write,
}

/// What the queue needs to know about a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Meta {
    /// Its class.
    pub class: IoClass,
    /// Its tag kind.
    pub kind: TagKind,
    /// Read or write.
    pub dir: Dir,
    /// Its size in sectors (0 if unknown or none, as for a flush). Policies that budget
    /// bytes at the device read it.
    pub sectors: u64,
}

impl Meta {
    /// A simple-tagged request of `class`.
    ///
    /// ```
    /// use tagstripe_scheduler::{Dir, IoClass, Meta, TagKind};
    /// let m = Meta::new(IoClass::Bulk, Dir::Write);
    /// assert_eq!(m.kind, TagKind::Simple);
    /// ```
    #[must_use]
    pub fn new(class: IoClass, dir: Dir) -> Self {
        Self {
            class,
            kind: TagKind::Simple,
            dir,
            sectors: 0,
        }
    }

    /// A flush: an ordered write.
    #[must_use]
    pub fn flush(class: IoClass) -> Self {
        Self {
            class,
            kind: TagKind::Ordered,
            dir: Dir::Write,
            sectors: 0,
        }
    }

    /// The same with its size in sectors.
    ///
    /// ```
    /// use tagstripe_scheduler::{Dir, IoClass, Meta};
    /// let m = Meta::new(IoClass::Bulk, Dir::Write).with_sectors(2048);
    /// assert_eq!(m.sectors, 2048);
    /// ```
    #[must_use]
    pub fn with_sectors(mut self, sectors: u64) -> Self {
        self.sectors = sectors;
        self
    }

    /// The same with another tag kind.
    #[must_use]
    pub fn with_kind(mut self, kind: TagKind) -> Self {
        self.kind = kind;
        self
    }
}

/// The device tag a dispatched request holds (0 .. max_tags).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tag(pub u32);

/// Identifies a submitted request for its whole life (assigned in submission order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ticket(pub u64);

/// How the device answered a dispatched command.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome<R> {
    /// Completed successfully.
    Done,
    /// Failed for good: reported as [`Event::Failed`].
    Failed,
    /// QUEUE FULL (TASK SET FULL): the device has fewer slots than the openings; the request
    /// is handed back and retried, and the openings shrink.
    QueueFull(R),
    /// BUSY: the device cannot take commands now; the request is handed back and retried
    /// after the next completion or a delay.
    Busy(R),
}

/// A request leaving the queue for the device.
#[derive(Debug, PartialEq, Eq)]
pub struct Dispatch<R> {
    /// The device tag it holds until [`crate::TagQueue::handle_completion`].
    pub tag: Tag,
    /// Its ticket.
    pub ticket: Ticket,
    /// The tag kind to send (the policy may have made a simple request ordered).
    pub kind: TagKind,
    /// Its metadata as submitted.
    pub meta: Meta,
    /// The request.
    pub req: R,
}

/// What [`crate::TagQueue::submit_now`] did with a request.
#[derive(Debug)]
pub enum Submitted<R> {
    /// Sent to the device at once.
    Dispatched(Dispatch<R>),
    /// Waiting in the host queue under this ticket.
    Queued(Ticket),
}

/// Something the caller may want to know; drained with [`crate::TagQueue::poll_event`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A request completed.
    Completed {
        /// Which.
        ticket: Ticket,
        /// Submission to completion.
        latency: Nanos,
    },
    /// A request failed.
    Failed {
        /// Which.
        ticket: Ticket,
    },
    /// The openings changed (QUEUE FULL, ramp-up, or set at run time).
    Openings {
        /// The new value.
        openings: u32,
    },
    /// A request was made ordered to stop starvation of an older interactive request.
    Barrier {
        /// The request that carries the ordered tag.
        ticket: Ticket,
    },
    /// The policy changed how it shapes bulk I/O (see [`crate::Shape`]): its budget, its
    /// piece size, or whether it drains ahead of a regular reader.
    Shaped(crate::Shape),
}

/// Why a submit was refused; the request is given back.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("request refused: {reason}")]
pub struct SubmitError<R> {
    /// Why.
    pub reason: Refusal,
    /// The request, untouched.
    pub req: R,
}

impl<R> SubmitError<R> {
    /// Takes the request back.
    pub fn into_inner(self) -> R {
        self.req
    }
}

/// Why a submit was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// The host queue holds its configured maximum of pending requests.
    #[error("the host queue is full ({max} pending)")]
    Full {
        /// The limit.
        max: usize,
    },
    /// The queue was closed.
    #[error("the queue is closed")]
    Closed,
}
