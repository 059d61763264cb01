//! `tagstripe serve`: export a volume (or one device) over NBD.

use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;
use tagstripe::nbd::{Export, NbdServer, ServerConfig, TlsPolicy};
use tagstripe::quirks::QuirkSet;
use tagstripe::scheduler::IoClass;
use tagstripe::{BlockDevice, DynBlockDevice, IoOpts, MirrorEvent, Volume};

use crate::components::{self, OpenOptions};

/// Arguments of `tagstripe serve`.
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// Address and port to listen on (loopback unless another address is given; port 0
    /// picks a free one), `unix:PATH` for a Unix socket, or `-` for one connection on
    /// standard input and output (as libnbd's `connect_command` starts a server; when
    /// standard input is a socket, as inetd passes one, both directions go over it);
    /// messages then go to standard error. Started by systemd socket activation
    /// (`LISTEN_PID` naming this process, `LISTEN_FDS`), it serves the sockets passed from
    /// fd 3 instead.
    #[arg(long, default_value = "127.0.0.1:10809")]
    listen: String,
    /// The export's name.
    #[arg(long, default_value = "tagstripe")]
    export: String,
    /// Interleave in sectors (0 concatenates).
    #[arg(long, default_value_t = 128)]
    interleave: u64,
    #[command(flatten)]
    layout: crate::layout::LayoutArgs,
    /// Metadata at the end of each component (its last 16 sectors): `end` records which
    /// mirror side is stale so that it is never read after a restart, and a write-intent
    /// bitmap so that a returning side is resynced (online, in the bulk class) by copying
    /// only what it missed; `none` keeps the components exactly as ccd lays them out.
    /// Default: `end` with --mirror, else `none`.
    #[arg(long, value_parser = ["end", "none"])]
    metadata: Option<String>,
    /// The same as --metadata none.
    #[arg(long, conflicts_with = "metadata")]
    no_metadata: bool,
    /// The mirror's sides are known to be identical (as mdadm's --assume-clean): a new
    /// mirror skips its first resync of the second half from the first; needed for
    /// --mirror with --metadata none, where nothing could tell a stale side after a restart.
    #[arg(long)]
    assume_clean: bool,
    /// Export read-only.
    #[arg(long)]
    read_only: bool,
    /// Open files and block devices with O_DIRECT.
    #[arg(long)]
    direct: bool,
    /// I/O class of the clients' requests in the volume's tagged queues: interactive,
    /// best-effort, bulk or idle.
    #[arg(long, default_value = "best-effort", value_parser = parse_class)]
    class: IoClass,
    /// TCP peers that may connect: comma-separated ADDR[/PREFIX] (others are closed before
    /// negotiation). Required, or --insecure, to listen on an address that is not loopback.
    #[arg(long, value_name = "ADDR[/PREFIX],...")]
    allow: Option<String>,
    /// Listen on an address that is not loopback with neither TLS nor an allow-list (anyone
    /// who can reach it may read and write the volume).
    #[arg(long)]
    insecure: bool,
    /// TLS: off, on (clients may upgrade with STARTTLS) or require (nothing but STARTTLS
    /// before TLS). On and require need --tls-certificates.
    #[arg(long, default_value = "off", value_parser = parse_tls)]
    tls: TlsPolicy,
    /// A directory with ca-cert.pem, server-cert.pem and server-key.pem (the layout of
    /// qemu's tls-creds-x509 and nbdkit's --tls-certificates).
    #[arg(long, value_name = "DIR")]
    tls_certificates: Option<std::path::PathBuf>,
    /// Clients must present a certificate signed by the directory's ca-cert.pem.
    #[arg(long)]
    tls_verify_peer: bool,
    /// Also export the volume as NAME with its requests in CLASS (repeatable): a VM's disk
    /// on the main export and a backup job on `--class-export backup:bulk` share the volume,
    /// with the tagged queues' fairness between them.
    #[arg(long, value_name = "NAME:CLASS", value_parser = parse_class_export)]
    class_export: Vec<(String, IoClass)>,
    /// Also export the volume as NAME for a tenant (repeatable): its requests scheduled
    /// against the other tenants' by mClock's tags, with KEYs (all optional) weight (1-10000,
    /// default 100: its share of what the reservations leave), reserve-iops, reserve-mbs (a
    /// minimum), limit-iops, limit-mbs (a maximum; MB = 10^6 bytes, as fio counts) and class
    /// (its requests' I/O class, default best-effort). With tenants, the plain export and
    /// each --class-export are tenants too, at weight 100. Each tenant's figures are printed
    /// at exit and on SIGUSR1.
    #[arg(long, value_name = "NAME:KEY=VALUE,...", value_parser = crate::tenants::parse_tenant)]
    tenant: Vec<crate::tenants::TenantArg>,
    /// Largest request a client may send, in bytes.
    #[arg(long, default_value_t = 32 << 20)]
    max_request: u32,
    /// TCP congestion control for connections from this host (a loopback address or the
    /// server's own), or `system` to keep the system's: BBR's pacing on loopback spaced
    /// large replies out (1 MiB reads, one connection: 1.24-1.54x the reads a second with
    /// cubic). Connections from elsewhere keep the system's.
    #[arg(long, default_value = "cubic", value_name = "NAME|system", value_parser = parse_congestion)]
    local_congestion: String,
    /// Serve the components as an md array of this level instead of a ccd geometry:
    /// raid5, raid6 or raid10 (member sector 0 at each component's start, or at
    /// --reserved).
    #[arg(long, value_enum, conflicts_with_all = ["md", "mirror", "uniform"])]
    level: Option<crate::map_md::Level>,
    /// With --level: md's layout as mdadm names it (default left-symmetric; raid10 n2).
    #[arg(long = "layout", requires = "level")]
    md_layout: Option<String>,
    /// With --level: chunk in sectors (default 1024, mdadm's 512 KiB).
    #[arg(long, requires = "level", default_value_t = 1024)]
    chunk: u64,
    /// The components are an md array's members: assemble it from their version-1
    /// superblocks (level, layout, chunk, roles, data offsets), as `mdadm --assemble` does,
    /// with no md driver; stale or missing members are served around.
    #[arg(long, conflicts_with_all = ["mirror", "uniform"])]
    md: bool,
    /// With --md: DEVICE takes the place of a missing, stale or failed member and is rebuilt
    /// online from the others, in the idle class, as `mdadm --add` does (repeat it for
    /// raid6's two; they are rebuilt one after the other). The new member is recorded in
    /// the array at once, with md's recovery offset as the rebuild goes: stopped part way,
    /// it is taken up where it was at the next start (name DEVICE among the components
    /// then).
    #[arg(long, value_name = "DEVICE", requires = "md")]
    add: Vec<String>,
    /// Record what the clients write (writes, write-zeroes, trims and flushes, with their
    /// data, flags and order) into a crash-lab log, from the volume's content when serving
    /// starts; `tagstripe crash check LOG` then runs a check on every state a power cut
    /// could have left.
    #[arg(long, value_name = "LOG", conflicts_with = "read_only")]
    record: Option<std::path::PathBuf>,
    /// Components: files, block devices, or nbd://host[:port][/export]. With one, that
    /// device is exported directly.
    #[arg(required = true)]
    components: Vec<String>,
}

