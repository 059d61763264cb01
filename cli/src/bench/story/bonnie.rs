//! The bonnie-style summary: block write, rewrite, block read and random seeks.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tagstripe::scheduler::IoClass;
use tagstripe::{BlockDevice, DynBlockDevice, IoOpts};

use super::{Progress, round, seq};
use crate::bench::load::{self, Load, Op, Outcome};

/// bonnie's figures.
#[derive(Clone, Debug, Serialize)]
pub(super) struct Bonnie {
    pub(super) block_write_mb_s: f64,
    pub(super) rewrite_mb_s: f64,
    pub(super) block_read_mb_s: f64,
    pub(super) random_seeks_per_s: f64,
}

/// Runs the four phases on `dev` (`total` sectors), 15 s each at most (2 with `quick`).
pub(super) async fn bonnie(
    dev: &Arc<dyn DynBlockDevice>,
    total: u64,
    quick: bool,
    progress: &Progress,
) -> Bonnie {
    let limit = Duration::from_secs(if quick { 2 } else { 15 });
    progress.step("bonnie: block write");
    let put = load::run(Arc::clone(dev), seq(Op::Write, 1 << 20, 1, total, limit)).await;
    progress.step("bonnie: rewrite");
    let rewrite = rewrite(dev, total, limit).await;
    progress.step("bonnie: block read");
    let get = load::run(Arc::clone(dev), seq(Op::Read, 1 << 20, 1, total, limit)).await;
    progress.step("bonnie: random seeks");
    let seeks = load::run(
        Arc::clone(dev),
        Load {
            op: Op::RandRead,
            bs: 8192,
            depth: 3,
            time: Duration::from_secs(if quick { 1 } else { 5 }),
            bytes: 0,
            region: (0, total),
            class: IoClass::BestEffort,
            think: Duration::ZERO,
            seed: 7,
        },
    )
    .await;
    Bonnie {
        block_write_mb_s: round(put.mb_s(), 2),
        rewrite_mb_s: round(rewrite.mb_s(), 2),
        block_read_mb_s: round(get.mb_s(), 2),
        random_seeks_per_s: round(seeks.iops(), 1),
    }
}

/// bonnie's rewrite: read a block, change it, write it back, sequentially.
async fn rewrite(dev: &Arc<dyn DynBlockDevice>, total: u64, limit: Duration) -> Outcome {
    let started = std::time::Instant::now();
    let mut out = Outcome::default();
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0;
    while at + 2048 <= total && started.elapsed() < limit {
        if dev.read_into(at, &mut buf, IoOpts::new()).await.is_err() {
            out.errors += 1;
        }
        buf[0] = buf[0].wrapping_add(1);
        match dev
            .write(at, bytes::Bytes::copy_from_slice(&buf), IoOpts::new())
            .await
        {
            Ok(()) => {
                out.ops += 1;
                out.bytes += 1 << 20;
            }
            Err(_) => out.errors += 1,
        }
        at += 2048;
    }
    out.elapsed = started.elapsed();
    out
}
