//! Plugging, as Linux's block layer does it (`blk_start_plug` / `blk_finish_plug`): while a
//! future wrapped in [`Plugged`] is polled, the io_uring backend puts its requests in the
//! ring's submission queue without entering the kernel, and the rings so filled are entered
//! once each when that poll returns. A task that starts many requests in one poll (an NBD
//! connection that has just read 32 requests) hands them over in one `io_uring_enter` per
//! device instead of one each: fewer system calls, and the device's worker woken once for
//! the batch.
//!
//! A plug never outlives the poll that made it, so nothing waits in a submission queue while
//! its task sleeps. Outside a plug (or with backends that have no queue of their own) every
//! request is submitted as it is made.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// Something holding requests back while a plug is in: entered once when it is pulled.
pub(crate) trait Unplug: Send + Sync {
    /// Hands what was held back to the kernel.
    fn unplug(&self);
}

#[derive(Default)]
struct PlugState {
    /// Nesting depth of the polls under a plug on this thread.
    depth: usize,
    /// Each target that held requests back under the plug, once.
    held: Vec<Arc<dyn Unplug>>,
}

thread_local! {
    static PLUG: RefCell<PlugState> = RefCell::new(PlugState::default());
}

/// True while a [`Plugged`] future is being polled on this thread: a request may then be held
/// back, provided its target is handed to [`hold`].
// Only the io_uring backend holds requests back.
#[cfg_attr(not(feature = "uring"), allow(dead_code))]
pub(crate) fn plugged_now() -> bool {
    PLUG.with(|p| p.borrow().depth > 0)
}

/// Notes that `target` holds requests back until the plug is pulled (once per target).
/// Outside a plug, `target` is unplugged at once.
// Only the io_uring backend holds requests back.
#[cfg_attr(not(feature = "uring"), allow(dead_code))]
pub(crate) fn hold(target: &Arc<dyn Unplug>) {
    let now = PLUG.with(|p| {
        let mut p = p.borrow_mut();
        if p.depth == 0 {
            return true;
        }
        if !p.held.iter().any(|h| Arc::ptr_eq(h, target)) {
            p.held.push(Arc::clone(target));
        }
        false
    });
    if now {
        target.unplug();
    }
}

/// Pulls the plug when dropped, also when the poll it guards unwinds.
struct Guard;

impl Guard {
    fn new() -> Self {
        PLUG.with(|p| p.borrow_mut().depth += 1);
        Guard
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let held = PLUG.with(|p| {
            let mut p = p.borrow_mut();
            p.depth -= 1;
            if p.depth == 0 {
                std::mem::take(&mut p.held)
            } else {
                Vec::new()
            }
        });
        // Entered outside the borrow: an unplug may take a lock, never the plug.
        for h in held {
            h.unplug();
        }
    }
}

/// A future whose every poll runs under a plug: the io_uring requests it starts in one poll
/// reach the kernel together, in one `io_uring_enter` per device, when the poll returns.
///
/// The future must be [`Unpin`]; pin others with [`Box::pin`].
///
/// ```
/// use bytes::Bytes;
/// use futures_util::future::join_all;
/// use tagstripe::{BlockDevice, IoOpts, MemDevice, Plugged};
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let dev = MemDevice::new("m", 4096);
/// // Eight writes started in one poll: with io_uring, one submission for the eight.
/// let writes = (0..8u64).map(|i| dev.write(i * 8, Bytes::from(vec![i as u8; 4096]), IoOpts::new()));
/// for r in Plugged::new(Box::pin(join_all(writes))).await {
///     r?;
/// }
/// assert_eq!(dev.read(8, 8, IoOpts::new()).await?, vec![1u8; 4096]);
/// # Ok::<(), tagstripe::Error>(())
/// # }).unwrap();
/// ```
#[derive(Debug)]
pub struct Plugged<F>(F);

impl<F: Future + Unpin> Plugged<F> {
    /// Wraps `future`: each of its polls runs under a plug.
    pub fn new(future: F) -> Self {
        Plugged(future)
    }
}

impl<F: Future + Unpin> Future for Plugged<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let _plug = Guard::new();
        Pin::new(&mut self.0).poll(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[derive(Default)]
    struct Counter(AtomicUsize);

    impl Unplug for Counter {
        fn unplug(&self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_target_held_under_a_plug_is_unplugged_once_when_the_poll_returns() {
        let c = Arc::new(Counter::default());
        let t: Arc<dyn Unplug> = c.clone();
        let fut = Box::pin(async {
            assert!(plugged_now());
            hold(&t);
            hold(&t);
            // Nested: the inner plug's end does not pull the outer one.
            Plugged::new(Box::pin(async { hold(&t) })).await;
            assert_eq!(c.0.load(Ordering::SeqCst), 0, "held until the poll returns");
        });
        futures_util::FutureExt::now_or_never(Plugged::new(fut)).unwrap();
        assert_eq!(c.0.load(Ordering::SeqCst), 1);
        assert!(!plugged_now());
        // Outside a plug: at once.
        hold(&t);
        assert_eq!(c.0.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_poll_that_returns_pending_pulls_its_plug_first() {
        let c = Arc::new(Counter::default());
        let t: Arc<dyn Unplug> = c.clone();
        let mut yielded = false;
        let fut = Box::pin(std::future::poll_fn(|cx| {
            hold(&t);
            if yielded {
                Poll::Ready(())
            } else {
                yielded = true;
                cx.waker().wake_by_ref();
                Poll::Pending
            }
        }));
        let mut p = Plugged::new(fut);
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut p).poll(&mut cx).is_pending());
        assert_eq!(c.0.load(Ordering::SeqCst), 1, "nothing held across a sleep");
        assert!(Pin::new(&mut p).poll(&mut cx).is_ready());
        assert_eq!(c.0.load(Ordering::SeqCst), 2);
    }
}