fn parse_class(s: &str) -> Result<IoClass, String> {
    [
        IoClass::Interactive,
        IoClass::BestEffort,
        IoClass::Bulk,
        IoClass::Idle,
    ]
    .into_iter()
    .find(|c| c.name() == s)
    .ok_or_else(|| format!("{s:?}: expected interactive, best-effort, bulk or idle"))
}

/// A warning on standard error (standard output may be the protocol's, with --listen -).
fn say_err(msg: &str) {
    eprintln!("tagstripe serve: {msg}");
}

/// `sides 0, 1` or `side 1`.
fn sides(c: &[usize]) -> String {
    let list: Vec<String> = c.iter().map(ToString::to_string).collect();
    format!(
        "{} {}",
        if c.len() == 1 { "side" } else { "sides" },
        list.join(", ")
    )
}

fn mib(sectors: u64) -> String {
    format!("{:.1} MiB", sectors as f64 * 512.0 / 1048576.0)
}

/// One line on stderr for each mirror event.
/// An md array's member events, in its words.
fn say_md_event(e: &MirrorEvent) {
    let members = |c: &[usize]| {
        let list: Vec<String> = c.iter().map(ToString::to_string).collect();
        format!(
            "member{} {}",
            if c.len() == 1 { "" } else { "s" },
            list.join(", ")
        )
    };
    match e {
        MirrorEvent::Dropped { component, error } => say_err(&format!(
            "md member {component} failed ({error}): the array serves degraded"
        )),
        MirrorEvent::ResyncStarted {
            components,
            sectors,
            ..
        } => say_err(&format!(
            "md: rebuild or resync of {} started: {} each",
            members(components),
            mib(*sectors)
        )),
        MirrorEvent::ResyncProgress {
            components,
            done,
            total,
        } => say_err(&format!(
            "md: {}: {:.0}% ({} of {})",
            members(components),
            *done as f64 * 100.0 / (*total).max(1) as f64,
            mib(*done),
            mib(*total)
        )),
        MirrorEvent::ResyncComplete {
            components,
            elapsed,
            ..
        } => say_err(&format!(
            "md: {} in sync ({:.2} s)",
            members(components),
            elapsed.as_secs_f64()
        )),
        MirrorEvent::ResyncFailed { components, error } => say_err(&format!(
            "md: rebuild or resync of {} failed: {error}",
            members(components)
        )),
        other => say_event(other),
    }
}

