//! `tagstripe crash`: check every state a power cut could leave on a recorded volume
//! (`check`), rebuild one (`replay`), or say what a log holds (`info`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use tagstripe::crash::{CrashLog, Images, Mode, StateId, Tail, Timeline};

/// Arguments of `tagstripe crash`.
#[derive(Debug, Args)]
pub(crate) struct CrashArgs {
    #[command(subcommand)]
    command: CrashCommand,
}

#[derive(Debug, Subcommand)]
enum CrashCommand {
    /// Run a check on every crash state of a log (recorded by `serve --record`): exit 0 if
    /// it passed on every state, 1 if it failed on any, 2 for bad usage or a bad log.
    Check(CheckArgs),
    /// Write one crash state's image, named by the id `check` printed.
    Replay(ReplayArgs),
    /// What a log holds: devices, writes, flushes, epochs, bytes.
    Info(InfoArgs),
}

/// The log and how to read it.
#[derive(Debug, Args)]
struct LogArgs {
    /// The log `serve --record` wrote.
    log: PathBuf,
    /// Read a log that does not end cleanly (its recorder was killed) up to its last whole
    /// record, instead of refusing it.
    #[arg(long)]
    salvage: bool,
}

impl LogArgs {
    fn open(&self) -> Result<CrashLog, String> {
        let tail = if self.salvage {
            Tail::Salvage
        } else {
            Tail::Strict
        };
        CrashLog::open(&self.log, tail).map_err(|e| match e {
            tagstripe::Error::CrashLog { .. } if !self.salvage => {
                format!("{e}; --salvage reads the whole records before the break")
            }
            e => e.to_string(),
        })
    }
}

