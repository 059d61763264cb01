//! The live fairness story: an interactive reader alone, then beside a bulk writer with
//! fairness off (no queue) and on, and the goals it is held to; `bench fairness` live.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use crate::layout::LayoutArgs;
use serde::Serialize;
use tagstripe::scheduler::IoClass;
use tagstripe::{BlockDevice, DynBlockDevice, IoOpts};

use super::{Progress, TempFiles, Watched, build, round, runtime, temp_components};
use crate::bench::load::{self, Load, Op, Outcome};
use crate::components;

/// One run of the live story.
#[derive(Clone, Debug, Serialize)]
pub(super) struct LiveRun {
    /// "reader alone", "fairness off (no queue)" or "fairness on (tagstripe)".
    pub(super) run: &'static str,
    pub(super) interactive: Interactive,
    /// Bulk's throughput (0 when there is no bulk writer).
    pub(super) bulk_mb_s: f64,
    /// How the queues shaped bulk (with fairness on).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) bulk_shaping: Option<Shaping>,
}

/// The interactive reader's latency.
#[derive(Clone, Debug, Serialize)]
pub(super) struct Interactive {
    pub(super) p50_ms: f64,
    pub(super) p99_ms: f64,
    pub(super) max_ms: f64,
    pub(super) reads: u64,
    /// The p99 of each slice, in the order they ran: how much the disk drifted.
    pub(super) slice_p99_ms: Vec<f64>,
}

/// The live story on a volume over `comps` (interleave, layout): an interactive 4 KiB
/// reader alone, then with a bulk writer of 16 × 1 MiB, fairness off (no queue) and on,
/// `secs` each. Prints a table if `text`; returns the runs and the goals.
///
/// Each run is measured in slices of about a second, the three runs' slices interleaved
/// (each round in another of the six orders, so that no run always follows the same one),
/// and each run's figures are those of all its slices together. A shared machine's disk
/// drifts: measured one after the other, the reader alone and the reader beside bulk would
/// compare two states of the disk, not two policies. A slice with bulk ends with a flush
/// (not timed), so the next slice does not inherit its write-back. Each run keeps its own
/// volume across its slices, so the controller goes on from where it was.
pub(super) async fn live_fairness(
    comps: &[Arc<dyn DynBlockDevice>],
    (interleave, layout): (u64, &LayoutArgs),
    secs: Duration,
    text: bool,
    progress: &Progress,
    watched: Option<&Watched>,
) -> Result<(Vec<LiveRun>, Goals), String> {
    let slices = slices_of(secs);
    let slice = secs / slices;
    if text {
        outln!(
            "\nlive on this volume: a bulk writer (1 MiB, 16 in flight) and an interactive reader (4 KiB random, one at a time, 1 ms apart), {secs:?} each, in {slices} interleaved slices"
        );
        outln!(
            "{:<26} {:>10} {:>10} {:>10} {:>10}",
            "run",
            "p50 ms",
            "p99 ms",
            "max ms",
            "bulk MB/s"
        );
    }
    const RUNS: [(&str, bool, bool); 3] = [
        ("reader alone", true, false),
        ("fairness off (no queue)", false, true),
        ("fairness on (tagstripe)", true, true),
    ];
    let mut volumes = Vec::with_capacity(RUNS.len());
    for &(_, queue, _) in &RUNS {
        volumes.push(Arc::new(build(comps.to_vec(), interleave, layout, queue)?));
    }
    let mut reads = vec![Outcome::default(); RUNS.len()];
    let mut writes = vec![Outcome::default(); RUNS.len()];
    let mut slice_p99: Vec<Vec<f64>> = vec![Vec::new(); RUNS.len()];
    let mut shaping = ShapeSamples::default();
    // Every order of the three runs, one a round.
    const ORDERS: [[usize; 3]; 6] = [
        [0, 1, 2],
        [1, 2, 0],
        [2, 0, 1],
        [0, 2, 1],
        [2, 1, 0],
        [1, 0, 2],
    ];
    for n in 0..slices {
        for r in ORDERS[n as usize % ORDERS.len()] {
            let (label, queue, with_bulk) = RUNS[r];
            if n == 0 {
                progress.step(&format!("fairness: {label}"));
            }
            let v = &volumes[r];
            if let Some(Ok(mut w)) = watched.map(|w| w.lock()) {
                *w = v.component_stats().to_vec();
            }
            let total = v.info().sectors;
            let trace = (queue && with_bulk).then(|| ShapeTrace::start(v.queues()));
            let dev: Arc<dyn DynBlockDevice> = v.clone();
            let seed = u64::from(n) << 8;
            let reader = Load {
                op: Op::RandRead,
                bs: 4096,
                depth: 1,
                time: slice,
                bytes: 0,
                region: (0, total),
                class: IoClass::Interactive,
                think: Duration::from_millis(1),
                seed: 3 ^ seed,
            };
            let bulk = Load {
                op: Op::Write,
                bs: BULK_REQUEST_KIB * 1024,
                depth: 16,
                time: slice,
                bytes: 0,
                region: (0, total),
                class: IoClass::Bulk,
                think: Duration::ZERO,
                seed: 4 ^ seed,
            };
            let (i, b) = if with_bulk {
                tokio::join!(
                    load::run(Arc::clone(&dev), reader),
                    load::run(Arc::clone(&dev), bulk)
                )
            } else {
                (
                    load::run(Arc::clone(&dev), reader).await,
                    Outcome::default(),
                )
            };
            if let Some(t) = trace {
                shaping.add(t.finish().await);
            }
            if with_bulk {
                dev.flush(IoOpts::new())
                    .await
                    .map_err(|e| format!("flush after {label}: {e}"))?;
            }
            slice_p99[r].push(round(i.lat_us(0.99) / 1e3, 2));
            reads[r].add(i);
            writes[r].add(b);
        }
    }
    let mut live = Vec::new();
    // Reader p99 (ms) and bulk MB/s of each run, for the goals.
    let mut figures = Vec::new();
    let mut shaping = Some(shaping);
    for (r, &(label, queue, with_bulk)) in RUNS.iter().enumerate() {
        let (i, b) = (&mut reads[r], &writes[r]);
        i.lat.sort_unstable();
        let ms = |p| round(i.lat_us(p) / 1e3, 2);
        let run = LiveRun {
            run: label,
            interactive: Interactive {
                p50_ms: ms(0.5),
                p99_ms: ms(0.99),
                max_ms: ms(1.0),
                reads: i.ops,
                slice_p99_ms: std::mem::take(&mut slice_p99[r]),
            },
            bulk_mb_s: if with_bulk { round(b.mb_s(), 2) } else { 0.0 },
            bulk_shaping: if queue && with_bulk {
                shaping.take().map(ShapeSamples::summary)
            } else {
                None
            },
        };
        if text {
            let bulk_mb = if with_bulk {
                format!("{:.1}", b.mb_s())
            } else {
                "-".to_owned()
            };
            outln!(
                "{:<26} {:>10.2} {:>10.2} {:>10.2} {:>10}",
                label,
                run.interactive.p50_ms,
                run.interactive.p99_ms,
                run.interactive.max_ms,
                bulk_mb
            );
            if let Some(s) = &run.bulk_shaping {
                outln!("{:<26} {}", "  bulk shaping", s.line());
            }
        }
        figures.push((i.lat_us(0.99) / 1e3, b.mb_s()));
        live.push(run);
    }
    let goals = Goals::of(&figures);
    if text {
        if slices > 1 {
            let spread: Vec<String> = live
                .iter()
                .map(|r| {
                    let v = &r.interactive.slice_p99_ms;
                    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
                    let hi = v.iter().copied().fold(0.0, f64::max);
                    format!("{} {lo:.2}-{hi:.2}", r.run)
                })
                .collect();
            outln!("reader p99 by slice, ms: {}", spread.join(", "));
        }
        outln!("{}", goals.line());
    }
    Ok((live, goals))
}