fn say_event(e: &MirrorEvent) {
    match e {
        MirrorEvent::Dropped { component, error } => say_err(&format!(
            "mirror side {component} dropped ({error}): the volume serves degraded"
        )),
        MirrorEvent::Stale { component } => say_err(&format!(
            "mirror side {component} is stale (its metadata is behind the volume's): it is not \
             read; the volume serves degraded until it is resynced"
        )),
        MirrorEvent::ResyncStarted {
            components,
            sectors,
            whole,
        } => say_err(&format!(
            "resync of {} started: {} to copy from the partner{}",
            sides(components),
            mib(*sectors),
            if *whole {
                " (the whole side)"
            } else {
                " (the write-intent bitmap's chunks)"
            }
        )),
        MirrorEvent::ResyncProgress {
            components,
            done,
            total,
        } => say_err(&format!(
            "resync of {}: {:.0}% ({} of {}), recorded",
            sides(components),
            *done as f64 * 100.0 / (*total).max(1) as f64,
            mib(*done),
            mib(*total)
        )),
        MirrorEvent::ResyncComplete {
            components,
            sectors,
            elapsed,
        } => say_err(&format!(
            "resync complete: {} in sync, {} copied in {:.2} s ({:.0} MiB/s)",
            sides(components),
            mib(*sectors),
            elapsed.as_secs_f64(),
            *sectors as f64 * 512.0 / 1048576.0 / elapsed.as_secs_f64().max(1e-9)
        )),
        MirrorEvent::ResyncFailed { components, error } => say_err(&format!(
            "resync of {} failed ({error}): the side stays out of the mirror",
            sides(components)
        )),
        _ => {}
    }
}

fn parse_tls(s: &str) -> Result<TlsPolicy, String> {
    match s {
        "off" => Ok(TlsPolicy::Off),
        "on" => Ok(TlsPolicy::On),
        "require" => Ok(TlsPolicy::Require),
        _ => Err(format!("{s:?}: expected off, on or require")),
    }
}

fn parse_class_export(s: &str) -> Result<(String, IoClass), String> {
    let (name, class) = s
        .rsplit_once(':')
        .ok_or_else(|| format!("{s:?}: expected NAME:CLASS, e.g. backup:bulk"))?;
    if name.is_empty() {
        return Err(format!("{s:?}: the export name is empty"));
    }
    Ok((name.to_owned(), parse_class(class)?))
}

/// A congestion control's name as the kernel lists them (at most 15 bytes: letters, digits,
/// `_` and `-`), or `system`.
fn parse_congestion(s: &str) -> Result<String, String> {
    let ok = !s.is_empty()
        && s.len() < 16
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(s.to_owned())
    } else {
        Err(format!(
            "{s:?} is not a congestion control's name (as net.ipv4.tcp_available_congestion_control lists them: up to 15 letters, digits, _ or -) nor `system`"
        ))
    }
}

pub(crate) fn run(args: &ServeArgs) -> ExitCode {
    keep_large_buffers();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return crate::fail("serve", "runtime", &e.to_string(), false),
    };
    rt.block_on(serve(args))
}