#[derive(Debug, Args)]
struct CheckArgs {
    #[command(flatten)]
    log: LogArgs,
    /// The volume's content when recording began (repeat for a log of several devices, in
    /// their order); not needed for a volume that read as zeroes (new sparse components).
    #[arg(long, value_name = "IMAGE")]
    base: Vec<PathBuf>,
    /// prefix (at every flush and FUA write, what had completed: dm-log-writes), subset
    /// (earlier epochs whole, a random subset of the rest: CrashMonkey) or torn (a subset
    /// with one write torn at 512-byte or 4 KiB blocks: LazyFS).
    #[arg(long)]
    mode: Mode,
    /// How many states (default: every prefix state; 1000 subset or torn states).
    #[arg(long)]
    states: Option<u64>,
    /// Seed of the subset and torn states.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
    /// Seconds a check may run before it is killed and counted as a failure.
    #[arg(long, default_value_t = 60.0)]
    timeout: f64,
    /// Where the working images live (default: a new directory in the system's temporary
    /// directory, removed at the end).
    #[arg(long, value_name = "DIR")]
    workdir: Option<PathBuf>,
    /// The check: `{}` in its arguments becomes the state's image path (`{1}`, `{2}`, ...
    /// the other devices' of a log of several); it is also in $TAGSTRIPE_CRASH_IMAGE
    /// ($TAGSTRIPE_CRASH_IMAGE_1, ...), and the state's id in $TAGSTRIPE_CRASH_STATE.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

#[derive(Debug, Args)]
struct ReplayArgs {
    #[command(flatten)]
    log: LogArgs,
    /// The state, as `check` names it: prefix:K, subset:SEED:K or torn:SEED:K.
    #[arg(long)]
    state: StateId,
    /// Where to write its image (a log of several devices: FILE.0, FILE.1, ...).
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    /// The volume's content when recording began, as for `check`.
    #[arg(long, value_name = "IMAGE")]
    base: Vec<PathBuf>,
}

#[derive(Debug, Args)]
struct InfoArgs {
    #[command(flatten)]
    log: LogArgs,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(args: &CrashArgs) -> ExitCode {
    match &args.command {
        CrashCommand::Check(a) => check(a),
        CrashCommand::Replay(a) => replay(a),
        CrashCommand::Info(a) => info(a),
    }
}

fn info(a: &InfoArgs) -> ExitCode {
    let log = match a.log.open() {
        Ok(l) => l,
        Err(e) => return crate::fail("crash info", "bad_log", &e, a.json),
    };
    let s = log.summary();
    let t = Timeline::new(&log);
    if a.json {
        let devices: Vec<_> = log
            .devices()
            .iter()
            .map(|d| {
                serde_json::json!({"name": d.name, "sectors": d.sectors, "block": d.block,
                    "zero_base": d.zero_base})
            })
            .collect();
        outln!(
            "{}",
            serde_json::json!({
                "devices": devices, "writes": s.writes, "fua": s.fua, "flushes": s.flushes,
                "epochs": s.epochs, "bytes_written": s.bytes_written, "failed": s.failed,
                "in_flight": s.in_flight, "log_bytes": s.log_bytes, "ended": log.ended(),
                "prefix_states": t.prefix_states(),
            })
        );
        return ExitCode::SUCCESS;
    }
    outln!("log {}", a.log.log.display());
    for (i, d) in log.devices().iter().enumerate() {
        outln!(
            "device {i}: {:?}, {} sectors ({:.1} MiB), logical block {} bytes, {}",
            d.name,
            d.sectors,
            d.sectors as f64 / 2048.0,
            d.block,
            if d.zero_base {
                "zeroes when recording began"
            } else {
                "held data when recording began (check with --base)"
            }
        );
    }
    outln!(
        "{} writes ({} FUA), {} flushes, {} epochs, {} bytes written, {} failed, {} in flight",
        s.writes,
        s.fua,
        s.flushes,
        s.epochs,
        s.bytes_written,
        s.failed,
        s.in_flight
    );
    outln!(
        "{} prefix states; log {} bytes{}",
        t.prefix_states(),
        s.log_bytes,
        if log.ended() {
            ""
        } else {
            " (no end record: salvaged)"
        }
    );
    ExitCode::SUCCESS
}

/// A working directory removed when dropped (unless the user named it).
struct WorkDir {
    path: PathBuf,
    ours: bool,
}

impl WorkDir {
    /// `given`, or a new directory under `under`.
    fn new(given: Option<&Path>, under: &Path, what: &str) -> Result<Self, String> {
        if let Some(p) = given {
            return Ok(Self {
                path: p.to_owned(),
                ours: false,
            });
        }
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let path = under.join(format!(
            ".tagstripe-crash-{what}-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(Self { path, ours: true })
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if self.ours {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// How one state's check went.
struct Outcome {
    exit: i32,
    output: String,
}

/// The last this many bytes of a failing check's output are kept.
const OUTPUT_TAIL: u64 = 4096;

/// Runs the check on the images: `{}` and `{N}` replaced, the environment set, stdout and
/// stderr into one file, killed (its whole process group) after `timeout`.
fn run_check(
    command: &[String],
    images: &[PathBuf],
    state: &StateId,
    out: &Path,
    timeout: Duration,
) -> Result<Outcome, String> {
    use std::os::unix::process::CommandExt as _;
    let path = |i: usize| images[i].display().to_string();
    let subst = |a: &String| {
        let mut s = a.replace("{}", &path(0));
        for i in 1..images.len() {
            s = s.replace(&format!("{{{i}}}"), &path(i));
        }
        s
    };
    let argv: Vec<String> = command.iter().map(subst).collect();
    let sink = std::fs::File::create(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let sink2 = sink
        .try_clone()
        .map_err(|e| format!("{}: {e}", out.display()))?;
    let mut cmd = std::process::Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .env("TAGSTRIPE_CRASH_IMAGE", path(0))
        .env("TAGSTRIPE_CRASH_STATE", state.to_string())
        .stdin(std::process::Stdio::null())
        .stdout(sink)
        .stderr(sink2)
        .process_group(0);
    for i in 1..images.len() {
        cmd.env(format!("TAGSTRIPE_CRASH_IMAGE_{i}"), path(i));
    }
    let mut child = cmd.spawn().map_err(|e| format!("{}: {e}", argv[0]))?;
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    let (status, timed_out) = match rx.recv_timeout(timeout) {
        Ok(s) => (s, false),
        Err(_) => {
            if let Ok(pgid) = i32::try_from(pid) {
                // SAFETY: kill(2) takes plain integers and touches no memory of ours; the
                // group is the check's own (process_group(0) made its pid the group id), and
                // the child is not yet reaped (the waiter thread still waits on it), so the
                // id names no other process. Exercised by the CLI test of a hanging check.
                unsafe {
                    libc::kill(-pgid, libc::SIGKILL);
                }
            }
            (
                rx.recv().unwrap_or_else(|e| Err(std::io::Error::other(e))),
                true,
            )
        }
    };
    let status = status.map_err(|e| format!("waiting for {}: {e}", argv[0]))?;
    let exit = if timed_out {
        124
    } else {
        use std::os::unix::process::ExitStatusExt as _;
        status
            .code()
            .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
    };
    let mut output = String::new();
    if exit != 0 {
        let bytes = std::fs::read(out).unwrap_or_default();
        let from = bytes.len().saturating_sub(OUTPUT_TAIL as usize);
        output = String::from_utf8_lossy(&bytes[from..]).into_owned();
        if timed_out {
            output.push_str(&format!(
                "\n[tagstripe: killed after {:.1} s (--timeout)]",
                timeout.as_secs_f64()
            ));
        }
    }
    Ok(Outcome { exit, output })
}

/// The command that rebuilds a state's image.
fn replay_command(a: &CheckArgs, id: &StateId) -> String {
    let mut s = format!(
        "tagstripe crash replay {}{} --state {id} --out FILE",
        a.log.log.display(),
        if a.log.salvage { " --salvage" } else { "" }
    );
    for b in &a.base {
        s.push_str(&format!(" --base {}", b.display()));
    }
    s
}

/// Progress on stderr: a bar on a terminal (feature `extras`), a line every tenth
/// otherwise.
struct Bar {
    #[cfg(not(feature = "extras"))]
    total: u64,
    #[cfg(not(feature = "extras"))]
    done: u64,
    #[cfg(feature = "extras")]
    bar: indicatif::ProgressBar,
}

impl Bar {
    fn new(total: u64, quiet: bool) -> Self {
        #[cfg(feature = "extras")]
        {
            let bar = if quiet {
                indicatif::ProgressBar::hidden()
            } else {
                indicatif::ProgressBar::new(total)
            };
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "{elapsed_precise} [{bar:32}] {pos}/{len} states, {per_sec} {msg}",
            ) {
                bar.set_style(style.progress_chars("=> "));
            }
            Self { bar }
        }
        #[cfg(not(feature = "extras"))]
        {
            let _ = quiet;
            Self { total, done: 0 }
        }
    }

    fn step(&mut self, failed: u64) {
        #[cfg(feature = "extras")]
        {
            self.bar.inc(1);
            if failed > 0 {
                self.bar.set_message(format!("{failed} failed"));
            }
        }
        #[cfg(not(feature = "extras"))]
        {
            self.done += 1;
            let tenth = (self.total / 10).max(1);
            if self.done % tenth == 0 || self.done == self.total {
                eprintln!("{}/{} states, {failed} failed", self.done, self.total);
            }
        }
    }

    fn finish(&self) {
        #[cfg(feature = "extras")]
        self.bar.finish_and_clear();
    }
}

fn check(a: &CheckArgs) -> ExitCode {
    let fail = |kind: &str, msg: &str| crate::fail("crash check", kind, msg, a.json);
    if !(a.timeout > 0.0 && a.timeout.is_finite()) {
        return fail(
            "bad_option",
            "--timeout must be a positive number of seconds",
        );
    }
    let log = match a.log.open() {
        Ok(l) => l,
        Err(e) => return fail("bad_log", &e),
    };
    let t = Timeline::new(&log);
    let n = a.states.unwrap_or(match a.mode {
        Mode::Prefix => u64::MAX,
        _ => 1000,
    });
    if n == 0 {
        return fail("bad_option", "--states must be at least 1");
    }
    let states = t.states(a.mode, n, a.seed);
    let work = match WorkDir::new(a.workdir.as_deref(), &std::env::temp_dir(), "check") {
        Ok(w) => w,
        Err(e) => return fail("workdir", &e),
    };
    let mut images = match Images::new(&log, &work.path, &a.base) {
        Ok(i) => i,
        Err(e) => return fail("bad_base", &e.to_string()),
    };
    let paths = images.paths();
    let out = work.path.join("check-output");
    let timeout = Duration::from_secs_f64(a.timeout);
    let started = Instant::now();
    let mut bar = Bar::new(states.len() as u64, a.json);
    let mut failed = 0u64;
    let mut first: Option<(StateId, Outcome)> = None;
    for s in &states {
        let r = images
            .materialize(&log, &t, s)
            .map_err(|e| e.to_string())
            .and_then(|()| run_check(&a.command, &paths, &s.id, &out, timeout));
        let o = match r {
            Ok(o) => o,
            Err(e) => {
                bar.finish();
                return fail("check", &format!("state {}: {e}", s.id));
            }
        };
        if o.exit != 0 {
            failed += 1;
            if first.is_none() {
                first = Some((s.id, o));
            }
        }
        bar.step(failed);
    }
    bar.finish();
    let secs = started.elapsed().as_secs_f64();
    let rate = states.len() as f64 / secs.max(1e-9);
    if a.json {
        let ff = first.as_ref().map(|(id, o)| {
            serde_json::json!({"state": id.to_string(), "exit": o.exit, "output": o.output,
                "replay": replay_command(a, id)})
        });
        outln!(
            "{}",
            serde_json::json!({"mode": a.mode.name(), "states": states.len(), "failed": failed,
                "states_per_second": (rate * 10.0).round() / 10.0, "first_failure": ff})
        );
    } else {
        outln!(
            "{} {} states, {failed} failed ({:.1} s, {rate:.0} states/s)",
            states.len(),
            a.mode.name(),
            secs
        );
        if let Some((id, o)) = &first {
            outln!("first failure: state {id}, exit {}", o.exit);
            for line in o.output.lines() {
                outln!("  | {line}");
            }
            outln!("rebuild it with: {}", replay_command(a, id));
        }
    }
    if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn replay(a: &ReplayArgs) -> ExitCode {
    let fail = |kind: &str, msg: &str| crate::fail("crash replay", kind, msg, false);
    let log = match a.log.open() {
        Ok(l) => l,
        Err(e) => return fail("bad_log", &e),
    };
    let t = Timeline::new(&log);
    let Some(state) = t.state(a.state) else {
        return fail(
            "bad_state",
            &format!(
                "{}: the log has {} prefix states (prefix:0 to prefix:{})",
                a.state,
                t.prefix_states(),
                t.prefix_states().saturating_sub(1)
            ),
        );
    };
    let parent = a
        .out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    // Built beside the output, so the images move there by rename.
    let work = match WorkDir::new(None, parent, "replay") {
        Ok(w) => w,
        Err(e) => return fail("workdir", &e),
    };
    let mut images = match Images::new(&log, &work.path, &a.base) {
        Ok(i) => i,
        Err(e) => return fail("bad_base", &e.to_string()),
    };
    eprintln!("tagstripe crash replay: {}", t.describe(&state));
    if let Err(e) = images.materialize(&log, &t, &state) {
        return fail("replay", &e.to_string());
    }
    let paths = images.paths();
    drop(images);
    for (i, p) in paths.iter().enumerate() {
        let to = if paths.len() == 1 {
            a.out.clone()
        } else {
            PathBuf::from(format!("{}.{i}", a.out.display()))
        };
        let moved = std::fs::rename(p, &to).or_else(|_| std::fs::copy(p, &to).map(|_| ()));
        if let Err(e) = moved {
            return fail("replay", &format!("{}: {e}", to.display()));
        }
        eprintln!(
            "tagstripe crash replay: state {} of device {i} written to {}",
            a.state,
            to.display()
        );
    }
    ExitCode::SUCCESS
}