/// How many interleaved slices a live run of `secs` is measured in: one a second, at least
/// one, at most 60.
pub(super) fn slices_of(secs: Duration) -> u32 {
    // A float's `as` cast saturates (and NaN gives 0), so this cannot wrap.
    (secs.as_secs_f64().round() as u32).clamp(1, 60)
}

/// The live story's goals: with fairness on, the reader's p99 at most 4x the reader alone,
/// and bulk at least 0.75x of fairness off.
#[derive(Clone, Debug, Serialize)]
pub(super) struct Goals {
    p99_ratio: f64,
    p99_ratio_max: f64,
    bulk_ratio: f64,
    bulk_ratio_min: f64,
    met: bool,
}

impl Goals {
    const P99_MAX: f64 = 4.0;
    const BULK_MIN: f64 = 0.75;

    /// From (reader p99 ms, bulk MB/s) of the runs: alone, off, on.
    fn of(runs: &[(f64, f64)]) -> Self {
        let (alone, off, on) = match runs {
            [a, b, c] => (*a, *b, *c),
            _ => ((0.0, 0.0), (0.0, 0.0), (0.0, 0.0)),
        };
        let p99_ratio = on.0 / alone.0.max(1e-6);
        let bulk_ratio = on.1 / off.1.max(1e-6);
        Self {
            p99_ratio: round(p99_ratio, 2),
            p99_ratio_max: Self::P99_MAX,
            bulk_ratio: round(bulk_ratio, 3),
            bulk_ratio_min: Self::BULK_MIN,
            met: p99_ratio <= Self::P99_MAX && bulk_ratio >= Self::BULK_MIN,
        }
    }