/// Asks glibc's allocator to serve large buffers from its heaps and keep what is freed,
/// instead of a fresh `mmap` for each buffer over 128 KiB (its default until one is freed)
/// and giving memory back as soon as 128 KiB sit free at the top of a heap. A server's write
/// payloads (up to 32 MiB each) are allocated on the thread that reads the socket and freed
/// on whichever worker ran the write: with the defaults each one's pages were faulted in
/// afresh and the threads waited on the address-space lock (`perf`: 10% of the server's time
/// in page faults, 6% spinning on that lock; 1 MiB NBD writes over TCP 1,830-1,938 a second,
/// 2,487-2,522 with these settings). Other allocators (and other C libraries) are left as
/// they are.
fn keep_large_buffers() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallopt` only sets two of the allocator's tunables (no pointer is passed);
    // called before the runtime's threads start. Exercised by every test that runs `serve`.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
    }
}

async fn serve(args: &ServeArgs) -> ExitCode {
    match serve_phases(args).await {
        Ok(code) | Err(code) => code,
    }
}

/// A refusal, already reported: the exit code to leave with.
type Refused = ExitCode;

fn refuse(kind: &str, message: &str) -> Refused {
    crate::fail("serve", kind, message, false)
}

/// What the options say, checked before anything is opened or listened on.
struct Checked {
    allow: tagstripe::nbd::AllowList,
    config: ServerConfig,
    metadata: bool,
}

/// The volume (or the one device) being served and the server over it.
struct Assembled {
    device: Arc<dyn DynBlockDevice>,
    volume: Option<Arc<Volume>>,
    /// An md array (`--md`, `--level`), closed cleanly at the stop.
    raid: Option<Arc<tagstripe::Raid>>,
    /// The recorder of `--record`, finished at the stop.
    recorder: Option<tagstripe::Recorder>,
    /// An md array's rebuilds (`--add`, or one taken up), stopped before the array closes.
    rebuild: Option<tokio::task::JoinHandle<()>>,
    /// The tenants of `--tenant`, their figures printed at exit and on SIGUSR1.
    tenants: Option<crate::tenants::Shared>,
    server: Arc<NbdServer>,
}

async fn serve_phases(args: &ServeArgs) -> Result<ExitCode, Refused> {
    let checked = validate(args)?;
    let assembled = assemble(args, &checked).await?;
    let listener = Listener::bind(&args.listen)
        .await
        .map_err(|e| refuse("listen", &format!("{}: {e}", args.listen)))?;
    check_exposure(args, &checked, &listener)?;
    Ok(run_server(args, assembled, listener).await)
}

/// Checks every option that needs no I/O: a bad one is refused before a component is
/// opened or a socket bound.
fn validate(args: &ServeArgs) -> Result<Checked, Refused> {
    if args.max_request < 4096 {
        return Err(refuse("bad_option", "--max-request must be at least 4096"));
    }
    let metadata = match args.metadata.as_deref() {
        _ if args.no_metadata => false,
        Some("end") => true,
        Some(_) => false,
        None => args.layout.mirror,
    };
    if args.layout.mirror && !metadata && !args.assume_clean {
        return Err(refuse(
            "bad_option",
            "--mirror with --metadata none keeps no record of a stale side: after a restart \
             a side that missed writes would be read; use --metadata end (the default), \
             or --assume-clean if the sides are known to be identical",
        ));
    }
    for (name, _) in &args.class_export {
        if *name == args.export {
            return Err(refuse(
                "bad_option",
                &format!("--class-export {name}: that is the main export's name"),
            ));
        }
    }
    let mut names: Vec<&str> = vec![&args.export];
    names.extend(args.class_export.iter().map(|(n, _)| n.as_str()));
    for t in &args.tenant {
        if names.contains(&t.name.as_str()) {
            return Err(refuse(
                "bad_option",
                &format!("--tenant {}: a name already exported", t.name),
            ));
        }
        names.push(&t.name);
    }
    let allow: tagstripe::nbd::AllowList = args
        .allow
        .as_deref()
        .unwrap_or("")
        .parse()
        .map_err(|e| refuse("bad_option", &format!("--allow: {e}")))?;
    let tls_config = match (args.tls, &args.tls_certificates) {
        (TlsPolicy::Off, None) if args.tls_verify_peer => {
            return Err(refuse(
                "bad_option",
                "--tls-verify-peer needs --tls on or --tls require",
            ));
        }
        (TlsPolicy::Off, _) => None,
        (_, None) => {
            return Err(refuse(
                "bad_option",
                "--tls on and --tls require need --tls-certificates DIR (with ca-cert.pem, \
                 server-cert.pem and server-key.pem)",
            ));
        }
        (_, Some(dir)) => Some(
            tagstripe::nbd::tls::server_config(dir, args.tls_verify_peer)
                .map_err(|e| refuse("tls", &e.to_string()))?,
        ),
    };
    let config = ServerConfig {
        max_request: args.max_request,
        local_congestion: (args.local_congestion != "system")
            .then(|| args.local_congestion.clone()),
        class: args.class,
        allow: allow.clone(),
        tls: args.tls,
        tls_config,
        ..ServerConfig::default()
    };
    Ok(Checked {
        allow,
        config,
        metadata,
    })
}

/// Opens the components, builds the volume over them (reading its metadata) and the server
/// with its exports.
async fn assemble(args: &ServeArgs, checked: &Checked) -> Result<Assembled, Refused> {
    let o = OpenOptions {
        read_only: args.read_only,
        direct: args.direct,
    };
    let comps = components::open_all(&args.components, o)
        .await
        .map_err(|e| refuse("open", &e))?;
    if args.md || args.level.is_some() {
        let raid = Arc::new(md_array(args, comps).await?);
        let rebuild = md_rebuilds(args, &raid, o).await?;
        let (device, recorder) = record(args, Arc::clone(&raid) as Arc<dyn DynBlockDevice>).await?;
        let (server, tenants) = exports(
            args,
            checked,
            &device,
            None,
            "an md array served by tagstripe",
        )?;
        return Ok(Assembled {
            device,
            volume: None,
            raid: Some(raid),
            recorder,
            rebuild,
            tenants,
            server: Arc::new(server),
        });
    }
    let (device, mut volume): (Arc<dyn DynBlockDevice>, Option<Arc<Volume>>) = if comps.len() == 1 {
        (shared_component(args, &comps[0])?, None)
    } else {
        let b = args.layout.volume(
            Volume::builder(comps)
                .name(&args.export)
                .interleave(args.interleave)
                .fairness(serve_fairness())
                .quirks(QuirkSet::builtin()),
        );
        let v = b
            .metadata(checked.metadata)
            .assume_clean(args.assume_clean)
            .read_only(args.read_only)
            .on_event(say_event)
            .open()
            .await
            .map_err(|e| refuse("volume", &e.to_string()))?;
        let v = Arc::new(v);
        (Arc::clone(&v) as Arc<dyn DynBlockDevice>, Some(v))
    };
    let (device, recorder) = record(args, device).await?;
    // A recorded volume is exported as the recording device (so every write is recorded);
    // the volume itself is still closed at the stop.
    let exported_volume = if recorder.is_some() {
        None
    } else {
        volume.clone()
    };
    let (server, tenants) = exports(
        args,
        checked,
        &device,
        exported_volume.as_ref(),
        "a tagstripe volume",
    )?;
    Ok(Assembled {
        device,
        volume: volume.take(),
        raid: None,
        recorder,
        rebuild: None,
        tenants,
        server: Arc::new(server),
    })
}

/// The fair policy of everything `serve` queues (a volume's components, md members, a
/// shared component): the default, with bulk shaped to an interactive latency at the device
/// of 8x its unloaded one rather than 4x. A client of the server sees each request's round
/// trip through NBD on top of the device's time (0.1-0.2 ms over a Unix socket), so 8x at
/// the device is about 3-4x at the client, the interactive promise as a client measures it;
/// at 4x the bulk writer lost a quarter to a half of its rate for readers already at 2x
/// (docs/tenants.md has the figures).
fn serve_fairness() -> tagstripe::scheduler::FairConfig {
    tagstripe::scheduler::FairConfig {
        target_percent: 800,
        ..tagstripe::scheduler::FairConfig::default()
    }
}

/// One component served as it is (no geometry, no offset: the image's sector 0 is the
/// export's), behind the tagged queue and the quirk table's split when clients of more than
/// one kind share it (`--class-export`s or `--tenant`s): the queue's fair policy is what
/// serves an interactive request ahead of a backlog of bulk writes and shapes the bulk to
/// the latency the device shows, as a volume's components get. A single export of one class
/// has nothing to arbitrate, and its requests go to the component directly.
fn shared_component(
    args: &ServeArgs,
    comp: &Arc<dyn DynBlockDevice>,
) -> Result<Arc<dyn DynBlockDevice>, Refused> {
    if args.class_export.is_empty() && args.tenant.is_empty() {
        return Ok(Arc::clone(comp));
    }
    let info = comp.info();
    let applied = QuirkSet::builtin()
        .apply(&info.identity, &info.limits)
        .map_err(|e| refuse("component", &e.to_string()))?;
    let fair = tagstripe::scheduler::Fair::new(serve_fairness());
    let queued = tagstripe::Queue::with_policy(Arc::clone(comp), Box::new(fair));
    let split = tagstripe::Split::new(queued, &applied, tagstripe::quirks::Mod15::Off)
        .map_err(|e| refuse("component", &e.to_string()))?;
    Ok(Arc::new(split))
}

/// The server and its exports: the plain one and each `--class-export` over `device` (or
/// the volume, for the component map); with `--tenant`s, every export a tenant of one
/// scheduler over `device`.
fn exports(
    args: &ServeArgs,
    checked: &Checked,
    device: &Arc<dyn DynBlockDevice>,
    volume: Option<&Arc<Volume>>,
    description: &str,
) -> Result<(NbdServer, Option<crate::tenants::Shared>), Refused> {
    let mut plain: Vec<(String, Option<IoClass>)> = vec![(args.export.clone(), None)];
    plain.extend(args.class_export.iter().map(|(n, c)| (n.clone(), Some(*c))));
    let mut server = NbdServer::new(checked.config.clone());
    let finish = |e: Export, class: Option<IoClass>| {
        let e = e.description(description).read_only(args.read_only);
        match class {
            Some(c) => e.class(c),
            None => e,
        }
    };
    if args.tenant.is_empty() {
        for (name, class) in plain {
            let e = match volume {
                Some(v) => Export::volume(&name, Arc::clone(v)),
                None => Export::device(&name, Arc::clone(device)),
            };
            server = server.export_entry(finish(e, class));
        }
        return Ok((server, None));
    }
    let (tenants, devs) = crate::tenants::build(device, &args.tenant, &plain)
        .map_err(|e| refuse("bad_option", &format!("--tenant: {e}")))?;
    for (name, dev, class) in devs {
        server = server.export_entry(finish(Export::device(&name, dev), class));
    }
    Ok((server, Some(tenants)))
}

/// The rebuilds an md array owes: one stopped part way (taken up first), then each `--add`
/// device in place of a failed member, in the background, one after the other.
async fn md_rebuilds(
    args: &ServeArgs,
    raid: &Arc<tagstripe::Raid>,
    o: OpenOptions,
) -> Result<Option<tokio::task::JoinHandle<()>>, Refused> {
    let paused = raid.rebuild_progress();
    let failed: Vec<usize> = raid
        .failed()
        .into_iter()
        .filter(|&m| paused.is_none_or(|(p, ..)| p != m))
        .collect();
    if args.add.len() > failed.len() {
        return Err(refuse(
            "md",
            &format!(
                "--add {}: the array has {} missing or failed member{} to replace ({failed:?})",
                args.add.join(" --add "),
                failed.len(),
                if failed.len() == 1 { "" } else { "s" }
            ),
        ));
    }
    if args.read_only {
        if !args.add.is_empty() {
            return Err(refuse(
                "md",
                "--add writes the new member: not with --read-only",
            ));
        }
        return Ok(None);
    }
    let adds = components::open_all(&args.add, o)
        .await
        .map_err(|e| refuse("open", &e))?;
    if paused.is_none() && adds.is_empty() {
        return Ok(None);
    }
    if let Some((m, done, need)) = paused {
        say_err(&format!(
            "md: member {m} was partly rebuilt ({} of {}): taking the rebuild up there",
            mib(done),
            mib(need)
        ));
    }
    let raid = Arc::clone(raid);
    Ok(Some(tokio::spawn(async move {
        if let Err(e) = raid.resume_rebuild().await {
            say_err(&format!("md: the rebuild could not be taken up: {e}"));
        }
        for (role, dev) in failed.into_iter().zip(adds) {
            say_err(&format!(
                "md: {} added in place of member {role}: rebuilding it",
                dev.info().name
            ));
            if let Err(e) = raid.rebuild(role, dev).await {
                say_err(&format!("md: the rebuild of member {role} failed: {e}"));
            }
        }
    })))
}

/// With `--record`: the device wrapped in a recorder writing the log (and the recorder,
/// to finish at the stop); otherwise the device as it is.
async fn record(
    args: &ServeArgs,
    device: Arc<dyn DynBlockDevice>,
) -> Result<(Arc<dyn DynBlockDevice>, Option<tagstripe::Recorder>), Refused> {
    let Some(path) = &args.record else {
        return Ok((device, None));
    };
    let fail = |e: tagstripe::Error| refuse("record", &format!("--record {}: {e}", path.display()));
    let rec = tagstripe::Recorder::create(path).map_err(fail)?;
    let recorded = rec.record(device).await.map_err(fail)?;
    if !recorded.zero_base() {
        say_err(&format!(
            "recording into {}: the volume holds data already; keep a copy of it as it is now              (before any client writes) for `tagstripe crash check --base`",
            path.display()
        ));
    }
    Ok((Arc::new(recorded), Some(rec)))
}

/// The md array `--md` or `--level` asks for, over `comps`.
async fn md_array(
    args: &ServeArgs,
    comps: Vec<Arc<dyn DynBlockDevice>>,
) -> Result<tagstripe::Raid, Refused> {
    let fail = |e: String| refuse("md", &e);
    if args.md {
        let raid = tagstripe::Raid::assemble_md(&args.export, comps)
            .await
            .map_err(|e| fail(e.to_string()))?;
        if !raid.failed().is_empty() {
            say_err(&format!(
                "md array assembled degraded: members {:?} missing or stale",
                raid.failed()
            ));
        }
        return Ok(raid.with_queues(serve_fairness()).on_event(say_md_event));
    }
    let Some(level) = args.level else {
        return Err(fail("--md or --level is needed".into()));
    };
    let raid = crate::map_md::build_raid(
        &args.export,
        level,
        args.md_layout.as_deref(),
        args.chunk,
        args.layout.reserved.unwrap_or(0),
        comps,
        serve_fairness(),
    )
    .map_err(fail)?;
    Ok(raid.on_event(say_md_event))
}

/// An address beyond loopback with nobody kept out is refused unless the user says so.
fn check_exposure(args: &ServeArgs, checked: &Checked, listener: &Listener) -> Result<(), Refused> {
    if let Listener::Tcp(_, addr) = listener {
        if !addr.ip().is_loopback()
            && checked.allow.is_empty()
            && args.tls != TlsPolicy::Require
            && !args.insecure
        {
            return Err(refuse(
                "insecure",
                &format!(
                    "listening on {addr} lets anyone who can reach it read and write the volume \
                     in the clear; require TLS with --tls require --tls-certificates DIR \
                     [--tls-verify-peer], restrict it with --allow ADDR[/PREFIX],..., or \
                     accept the risk with --insecure"
                ),
            ));
        }
    }
    Ok(())
}

/// Serves until the listener fails or a signal stops it; then, for a writable volume,
/// makes every acknowledged write durable and the mirror clean.
async fn run_server(args: &ServeArgs, a: Assembled, listener: Listener) -> ExitCode {
    let Assembled {
        device,
        volume,
        raid,
        recorder,
        rebuild,
        tenants,
        server,
    } = a;
    let started = std::time::Instant::now();
    {
        // SIGUSR1: the figures so far (each tenant's, then the server's), with or without
        // tenants (its default action would stop the server).
        let (t, srv) = (tenants.clone(), Arc::clone(&server));
        tokio::spawn(async move {
            let Ok(mut usr1) =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1())
            else {
                return;
            };
            while usr1.recv().await.is_some() {
                if let Some(t) = &t {
                    for l in crate::tenants::report(t, started.elapsed().as_secs_f64()) {
                        eprintln!("tagstripe serve: {l}");
                    }
                }
                eprintln!("tagstripe serve: so far: {}", counters_line(&srv));
            }
        });
    }
    let info = device.info().clone();
    // On standard output only the protocol may travel: say everything on stderr then.
    let stdio = matches!(listener, Listener::Stdio);
    macro_rules! say {
        ($($arg:tt)*) => {
            if stdio { eprintln!($($arg)*) } else { outln!($($arg)*) }
        };
    }
    say!("listening on {}", listener.url(&args.export));
    say!(
        "export {:?}: {} sectors ({} bytes){}, logical block {} bytes",
        args.export,
        info.sectors,
        info.bytes(),
        if args.read_only || info.read_only {
            ", read-only"
        } else {
            ""
        },
        info.limits.logical_block_size
    );
    match &volume {
        Some(v) => say!("{}", v.geometry()),
        None if args.md || args.level.is_some() => say!(
            "md array over {} members, {} sectors, logical block {} bytes",
            args.components.len(),
            info.sectors,
            info.limits.logical_block_size
        ),
        None => say!("one component, exported directly: {}", info.name),
    }
    for (name, class) in &args.class_export {
        say!(
            "export {name:?}: the same volume, requests in the {} class",
            class.name()
        );
    }
    for t in &args.tenant {
        say!(
            "export {:?}: the same volume as a tenant: weight {}, reserve {} IOPS / {} MB/s, limit {} IOPS / {} MB/s, {} class",
            t.name,
            t.spec.weight,
            t.spec.reserve_iops,
            t.spec.reserve_bps / 1e6,
            t.spec.limit_iops,
            t.spec.limit_bps / 1e6,
            t.class.name()
        );
    }
    let stop = async {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async {
                match term.as_mut() {
                    Some(t) => { t.recv().await; }
                    None => std::future::pending::<()>().await,
                }
            } => {}
        }
    };
    let serving = listener.serve(Arc::clone(&server));
    tokio::pin!(serving);
    let code = tokio::select! {
        r = &mut serving => match r {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => crate::fail("serve", "accept", &e.to_string(), false),
        },
        () = stop => {
            // No new connection or request is taken; what was read is answered first.
            eprintln!("tagstripe serve: stopping: answering the requests in flight");
            server.shutdown();
            match serving.await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => crate::fail("serve", "shutdown", &e.to_string(), false),
            }
        }
    };
    // A rebuild still going stops where it is (close records how far it came).
    if let Some(r) = rebuild {
        r.abort();
        let _ = r.await;
        if let Some((m, done, need)) = raid.as_ref().and_then(|r| r.rebuild_progress()) {
            say_err(&format!(
                "md: the rebuild of member {m} stopped at {} of {}: it goes on at the next start",
                mib(done),
                mib(need)
            ));
        }
    }
    // Stop cleanly: make every acknowledged write durable before leaving.
    if !(args.read_only || info.read_only) {
        if let Some(v) = &volume {
            for (i, st) in v.status().iter().enumerate() {
                if let tagstripe::SideStatus::Resyncing { done, total } = st {
                    say_err(&format!(
                        "resync of side {i} stopped at {} of {}: it goes on at the next start",
                        mib(*done),
                        mib(*total)
                    ));
                }
            }
        }
        // A volume closes cleanly: its mirror's bitmap cleared, so the next start copies
        // nothing.
        let flushed = match (&volume, &raid) {
            (Some(v), _) => v.close().await,
            (None, Some(r)) => r.close().await,
            (None, None) => device.flush(IoOpts::new()).await,
        };
        if let Err(e) = flushed {
            eprintln!("tagstripe serve: flush on exit failed: {e}");
            return ExitCode::FAILURE;
        }
    }
    // The log ends after the stop's flush (recorded too, when the device is served
    // directly: the clean shutdown a crash state is compared with).
    if let Some(rec) = &recorder {
        match rec.finish().await {
            Ok(()) => eprintln!("tagstripe serve: recording written to {}", rec.path()),
            Err(e) => {
                eprintln!("tagstripe serve: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    if let Some(t) = &tenants {
        for l in crate::tenants::report(t, started.elapsed().as_secs_f64()) {
            eprintln!("tagstripe serve: {l}");
        }
    }
    eprintln!(
        "tagstripe serve: stopped, flushed; {}",
        counters_line(&server)
    );
    code
}

/// The server's counters in one line: connections, requests, failures, bytes (and those of
/// the bytes read that went to the socket as the page cache's own pages, and of the bytes
/// written that came off the socket into pipes or straight into the device's pages).
fn counters_line(server: &NbdServer) -> String {
    let c = server.counters();
    let get = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    format!(
        "{} connections, {} requests ({} failed), {} bytes read, {} bytes written, {} bytes sent from the page cache, {} bytes received into pipes, {} in place",
        get(&c.connections),
        get(&c.requests),
        get(&c.error_replies),
        get(&c.bytes_read),
        get(&c.bytes_written),
        get(&c.bytes_sent_from_cache),
        get(&c.bytes_received_into_pipes),
        get(&c.bytes_received_in_place),
    )
}

/// Where the server listens: TCP, a Unix socket (removed when the server stops), one
/// connection on standard input and output, or the sockets systemd passed.
enum Listener {
    Tcp(tokio::net::TcpListener, std::net::SocketAddr),
    Unix(tokio::net::UnixListener, UnixPath),
    Stdio,
    Activated(Vec<Listener>),
}

/// A Unix socket's path: the one to unlink when dropped (empty: none), and the one shown.
struct UnixPath(String, String);

impl Drop for UnixPath {
    fn drop(&mut self) {
        if !self.0.is_empty() {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

/// The sockets of systemd socket activation: fds 3 .. 3 + `LISTEN_FDS` when `LISTEN_PID`
/// names this process (sd_listen_fds(3)); `None` otherwise.
fn activation_fds() -> Option<Vec<std::os::fd::OwnedFd>> {
    let pid: u32 = std::env::var("LISTEN_PID").ok()?.parse().ok()?;
    if pid != std::process::id() {
        return None;
    }
    let n: i32 = std::env::var("LISTEN_FDS").ok()?.parse().ok()?;
    if !(1..=64).contains(&n) {
        return None;
    }
    let fds = (3..3 + n)
        .map(|fd| {
            // SAFETY: by the socket activation protocol, fds 3 .. 3 + LISTEN_FDS are open
            // listening sockets handed to this process (LISTEN_PID says it is this one) and
            // owned by nobody else in it; each is taken once, here, and closed only by its
            // `OwnedFd`. Exercised by the serve test that starts tagstripe through libnbd's
            // connect_systemd_socket_activation.
            unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) }
        })
        .collect();
    Some(fds)
}

/// Standard input as a connected stream socket (TCP or Unix), if it is one: a duplicate of
/// fd 0, so standard input itself stays as it is.
fn stdin_socket() -> std::io::Result<Option<tokio::net::UnixStream>> {
    use std::os::fd::AsFd;
    use std::os::unix::fs::FileTypeExt;
    let fd = std::io::stdin().as_fd().try_clone_to_owned()?;
    let file = std::fs::File::from(fd);
    if !file.metadata()?.file_type().is_socket() {
        return Ok(None);
    }
    // A UnixStream reads and writes any connected stream socket's fd, TCP's too.
    let sock = std::os::unix::net::UnixStream::from(std::os::fd::OwnedFd::from(file));
    sock.set_nonblocking(true)?;
    tokio::net::UnixStream::from_std(sock).map(Some)
}

impl Listener {
    async fn bind(spec: &str) -> std::io::Result<Self> {
        if let Some(fds) = activation_fds() {
            return fds
                .into_iter()
                .map(Self::from_fd)
                .collect::<std::io::Result<Vec<_>>>()
                .map(Self::Activated);
        }
        if spec == "-" {
            return Ok(Self::Stdio);
        }
        if let Some(path) = spec.strip_prefix("unix:") {
            let l = tokio::net::UnixListener::bind(path)?;
            return Ok(Self::Unix(l, UnixPath(path.to_owned(), path.to_owned())));
        }
        let l = tokio::net::TcpListener::bind(spec).await?;
        let addr = l.local_addr()?;
        Ok(Self::Tcp(l, addr))
    }

    /// A listening socket systemd passed: TCP or Unix.
    fn from_fd(fd: std::os::fd::OwnedFd) -> std::io::Result<Self> {
        let tcp = std::net::TcpListener::from(fd);
        if let Ok(addr) = tcp.local_addr() {
            tcp.set_nonblocking(true)?;
            return Ok(Self::Tcp(tokio::net::TcpListener::from_std(tcp)?, addr));
        }
        let unix = std::os::unix::net::UnixListener::from(std::os::fd::OwnedFd::from(tcp));
        unix.set_nonblocking(true)?;
        let path = unix
            .local_addr()?
            .as_pathname()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        // Not ours to remove: systemd (or whoever passed it) owns the path.
        let l = tokio::net::UnixListener::from_std(unix)?;
        Ok(Self::Unix(l, UnixPath(String::new(), path)))
    }

    /// The URL clients use for `export` (the name and the socket's path percent-encoded).
    fn url(&self, export: &str) -> String {
        let url = |addr: String, socket: Option<String>| {
            tagstripe::nbd::NbdUrl {
                addr,
                export: export.to_owned(),
                socket,
                tls_certificates: None,
                tls_hostname: None,
            }
            .to_string()
        };
        match self {
            Self::Tcp(_, addr) => url(addr.to_string(), None),
            Self::Unix(_, p) => url(String::new(), Some(p.1.clone())),
            Self::Stdio => "standard input and output (one connection)".to_owned(),
            Self::Activated(ls) => {
                let urls: Vec<String> = ls.iter().map(|l| l.url(export)).collect();
                format!("{} (systemd socket activation)", urls.join(", "))
            }
        }
    }

    async fn serve(self, server: Arc<NbdServer>) -> std::io::Result<()> {
        match self {
            Self::Tcp(l, _) => server.serve(l).await,
            Self::Unix(l, _path) => server.serve_unix(l).await,
            Self::Stdio => {
                let class = server.config().class;
                // Started the inetd way, standard input may be the connected socket itself
                // (and standard output elsewhere, or closed): then both directions go over it,
                // as nbd-server does.
                let served = match stdin_socket()? {
                    Some(sock) => server.serve_connection(sock, class).await,
                    None => {
                        let io = tokio::io::join(tokio::io::stdin(), tokio::io::stdout());
                        server.serve_connection(io, class).await
                    }
                };
                served.map_err(std::io::Error::from)
            }
            Self::Activated(ls) => {
                let all = ls
                    .into_iter()
                    .map(|l| Box::pin(l.serve(Arc::clone(&server))));
                futures_util::future::try_join_all(all).await.map(|_| ())
            }
        }
    }
}
