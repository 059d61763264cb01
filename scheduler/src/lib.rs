//! A CAM-like tagged-command queue as a sans-IO state machine.
//!
//! This crate will hold, as deterministic state with time passed in and no async runtime:
//! `TagQueue` (tag openings, simple / ordered / head-of-queue tags, QUEUE FULL back-off and
//! ramp-up, I/O classes with fairness limits), swappable policies (FIFO, deadline, tagstripe's
//! own), and a deterministic disk model for the fairness simulation.
//!
//! It is filled in by the scheduler issue; until then it exports nothing.
#![forbid(unsafe_code)]