    fn line(&self) -> String {
        format!(
            "fairness on: reader p99 {:.1}x alone (goal <= {}x), bulk {:.2}x of fairness off (goal >= {}x): {}",
            self.p99_ratio,
            self.p99_ratio_max,
            self.bulk_ratio,
            self.bulk_ratio_min,
            if self.met { "met" } else { "NOT met" }
        )
    }
}

/// How the queues shaped bulk during a live run: samples of bulk's depth at each queue
/// (commands at the device; components on one device share a queue), its piece size and
/// budget, every 2 ms, whether it drained ahead of a regular reader then (and to what
/// floor), and the controller's changes (the queues' `Shaped` events).
struct ShapeTrace {
    stop: Arc<tokio::sync::Notify>,
    task: tokio::task::JoinHandle<ShapeSamples>,
}

#[derive(Default)]
struct ShapeSamples {
    depth: Vec<u64>,
    piece_kib: Vec<u64>,
    budget_kib: Vec<u64>,
    target_us: Vec<u64>,
    drain_floor_kib: Vec<u64>,
    changes: u64,
}

impl ShapeTrace {
    fn start(queues: &[tagstripe::QueueHandle]) -> Self {
        // One sample per queue, however many components share it.
        let mut distinct: Vec<tagstripe::QueueHandle> = Vec::new();
        for q in queues {
            if !distinct.iter().any(|d| d.same_queue(q)) {
                distinct.push(q.clone());
            }
        }
        let queues = distinct;
        let stop = Arc::new(tokio::sync::Notify::new());
        let stopped = Arc::clone(&stop);
        let task = tokio::spawn(async move {
            let mut out = ShapeSamples::default();
            let mut events: Vec<_> = queues.iter().map(|q| q.subscribe()).collect();
            let mut tick = tokio::time::interval(Duration::from_millis(2));
            loop {
                tokio::select! {
                    _ = stopped.notified() => break,
                    _ = tick.tick() => {}
                }
                for (q, rx) in queues.iter().zip(events.iter_mut()) {
                    while let Ok(e) = rx.try_recv() {
                        if matches!(e, tagstripe::scheduler::Event::Shaped(_)) {
                            out.changes += 1;
                        }
                    }
                    out.depth.push(u64::from(q.active(IoClass::Bulk)));
                    if let Some(s) = q.shape() {
                        out.piece_kib.push(s.piece_sectors / 2);
                        out.budget_kib.push(s.budget_sectors / 2);
                        out.target_us.push(s.target_ns / 1000);
                        if let Some(f) = s.drain_floor_sectors {
                            out.drain_floor_kib.push(f / 2);
                        }
                    }
                }
            }
            out
        });
        Self { stop, task }
    }

    async fn finish(self) -> ShapeSamples {
        self.stop.notify_one();
        self.task.await.unwrap_or_default()
    }
}

/// Minimum, median and maximum of samples.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub(super) struct Spread {
    min: u64,
    median: u64,
    max: u64,
}

impl Spread {
    fn of(mut v: Vec<u64>) -> Self {
        v.sort_unstable();
        match (v.first(), v.get(v.len() / 2), v.last()) {
            (Some(&min), Some(&median), Some(&max)) => Self { min, median, max },
            _ => Self::default(),
        }
    }
}

/// Bulk's shaping over a run, summed up.
#[derive(Clone, Debug, Serialize)]
pub(super) struct Shaping {
    depth: Spread,
    piece_kib: Spread,
    budget_kib: Spread,
    target_us: Spread,
    /// Percent of the samples taken while draining ahead of a regular reader.
    drain_ahead_percent: u64,
    /// The floor drained to then.
    drain_floor_kib: Spread,
    changes: u64,
    samples: usize,
}

impl ShapeSamples {
    /// Adds another slice's samples.
    fn add(&mut self, other: ShapeSamples) {
        self.depth.extend(other.depth);
        self.piece_kib.extend(other.piece_kib);
        self.budget_kib.extend(other.budget_kib);
        self.target_us.extend(other.target_us);
        self.drain_floor_kib.extend(other.drain_floor_kib);
        self.changes += other.changes;
    }

    fn summary(self) -> Shaping {
        let shaped = self.piece_kib.len();
        Shaping {
            samples: self.depth.len(),
            depth: Spread::of(self.depth),
            piece_kib: Spread::of(self.piece_kib),
            budget_kib: Spread::of(self.budget_kib),
            target_us: Spread::of(self.target_us),
            drain_ahead_percent: (self.drain_floor_kib.len() * 100)
                .checked_div(shaped)
                .unwrap_or(0) as u64,
            drain_floor_kib: Spread::of(self.drain_floor_kib),
            changes: self.changes,
        }
    }
}

