//! A request's clock readings, shared by the layers it passes through.
//!
//! A [`Volume`](crate::Volume) reads the clock when a request is issued, to time it; the
//! tagged queues below take that reading as the request's submit time, and the volume takes
//! the last of their completion readings as the request's end, instead of each layer
//! reading the clock for itself (four readings a request become two; a reading costs about
//! 25 ns on a VM's TSC).
//!
//! The readings travel beside the request's future, not in it: while the volume polls its
//! request ([`Times::poll`]), the thread's current request times are that request's, so
//! the queues reached in that poll find them ([`issued`], [`completed`]). Outside such a
//! poll there are none, and every layer reads the clock itself.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::time::Instant;

thread_local! {
    /// The times of the request being polled on this thread, if a volume polls one.
    static CURRENT: Cell<Option<Times>> = const { Cell::new(None) };
}

/// One request's clock readings: when it was issued, and the latest completion a tagged
/// queue below read for its commands.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Times {
    issued: Instant,
    done: Option<Instant>,
}

impl Times {
    /// A request issued at `issued` (the clock as its caller read it).
    pub(crate) fn new(issued: Instant) -> Self {
        Self { issued, done: None }
    }

    /// When the request was issued.
    pub(crate) fn issued(&self) -> Instant {
        self.issued
    }

    /// When it ended: the latest completion a queue below read for it, else the clock now.
    pub(crate) fn ended(&self) -> Instant {
        self.done.unwrap_or_else(Instant::now)
    }

    /// Polls `fut`, the request's future, with these as the thread's current request
    /// times (the times the poll was entered with are restored after it, also if it
    /// panics), and keeps the completions the queues reached in it noted.
    pub(crate) fn poll<F: Future>(
        &mut self,
        fut: Pin<&mut F>,
        cx: &mut Context<'_>,
    ) -> Poll<F::Output> {
        /// Restores the outer times as the poll ends (returning or unwinding).
        struct Restore<'a> {
            outer: Option<Times>,
            times: &'a mut Times,
        }
        impl Drop for Restore<'_> {
            fn drop(&mut self) {
                if let Some(t) = CURRENT.replace(self.outer) {
                    *self.times = t;
                }
            }
        }
        let outer = CURRENT.replace(Some(*self));
        let _restore = Restore { outer, times: self };
        fut.poll(cx)
    }
}

/// When the request being polled was issued, if a volume above read the clock for it.
pub(crate) fn issued() -> Option<Instant> {
    CURRENT.get().map(|t| t.issued)
}

/// Notes that one of the polled request's commands completed at `at` (as a queue read the
/// clock for it); nothing outside a volume's request.
pub(crate) fn completed(at: Instant) {
    if let Some(mut t) = CURRENT.get() {
        t.done = Some(t.done.map_or(at, |d| d.max(at)));
        CURRENT.set(Some(t));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Polls `f` once (it must be ready) as a request issued at `times`.
    fn poll_once<F: Future>(times: &mut Times, f: F) -> F::Output {
        let mut f = std::pin::pin!(f);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match times.poll(f.as_mut(), &mut cx) {
            Poll::Ready(v) => v,
            Poll::Pending => panic!("not ready"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_queues_see_the_issue_time_and_the_volume_their_last_completion() {
        let t0 = Instant::now();
        assert_eq!(issued(), None, "no request outside a poll");
        completed(t0); // nowhere to note it: ignored
        let mut times = Times::new(t0);
        let seen = poll_once(&mut times, async {
            let seen = issued();
            completed(t0 + Duration::from_millis(3));
            completed(t0 + Duration::from_millis(1));
            seen
        });
        assert_eq!(seen, Some(t0));
        assert_eq!(times.ended(), t0 + Duration::from_millis(3), "the latest");
        assert_eq!(issued(), None, "nothing left behind after the poll");
        // Without a completion noted, the end is the clock.
        tokio::time::advance(Duration::from_millis(7)).await;
        assert_eq!(Times::new(t0).ended(), t0 + Duration::from_millis(7));
    }

    #[test]
    fn a_nested_request_has_its_own_times_and_the_outer_ones_come_back() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_millis(10);
        let mut outer = Times::new(t0);
        let mut inner = Times::new(t1);
        let seen = poll_once(&mut outer, async {
            let nested = poll_once(&mut inner, async {
                completed(t1 + Duration::from_millis(1));
                issued()
            });
            (nested, issued())
        });
        assert_eq!(seen, (Some(t1), Some(t0)));
        assert_eq!(inner.done, Some(t1 + Duration::from_millis(1)));
        assert_eq!(
            outer.done, None,
            "the inner request's completion is its own"
        );
    }

    #[test]
    fn a_panicking_poll_leaves_nothing_behind() {
        let mut times = Times::new(Instant::now());
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            poll_once(&mut times, async { panic!("in the request") })
        }));
        assert!(r.is_err());
        assert_eq!(issued(), None);
    }
}