impl Shaping {
    fn line(&self) -> String {
        let (d, p, b, t) = (self.depth, self.piece_kib, self.budget_kib, self.target_us);
        format!(
            "depth {}/{}/{}, piece {}/{}/{} KiB, budget {}/{}/{} KiB, target {}/{}/{} us (min/median/max), drain-ahead {}% (floor {}/{}/{} KiB), {} changes",
            d.min,
            d.median,
            d.max,
            p.min,
            p.median,
            p.max,
            b.min,
            b.median,
            b.max,
            t.min,
            t.median,
            t.max,
            self.drain_ahead_percent,
            self.drain_floor_kib.min,
            self.drain_floor_kib.median,
            self.drain_floor_kib.max,
            self.changes
        )
    }
}

/// The bulk writer's request size, in KiB.
const BULK_REQUEST_KIB: u64 = 1024;

/// Each component's largest request in KiB, as the story's volumes send it: the limits
/// their split layers took (after the quirk table and the mod-15 policy), read from a volume
/// built as the runs build theirs.
fn max_request_kib(comps: &[Arc<dyn DynBlockDevice>], interleave: u64) -> Result<Vec<u64>, String> {
    let v = build(comps.to_vec(), interleave, &LayoutArgs::default(), false)?;
    Ok(v.components()
        .iter()
        .map(|c| u64::from(c.info().limits.max_sectors) / 2)
        .collect())
}

/// What `bench fairness --json` prints (live).
#[derive(Debug, Serialize)]
struct LiveReport {
    live: Vec<LiveRun>,
    seconds: f64,
    /// The interleaved slices each run was measured in.
    slices: u32,
    interleave: u64,
    direct: bool,
    /// Each component's largest request in KiB (its `max_sectors_kb`): a small one cuts
    /// bulk's writes into many pieces, whatever the controller does.
    max_request_kib: Vec<u64>,
    goals: Goals,
}

/// `tagstripe bench fairness` without `--sim`: the live story on a volume over `components`
/// (default: 4 temporary files, removed at the end).
pub(crate) fn fairness_live(
    components: &[String],
    interleave: u64,
    secs: f64,
    json: bool,
    buffered: bool,
) -> ExitCode {
    let rt = match runtime(1) {
        Ok(rt) => rt,
        Err(c) => return c,
    };
    let temp = TempFiles {
        dir: std::env::temp_dir().join(format!("tagstripe-fairness-{}", std::process::id())),
    };
    let code = rt.block_on(async {
        let run = async {
            let (comps, _, direct) = if components.is_empty() {
                temp_components(&temp, 256 << 20, !buffered).await?
            } else {
                let (c, direct) =
                    components::open_all_for_bench(components, false, buffered).await?;
                (c, components.to_vec(), direct)
            };
            let max_request_kib = max_request_kib(&comps, interleave)?;
            if !json {
                outln!(
                    "components: {}",
                    if direct {
                        "O_DIRECT"
                    } else {
                        "buffered (page cache)"
                    }
                );
                for (c, &kib) in comps.iter().zip(&max_request_kib) {
                    if kib < BULK_REQUEST_KIB {
                        outln!(
                            "  {}: at most {kib} KiB per request (its max_sectors_kb), so bulk's writes reach it cut to that size",
                            c.info().name,
                        );
                    }
                }
            }
            let progress = Progress::new(3);
            let live = live_fairness(
                &comps,
                (interleave, &LayoutArgs::default()),
                Duration::from_secs_f64(secs),
                !json,
                &progress,
                None,
            )
            .await;
            progress.finish();
            live.map(|(l, g)| (l, g, direct, max_request_kib))
        };
        tokio::select! {
            r = run => match r {
                Ok((live, goals, direct, max_request_kib)) => {
                    if json {
                        let slices = slices_of(Duration::from_secs_f64(secs));
                        let r = LiveReport { live, seconds: secs, slices, interleave, direct, max_request_kib, goals };
                        outln!("{}", super::to_json(&r));
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => crate::fail("bench fairness", "volume", &e, json),
            },
            _ = tokio::signal::ctrl_c() => {
                eprintln!("interrupted: removing the temporary files");
                ExitCode::from(130)
            }
        }
    });
    drop(temp);
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_are_one_a_second_within_bounds() {
        let s = |x: f64| slices_of(Duration::from_secs_f64(x));
        assert_eq!(s(0.001), 1);
        assert_eq!(s(1.4), 1);
        assert_eq!(s(1.5), 2);
        assert_eq!(s(5.0), 5);
        assert_eq!(s(86_400.0), 60);
    }
}
