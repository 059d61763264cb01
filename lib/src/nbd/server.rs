//! The NBD server: exports block devices (volumes) to any NBD client.

use std::collections::BTreeMap;
use std::os::fd::AsFd;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use bytes::{BufMut, Bytes};
use futures_util::future::Either;
use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use tagstripe_scheduler::IoClass;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::Semaphore;

use super::sendfile::Sender;
use super::splice::{HAND_OFF_FROM, HAND_OFF_MAX, Receiver};
use crate::landing::LAND_FROM;
use crate::{BlockDevice, DynBlockDevice, Error, IoOpts, Landing, Piped, Volume, Zeroes};
use tagstripe_nbd_proto::proto::errno;
use tagstripe_nbd_proto::session::{
    BlockLimits, Catalog, ComponentLayout, ExportCaps, ExportEntry, Failure, Op, OpKind, Outcome,
    ServerSession, SessionConfig, SessionStats, TlsPolicy,
};

/// One export of a server: a device (or a volume) under a name, how it is offered, and the
/// I/O class of its requests. Build it, then hand it to [`NbdServer::export_entry`].
///
/// ```
/// use std::sync::Arc;
/// use tagstripe::nbd::{Export, NbdServer, ServerConfig};
/// use tagstripe::scheduler::IoClass;
/// use tagstripe::{MemDevice, Volume};
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let vol = Arc::new(Volume::builder((0..2).map(|i| Arc::new(MemDevice::new(&format!("m{i}"), 4096)))).build()?);
/// let server = NbdServer::new(ServerConfig::default())
///     .export_entry(Export::volume("vm", Arc::clone(&vol)).description("a VM's disk"))
///     .export_entry(Export::volume("backup", vol).class(IoClass::Bulk).read_only(true));
/// # let _ = server;
/// # Ok::<(), tagstripe::Error>(())
/// # }).unwrap();
/// ```
#[derive(Clone, Debug)]
pub struct Export {
    name: String,
    device: Arc<dyn DynBlockDevice>,
    volume: Option<Arc<Volume>>,
    description: String,
    read_only: bool,
    class: Option<IoClass>,
}

impl Export {
    /// `device` exported as `name`, writable unless the device is read-only.
    #[must_use]
    pub fn device(name: &str, device: Arc<dyn DynBlockDevice>) -> Self {
        Self {
            name: name.to_owned(),
            read_only: device.info().read_only,
            device,
            volume: None,
            description: String::new(),
            class: None,
        }
    }

    /// A volume exported as `name`: as [`device`](Self::device), and clients may also select
    /// the `tagstripe:component` metadata context to see which component holds each extent.
    #[must_use]
    pub fn volume(name: &str, volume: Arc<Volume>) -> Self {
        let mut e = Self::device(name, Arc::clone(&volume) as Arc<dyn DynBlockDevice>);
        e.volume = Some(volume);
        e
    }

    /// A description for clients (`NBD_INFO_DESCRIPTION`; `nbdinfo` shows it).
    #[must_use]
    pub fn description(mut self, text: &str) -> Self {
        text.clone_into(&mut self.description);
        self
    }

    /// Refuse writes, zeroing and discards (a read-only device is refused them anyway).
    #[must_use]
    pub fn read_only(mut self, on: bool) -> Self {
        self.read_only = on || self.device.info().read_only;
        self
    }

    /// The I/O class of this export's requests, instead of the server's
    /// ([`ServerConfig::class`]): a backup job's export of a volume in the `bulk` class.
    #[must_use]
    pub fn class(mut self, class: IoClass) -> Self {
        self.class = Some(class);
        self
    }

    /// The export's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What the protocol's session is told of it.
    fn entry(&self) -> ExportEntry {
        let info = self.device.info();
        let caps = self.device.caps();
        let mut e = ExportEntry::new(&self.name, info.bytes());
        e.limits = BlockLimits {
            logical_block_size: info.limits.logical_block_size,
            physical_block_size: info.limits.physical_block_size,
            io_opt: info.limits.io_opt,
        };
        e.caps = ExportCaps {
            flush: caps.flush,
            fua: caps.fua,
            trim: caps.trim,
            rotational: caps.rotational,
        };
        e.description.clone_from(&self.description);
        e.read_only = self.read_only;
        e.layout = self
            .volume
            .clone()
            .map(|v| Arc::new(Layout(v)) as Arc<dyn ComponentLayout>);
        e
    }
}

/// A volume's layout as the protocol's session asks for it.
#[derive(Debug)]
struct Layout(Arc<Volume>);

impl ComponentLayout for Layout {
    fn component_map(&self, start: u64, sectors: u64) -> Option<Vec<(u64, usize, Option<usize>)>> {
        self.0.component_map(start, sectors).ok()
    }
}

/// An export as the server runs it: the device, the class, and the lock that keeps a
/// read-modify-write of an unaligned write apart from every other write to it.
#[derive(Debug)]
struct Served {
    export: Export,
    rmw: Arc<tokio::sync::RwLock<()>>,
}

/// How the server treats its clients.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The largest read or write a client may send, in bytes, advertised as the maximum
    /// block size (default 32 MiB). Larger requests get `EINVAL`.
    pub max_request: u32,
    /// Requests in flight per connection (default 128); the next request is read only when
    /// one finishes.
    pub max_in_flight: usize,
    /// Bytes of request and reply data held per connection (default 128 MiB): with
    /// `max_in_flight`, what bounds a connection's memory.
    pub max_buffered: u32,
    /// The I/O class of every connection's requests, unless its export names one
    /// ([`Export::class`]).
    pub class: IoClass,
    /// Time a client has to finish the handshake (default 10 s, as qemu-nbd's).
    pub handshake_timeout: Duration,
    /// Connections served at once (default 1024). When every one is taken, a newcomer is
    /// not kept waiting behind clients that say nothing: the connection that has
    /// negotiated least (nothing received before one still negotiating; the oldest first)
    /// is closed to make room, and counted in [`ServerCounters::evicted`]. Connections in
    /// transmission are never closed for a newcomer: with all of them there, it waits.
    pub max_connections: usize,
    /// TCP peers that may connect (default: everyone); others are closed before
    /// negotiation and counted in [`ServerCounters::refused`].
    pub allow: super::AllowList,
    /// TLS off, offered, or required (default off). On or required needs `tls_config`.
    pub tls: TlsPolicy,
    /// The server's certificate, key and client verification (feature `tls`; see
    /// [`super::tls::server_config`]).
    #[cfg(feature = "tls")]
    pub tls_config: Option<Arc<rustls::ServerConfig>>,
    /// The TCP congestion control asked for on connections from this host (the peer's
    /// address a loopback one or the server's own), default `cubic`; `None` keeps the
    /// system's (`net.ipv4.tcp_congestion_control`). A pacing one (BBR) on a loopback path,
    /// where no queue builds, only spaces the server's replies out: 1 MiB reads over TCP on
    /// loopback, a loop device through its page cache, the same binary with `cubic` against
    /// BBR (the system's), alternated, two sets of 3 rounds: one connection 1.24-1.54x the
    /// reads a second at 0.18-0.21 CPU seconds a GiB against 0.24-0.30, four 1.22-1.35x
    /// (docs/nbd-performance.md). Connections from elsewhere keep the system's. A name the
    /// kernel refuses (not in `net.ipv4.tcp_allowed_congestion_control` for an unprivileged
    /// server) changes nothing but speed: warned of once, and not counted in
    /// [`ServerCounters::local_congestion_set`].
    pub local_congestion: Option<String>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        // The per-connection limits are the session's own defaults.
        let session = SessionConfig::default();
        Self {
            max_request: session.max_request,
            max_in_flight: session.max_in_flight,
            max_buffered: u32::try_from(session.max_buffered).unwrap_or(u32::MAX),
            class: IoClass::BestEffort,
            handshake_timeout: Duration::from_secs(10),
            max_connections: 1024,
            allow: super::AllowList::default(),
            tls: TlsPolicy::Off,
            #[cfg(feature = "tls")]
            tls_config: None,
            local_congestion: Some("cubic".to_owned()),
        }
    }
}

/// Counters of what the server has done, for tests and monitoring.
#[derive(Debug, Default)]
pub struct ServerCounters {
    /// Connections accepted.
    pub connections: AtomicU64,
    /// Connections that reached the transmission phase.
    pub transmissions: AtomicU64,
    /// Connections closed because of a protocol violation.
    pub protocol_errors: AtomicU64,
    /// TCP connections closed at once because the peer is not on the allow-list.
    pub refused: AtomicU64,
    /// Requests read off the wire.
    pub requests: AtomicU64,
    /// Requests answered (successfully or with an error).
    pub replies: AtomicU64,
    /// Requests answered with an error.
    pub error_replies: AtomicU64,
    /// Bytes read from the exports for clients (holes sent as holes included).
    pub bytes_read: AtomicU64,
    /// Bytes written to the exports for clients.
    pub bytes_written: AtomicU64,
    /// Connections still negotiating that were closed to make room for a newcomer (see
    /// [`ServerConfig::max_connections`]).
    pub evicted: AtomicU64,
    /// Bytes of read replies handed to a Unix socket as the page cache's own pages
    /// (through a pipe, or `sendfile`) instead of copied into the socket.
    pub bytes_sent_from_cache: AtomicU64,
    /// Bytes of write payloads taken off the socket into a pipe (`splice`), for the device
    /// to write from it: never copied into the server's memory (over TCP, to a file or
    /// block device through the page cache: see [`BlockDevice::write_piped`]).
    pub bytes_received_into_pipes: AtomicU64,
    /// Bytes of write payloads received from the socket straight into the device's pages
    /// (a file in memory: see [`Landing`]): copied once, by the kernel, and never through
    /// the server's memory or `pwrite`.
    pub bytes_received_in_place: AtomicU64,
    /// TCP connections from this host given [`ServerConfig::local_congestion`].
    pub local_congestion_set: AtomicU64,
}

/// How far a connection has come, for choosing which gives way when every slot is taken.
const PHASE_SILENT: u8 = 0;
/// Some negotiation received.
const PHASE_NEGOTIATING: u8 = 1;
/// In transmission: never evicted.
const PHASE_TRANSMITTING: u8 = 2;

/// One connection as the accept loop sees it.
#[derive(Debug)]
struct Slot {
    /// How far it has come (`PHASE_*`), set by its task.
    phase: AtomicU8,
    /// Told to close (it gives way to a newcomer).
    evict: tokio::sync::Notify,
    /// Already told.
    evicting: AtomicBool,
}

impl Slot {
    fn new() -> Self {
        Self {
            phase: AtomicU8::new(PHASE_SILENT),
            evict: tokio::sync::Notify::new(),
            evicting: AtomicBool::new(false),
        }
    }
}

/// The connections being served, by the order they were accepted.
#[derive(Debug, Default)]
struct Slots(parking_lot::Mutex<BTreeMap<u64, Arc<Slot>>>);

impl Slots {
    /// Tells the connection that has negotiated least (the oldest among equals) to close;
    /// whether there was one.
    fn evict_one(&self) -> bool {
        let all = self.0.lock();
        let victim = all
            .values()
            .filter(|c| !c.evicting.load(Relaxed))
            .filter(|c| c.phase.load(Relaxed) < PHASE_TRANSMITTING)
            .min_by_key(|c| c.phase.load(Relaxed));
        match victim {
            Some(c) => {
                c.evicting.store(true, Relaxed);
                c.evict.notify_one();
                true
            }
            None => false,
        }
    }
}

/// An NBD server exporting block devices by name: the protocol as today's clients speak it
/// (fixed newstyle; `INFO`/`GO` with block sizes; structured replies with holes in sparse
/// reads; extended headers with 64-bit lengths; the `base:allocation` and
/// `tagstripe:component` metadata contexts for block status; `CACHE`, fast zero, `DF`).
/// Any NBD client works with it: qemu, nbdkit's and libnbd's tools, the Linux nbd driver,
/// and [`super::NbdDevice`].
///
/// Each connection is one task driving a [`ServerSession`] (the protocol, with no I/O):
/// many requests are in flight per connection and answered as they finish; a failed write
/// is never acknowledged; bad requests get the protocol's error reply and malformed
/// negotiation closes only that connection.
///
/// ```
/// use std::sync::Arc;
/// use bytes::Bytes;
/// use tagstripe::nbd::{NbdDevice, NbdServer, ServerConfig};
/// use tagstripe::{BlockDevice, IoOpts, MemDevice};
/// # tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap().block_on(async {
/// let server = NbdServer::new(ServerConfig::default())
///     .export("disk", Arc::new(MemDevice::new("mem0", 2048)));
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
/// let addr = listener.local_addr()?;
/// tokio::spawn(Arc::new(server).serve(listener));
///
/// let client = NbdDevice::connect(&format!("nbd://{addr}/disk")).await?;
/// client.write(8, Bytes::from(vec![9u8; 4096]), IoOpts::new()).await?;
/// assert_eq!(client.read(8, 8, IoOpts::new()).await?, vec![9u8; 4096]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Debug)]
pub struct NbdServer {
    catalog: Arc<Catalog>,
    /// Each export's device, class and read-modify-write lock, by name.
    served: BTreeMap<String, Arc<Served>>,
    config: ServerConfig,
    counters: ServerCounters,
    /// A refusal of [`ServerConfig::local_congestion`] was warned of.
    congestion_warned: AtomicBool,
    /// Set by [`NbdServer::shutdown`]; watched by the accept loop and every connection.
    stop: tokio::sync::watch::Sender<bool>,
}

impl NbdServer {
    /// A server with no exports yet. Zero limits in `config` are raised to one (a request
    /// in flight, a connection, a request of one 4 KiB block), and the byte budget to at least
    /// one largest request, so that no setting can stall a connection for good.
    #[must_use]
    pub fn new(mut config: ServerConfig) -> Self {
        config.max_in_flight = config.max_in_flight.max(1);
        config.max_connections = config.max_connections.max(1);
        config.max_request = config.max_request.max(4096);
        config.max_buffered = config.max_buffered.max(config.max_request);
        Self {
            catalog: Arc::new(Catalog::new()),
            served: BTreeMap::new(),
            config,
            counters: ServerCounters::default(),
            congestion_warned: AtomicBool::new(false),
            stop: tokio::sync::watch::channel(false).0,
        }
    }

    /// Begins a clean shutdown: the server stops accepting connections and stops reading
    /// new requests on every connection; requests already read run to the end and get their
    /// replies; then each connection closes, every writable export is flushed, and
    /// [`serve`](Self::serve) / [`serve_unix`](Self::serve_unix) return. A write in flight at
    /// shutdown is thus completed and flushed (or answered with its error) before they
    /// return, and nothing lands after the final flush.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tagstripe::nbd::{NbdServer, ServerConfig};
    /// use tagstripe::MemDevice;
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let server = Arc::new(
    ///     NbdServer::new(ServerConfig::default()).export("m", Arc::new(MemDevice::new("m", 1024))),
    /// );
    /// let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    /// let serving = tokio::spawn(Arc::clone(&server).serve(listener));
    /// server.shutdown();
    /// serving.await.unwrap()?; // returns once connections are done and exports flushed
    /// # Ok::<(), std::io::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn shutdown(&self) {
        self.stop.send_replace(true);
    }

    /// Whether [`shutdown`](Self::shutdown) was called.
    #[must_use]
    pub fn is_shutting_down(&self) -> bool {
        *self.stop.borrow()
    }

    /// Exports `device` as `name`. The first export is also the default one (the empty
    /// name).
    #[must_use]
    pub fn export(self, name: &str, device: Arc<dyn DynBlockDevice>) -> Self {
        self.export_entry(Export::device(name, device))
    }

    /// Exports `device` as `name` with a description, read-only if asked (or if the
    /// device is).
    #[must_use]
    pub fn export_with(
        self,
        name: &str,
        device: Arc<dyn DynBlockDevice>,
        description: &str,
        read_only: bool,
    ) -> Self {
        self.export_entry(
            Export::device(name, device)
                .description(description)
                .read_only(read_only),
        )
    }

    /// Exports a volume as `name`: as [`export_with`](Self::export_with), and clients may
    /// also select the `tagstripe:component` metadata context to see which component holds
    /// each extent.
    #[must_use]
    pub fn export_volume(
        self,
        name: &str,
        volume: Arc<Volume>,
        description: &str,
        read_only: bool,
    ) -> Self {
        self.export_entry(
            Export::volume(name, volume)
                .description(description)
                .read_only(read_only),
        )
    }

    /// Adds an export described in full (its own I/O class, say: a backup job's export of
    /// the same volume in the `bulk` class). One of the same name is replaced.
    #[must_use]
    pub fn export_entry(mut self, e: Export) -> Self {
        Arc::make_mut(&mut self.catalog).insert(e.entry());
        self.served.insert(
            e.name.clone(),
            Arc::new(Served {
                export: e,
                rmw: Arc::new(tokio::sync::RwLock::new(())),
            }),
        );
        self
    }

    /// What the server has done so far.
    pub fn counters(&self) -> &ServerCounters {
        &self.counters
    }

    /// The configuration.
    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    /// Accepts TCP connections until the listener fails, serving each on its own task.
    ///
    /// # Errors
    /// The listener's error.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) -> std::io::Result<()> {
        let l = &listener;
        let me = &self;
        self.clone()
            .accept_loop(move || async move {
                loop {
                    let (s, peer) = l.accept().await?;
                    if me.config.allow.allows(peer.ip()) {
                        tracing::info!(target: "tagstripe::nbd", peer = %peer, "connection");
                        let _ = s.set_nodelay(true);
                        me.congestion_for_local(&s, peer.ip());
                        // No replies from the page cache over TCP: see `sendfile.rs`;
                        // payloads into pipes: see `splice.rs`.
                        let raw = Raw {
                            send: None,
                            receive: Receiver::new(s.as_fd()),
                            pipes: true,
                            sock: None,
                        };
                        return Ok((s, raw));
                    }
                    // Not on the allow-list: closed before a byte is sent.
                    me.counters.refused.fetch_add(1, Relaxed);
                    tracing::warn!(target: "tagstripe::nbd", peer = %peer, "connection refused: not on the allow-list");
                    drop(s);
                }
            })
            .await
    }

    /// Gives TCP connection `s` from `peer` the configured congestion control if the peer
    /// is on this host ([`ServerConfig::local_congestion`]).
    fn congestion_for_local(&self, s: &tokio::net::TcpStream, peer: std::net::IpAddr) {
        let Some(cc) = &self.config.local_congestion else {
            return;
        };
        let local =
            peer.to_canonical().is_loopback() || s.local_addr().is_ok_and(|a| a.ip() == peer);
        if !local {
            return;
        }
        match set_congestion(s, cc) {
            Ok(()) => {
                self.counters.local_congestion_set.fetch_add(1, Relaxed);
            }
            Err(e) => {
                if !self.congestion_warned.swap(true, Relaxed) {
                    tracing::warn!(
                        target: "tagstripe::nbd",
                        congestion = %cc,
                        error = %e,
                        "the kernel refused this congestion control for connections from this host; they keep the system's"
                    );
                }
            }
        }
    }

    /// Accepts connections on a Unix socket until the listener fails (clients reach it as
    /// `nbd+unix:///NAME?socket=PATH`). Large reads of cached data go to the socket as the
    /// page cache's own pages (through a pipe, or `sendfile`), not copied.
    ///
    /// # Errors
    /// The listener's error.
    pub async fn serve_unix(self: Arc<Self>, listener: UnixListener) -> std::io::Result<()> {
        let l = &listener;
        self.accept_loop(move || async move {
            let s = l.accept().await?.0;
            grow_send_buffer(&s);
            // Write payloads are read as usual here, or received in place: see `splice.rs`.
            let raw = Raw {
                send: Sender::new(s.as_fd()),
                receive: None,
                pipes: false,
                sock: s.as_fd().try_clone_to_owned().ok(),
            };
            Ok((s, raw))
        })
        .await
    }

    /// Takes connections from `accept`, at most `max_connections` at once, each on its own
    /// task with the configured class.
    async fn accept_loop<S, F, Fut>(self: Arc<Self>, mut accept: F) -> std::io::Result<()>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        F: FnMut() -> Fut,
        Fut: Future<Output = std::io::Result<(S, Raw)>>,
    {
        let slots = Arc::new(Semaphore::new(self.config.max_connections));
        let conns = Arc::new(Slots::default());
        let mut stop = self.stop.subscribe();
        let mut next_id = 0u64;
        loop {
            let (stream, raw) = tokio::select! {
                s = accept() => s?,
                _ = stop.wait_for(|&v| v) => break,
            };
            let permit = match Arc::clone(&slots).try_acquire_owned() {
                Ok(p) => p,
                Err(_) => {
                    // Every slot is taken: a client that has said least gives way, so a
                    // flood of silent connections cannot lock a real client out.
                    if conns.evict_one() {
                        self.counters.evicted.fetch_add(1, Relaxed);
                    }
                    let permit = tokio::select! {
                        p = Arc::clone(&slots).acquire_owned() => p,
                        _ = stop.wait_for(|&v| v) => break,
                    };
                    let Ok(p) = permit else { break };
                    p
                }
            };
            let id = next_id;
            next_id += 1;
            let slot = Arc::new(Slot::new());
            conns.0.lock().insert(id, Arc::clone(&slot));
            let me = Arc::clone(&self);
            let conns = Arc::clone(&conns);
            tokio::spawn(async move {
                let class = me.config.class;
                let _ = me.serve_slot(stream, class, Some(&slot), raw).await;
                conns.0.lock().remove(&id);
                drop(permit);
            });
        }
        // Shutting down: wait until every connection has answered what it read and closed,
        // then flush what was written.
        let all = u32::try_from(self.config.max_connections).unwrap_or(u32::MAX);
        let _ = slots.acquire_many(all).await;
        self.flush_exports().await
    }

    /// Flushes every writable export (at shutdown); the first failure is returned, naming
    /// the export, after trying them all.
    async fn flush_exports(&self) -> std::io::Result<()> {
        let mut first = None;
        for (name, e) in &self.served {
            if !e.export.read_only {
                if let Err(err) = e.export.device.flush(IoOpts::new()).await {
                    first.get_or_insert_with(|| {
                        std::io::Error::other(format!(
                            "flush of export {name:?} at shutdown: {err}"
                        ))
                    });
                }
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Serves one connection (any byte stream: TCP, a Unix socket, an in-memory pipe)
    /// from the handshake to the end, with this I/O class for its requests (unless its
    /// export names one).
    ///
    /// # Errors
    /// [`Error::Protocol`] if the client broke the protocol (the connection is closed).
    pub async fn serve_connection<S>(&self, stream: S, class: IoClass) -> Result<(), Error>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        self.serve_slot(stream, class, None, Raw::default()).await
    }

    /// [`serve_connection`](Self::serve_connection), in `slot` of the accept loop's (its
    /// phase kept up to date; closed if told to give way), with `raw` sending replies from
    /// the page cache and taking write payloads into pipes where it can (not over TLS).
    async fn serve_slot<S>(
        &self,
        stream: S,
        class: IoClass,
        slot: Option<&Slot>,
        raw: Raw,
    ) -> Result<(), Error>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        self.counters.connections.fetch_add(1, Relaxed);
        // Without TLS credentials, TLS cannot be offered whatever the policy says.
        #[cfg(feature = "tls")]
        let tls = match &self.config.tls_config {
            Some(_) => self.config.tls,
            None => TlsPolicy::Off,
        };
        #[cfg(not(feature = "tls"))]
        let tls = TlsPolicy::Off;
        let config = SessionConfig {
            max_request: self.config.max_request,
            max_in_flight: self.config.max_in_flight,
            max_buffered: self.config.max_buffered.into(),
            tls,
        };
        let mut s = ServerSession::new(Arc::clone(&self.catalog), config);
        let mut d = Drive {
            deadline: tokio::time::Instant::now() + self.config.handshake_timeout,
            seen: SessionStats::default(),
            counted: false,
            timed_out: false,
            evicted: false,
            slot,
            class,
        };
        let upgraded = self.drive(&mut s, stream, &mut d, &raw).await;
        #[cfg_attr(not(feature = "tls"), allow(unused_mut))]
        let mut tls_failure: Option<String> = None;
        if let Some(raw) = upgraded {
            #[cfg(feature = "tls")]
            if let Some(cfg) = &self.config.tls_config {
                let acceptor = tokio_rustls::TlsAcceptor::from(Arc::clone(cfg));
                let left = d
                    .deadline
                    .saturating_duration_since(tokio::time::Instant::now());
                let evict = async {
                    match slot {
                        Some(slot) => slot.evict.notified().await,
                        None => std::future::pending().await,
                    }
                };
                let handshake = tokio::select! {
                    r = tokio::time::timeout(left, acceptor.accept(raw)) => Some(r),
                    () = evict => None,
                };
                match handshake {
                    None => d.evicted = true,
                    Some(Ok(Ok(stream))) => {
                        if s.tls_established().is_ok() {
                            let _ = self.drive(&mut s, stream, &mut d, &Raw::default()).await;
                        }
                    }
                    Some(Ok(Err(e))) => tls_failure = Some(super::tls::handshake_failure(&e)),
                    Some(Err(_)) => d.timed_out = true,
                }
            }
            #[cfg(not(feature = "tls"))]
            drop(raw);
        }
        self.count(s.stats(), &mut d);
        if let Some(e) = tls_failure {
            self.counters.protocol_errors.fetch_add(1, Relaxed);
            tracing::warn!(target: "tagstripe::nbd", error = %e, "TLS handshake failed");
            return Err(Error::Tls {
                path: "client".to_owned(),
                what: e,
            });
        }
        if d.timed_out {
            self.counters.protocol_errors.fetch_add(1, Relaxed);
            return Err(protocol("handshake timed out"));
        }
        if d.evicted {
            tracing::info!(
                target: "tagstripe::nbd",
                "connection closed while negotiating: every slot was taken and a newcomer came"
            );
            return Err(protocol(
                "closed while negotiating to make room for a new connection",
            ));
        }
        if let Some(e) = s.error() {
            self.counters.protocol_errors.fetch_add(1, Relaxed);
            return Err(protocol(e.to_string()));
        }
        Ok(())
    }

    /// Adds to the server's counters what the session counted since `d.seen`.
    fn count(&self, st: SessionStats, d: &mut Drive) {
        if st == d.seen {
            return;
        }
        self.counters
            .requests
            .fetch_add(st.requests - d.seen.requests, Relaxed);
        self.counters
            .replies
            .fetch_add(st.replies - d.seen.replies, Relaxed);
        self.counters
            .error_replies
            .fetch_add(st.error_replies - d.seen.error_replies, Relaxed);
        d.seen = st;
    }

    /// Runs session `s` over `stream` until the connection is over (`None`), or until the
    /// client's `STARTTLS` was acknowledged: then the stream is handed back, whole, for the
    /// TLS handshake. Through `raw` (the plain socket under `stream`), replies with payloads
    /// from the page cache go out as its pages (a pipe, `sendfile`) and large write payloads
    /// come in with `splice`, or straight into the device's pages (see [`Landing`]), where
    /// it has them.
    async fn drive<S>(
        &self,
        s: &mut ServerSession,
        stream: S,
        d: &mut Drive<'_>,
        raw: &Raw,
    ) -> Option<S>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let (mut r, w) = tokio::io::split(stream);
        let (mut w, mut out) = (w, Vec::new());
        let mut stop = self.stop.subscribe();
        let deadline = tokio::time::sleep_until(d.deadline);
        tokio::pin!(deadline);
        let mut running: FuturesUnordered<Pin<Box<dyn Future<Output = Done> + Send + '_>>> =
            FuturesUnordered::new();
        let (mut eof, mut broken, mut stopped) = (false, false, false);
        let mut export: Option<Arc<Served>> = None;
        let class = d.class;
        // A write whose payload is being taken off the socket (into a pipe, or in place):
        // the op, where its payload goes, and the bytes it will hold.
        let mut taking: Option<(Op, Taking, usize)> = None;
        // Payloads are handed off to be received in place (the export's device lends its
        // pages), not into pipes; through `raw.receive`, or this receiver made for it.
        let mut landing = false;
        let mut own_rx: Option<Receiver> = None;
        let zc = raw.send.as_ref();
        loop {
            // The counters follow the session as it goes.
            self.count(s.stats(), d);
            // Send what is ready (the budget of what was sent is freed as it is taken), in
            // one gathered write where the stream takes one.
            out.extend(std::iter::from_fn(|| s.take_output()));
            if !out.is_empty() && !broken {
                let sent = match zc.and_then(|zc| Some((zc, zc.plan(&out)?))) {
                    Some((zc, plan)) => zc.send(&out, plan).await.map(|n| {
                        self.counters.bytes_sent_from_cache.fetch_add(n, Relaxed);
                    }),
                    None => send_all(&mut w, &out).await,
                };
                if let Err(e) = sent {
                    tracing::debug!(target: "tagstripe::nbd", error = %e, "sending replies failed");
                    broken = true;
                }
            }
            out.clear();
            if broken && !eof {
                // The client is gone: answer nothing more, finish what is in flight.
                eof = true;
                s.end_of_input();
            }
            if eof {
                if let Some((op, ..)) = taking.take() {
                    // Its payload will not come: the write fails (and is answered to no one).
                    let msg = "the connection closed inside the write's payload".to_owned();
                    s.complete(op.id, Err((errno::EIO, msg)));
                }
            }
            if s.take_starttls() && !broken {
                // Negotiation has nothing in flight: the stream goes to the handshake.
                return Some(r.unsplit(w));
            }
            while let Some(mut op) = s.poll_op() {
                // The export cannot change once ops flow: looked up once per connection.
                if export.is_none() {
                    export = s.export().and_then(|e| self.served.get(&e.name)).cloned();
                }
                if op.on_stream > 0 {
                    // The rest of its payload is taken off the socket below, before the
                    // session reads on (the last op it lets out until then).
                    let head = match &mut op.kind {
                        OpKind::Write(head) => std::mem::take(head),
                        _ => Bytes::new(),
                    };
                    let total = usize::try_from(op.length).unwrap_or(usize::MAX);
                    let to = match export.as_ref().filter(|_| landing) {
                        Some(e) => land(e, &op, &head),
                        None => None,
                    };
                    let to = to.unwrap_or_else(|| {
                        // Into memory where a pipe is no gain (a Unix socket, a payload
                        // under the size pipes pay from).
                        let room = if raw.pipes && op.on_stream >= HAND_OFF_FROM {
                            usize::try_from(op.on_stream).unwrap_or(usize::MAX)
                        } else {
                            0
                        };
                        Taking::Pipe(Piped::new(head, room))
                    });
                    taking = Some((op, to, total));
                    continue;
                }
                if let Some(e) = &export {
                    running.push(Box::pin(self.run(Arc::clone(e), class, op, None)));
                }
            }
            if !d.counted && s.transmitting() {
                d.counted = true;
                // Large write payloads in place, where the device lends its pages, else
                // into pipes (TCP), where the device writes from them.
                let e = s.export().and_then(|e| self.served.get(&e.name));
                if let Some(e) = e.filter(|e| !e.export.read_only) {
                    let dev = &e.export.device;
                    if dev.lands_writes() {
                        if raw.receive.is_none() {
                            own_rx = raw.sock.as_ref().and_then(|s| Receiver::new(s.as_fd()));
                        }
                        landing = raw.receive.is_some() || own_rx.is_some();
                    }
                    if landing {
                        s.hand_off_payloads(Some((LAND_FROM as u64, HAND_OFF_MAX)));
                    } else if raw.receive.is_some() && raw.pipes && dev.takes_piped_writes() {
                        s.hand_off_payloads(Some((HAND_OFF_FROM, HAND_OFF_MAX)));
                    }
                }
                self.counters.transmissions.fetch_add(1, Relaxed);
                if let Some(slot) = d.slot {
                    slot.phase.store(PHASE_TRANSMITTING, Relaxed);
                }
            }
            if s.is_finished() && running.is_empty() {
                break;
            }
            if !stopped && *stop.borrow() {
                // Shutting down: no new request is read; those read are answered.
                stopped = true;
                s.stop();
                continue;
            }
            let want_read = s.wants_input() && !eof;
            let negotiating = s.negotiating();
            let evict = async {
                match d.slot {
                    Some(slot) => slot.evict.notified().await,
                    None => std::future::pending().await,
                }
            };
            let is_taking = taking.is_some();
            // Up to the end of the next header where the session asks it (a large write's
            // payload then stays on the stream for the device's pages).
            let limit = s.input_limit().unwrap_or(usize::MAX);
            let mut input = BufMut::limit(s.input_buffer(), limit);
            let take = async {
                match (&mut taking, own_rx.as_ref().or(raw.receive.as_ref())) {
                    (Some((_, Taking::Pipe(p), total)), Some(rx)) => rx.fill(p, *total).await,
                    (Some((_, Taking::Land(l, rmw), _)), Some(rx)) => rx.land(l, rmw).await,
                    _ => std::future::pending().await,
                }
            };
            let event = tokio::select! {
                // Plugged: the requests the ops start in one poll reach each device in
                // one submission.
                Some(done) = crate::Plugged::new(running.next()), if !running.is_empty() => Event::Done(done),
                n = r.read_buf(&mut input), if want_read => Event::Read(n),
                t = take, if is_taking => Event::Taken(t),
                _ = stop.changed(), if !stopped => Event::Stop,
                () = &mut deadline, if negotiating => Event::Timeout,
                () = evict, if negotiating && !d.evicted => Event::Evict,
            };
            match event {
                Event::Done((id, len, res)) => {
                    s.complete(id, res);
                    // Ops that finish as they are polled (cached reads, writes to the page
                    // cache) are run on and answered in the same write, up to BATCH_BYTES
                    // of payload: one send (and one wakeup of the client) for a burst of
                    // small replies, not one each; a large op's reply goes out at once.
                    let mut batch = len;
                    while batch < BATCH_BYTES {
                        let Some(Some((id, len, res))) =
                            crate::Plugged::new(running.next()).now_or_never()
                        else {
                            break;
                        };
                        batch += len;
                        s.complete(id, res);
                    }
                }
                Event::Taken(Ok(())) => match taking.take() {
                    Some((op, Taking::Pipe(p), _)) => {
                        self.counters
                            .bytes_received_into_pipes
                            .fetch_add(p.in_pipe() as u64, Relaxed);
                        s.payload_taken();
                        if let Some(e) = &export {
                            running.push(Box::pin(self.run(Arc::clone(e), class, op, Some(p))));
                        }
                    }
                    Some((op, Taking::Land(l, _), _)) => {
                        s.payload_taken();
                        if let Some(e) = &export {
                            running.push(Box::pin(self.landed(Arc::clone(e), op, l)));
                        }
                    }
                    None => {}
                },
                Event::Taken(Err(e)) => {
                    tracing::debug!(target: "tagstripe::nbd", error = %e, "receiving a write's payload failed");
                    eof = true;
                    s.end_of_input();
                }
                Event::Read(Ok(0) | Err(_)) => {
                    eof = true;
                    s.end_of_input();
                }
                Event::Read(Ok(_)) => {
                    if let Some(slot) = d.slot {
                        if negotiating {
                            slot.phase.fetch_max(PHASE_NEGOTIATING, Relaxed);
                        }
                    }
                    if let Err(e) = s.process() {
                        tracing::warn!(target: "tagstripe::nbd", error = %e, "closing the connection");
                    }
                }
                // Seen at the top of the loop.
                Event::Stop => {}
                Event::Timeout => {
                    d.timed_out = true;
                    s.stop();
                }
                Event::Evict => {
                    d.evicted = true;
                    s.stop();
                }
            }
        }
        let _ = w.shutdown().await;
        None
    }

    /// Ends write `op` on export `e`, whose payload was received in place (`l`): what could
    /// not land is written now, with a share of the read-modify-write lock.
    async fn landed(&self, e: Arc<Served>, op: Op, l: Landing) -> Done {
        let (id, len) = (op.id, op.length);
        let in_place = l.in_place();
        let res = if in_place {
            l.finish()
        } else {
            let _share = shared(&e.rmw).await;
            l.finish()
        };
        let res = match res {
            Ok(()) => {
                self.counters.bytes_written.fetch_add(len, Relaxed);
                if in_place {
                    self.counters
                        .bytes_received_in_place
                        .fetch_add(len, Relaxed);
                }
                Ok(Outcome::Done)
            }
            Err(source) => {
                let err = Error::Io {
                    device: e.export.device.info().name.clone(),
                    op: "write",
                    start: op.offset / 512,
                    sectors: len / 512,
                    source,
                };
                let msg = err.to_string();
                Err((to_errno(err), msg))
            }
        };
        (id, len, res)
    }

    /// Runs one op on export `e`, in its class or else the connection's `class`. A write of
    /// [`APART_FROM`] bytes or more runs in a task of its own: the copy of its payload into
    /// the page cache runs on another worker while this connection's task goes on reading
    /// requests and sending replies (1 MiB over a Unix socket, one connection: 1,940-1,971
    /// writes a second in the connection's task, 2,602-2,676 apart). Smaller ones run in
    /// the connection's task, where a task each costs more than it overlaps (64 KiB random
    /// 50/50, 2 runs of 8 cells: apart, 0-7% fewer IOPS and 10-20% more CPU per GiB). Reads
    /// stay too: a cached one is a view of the page cache (`read_to_send`), with no copy to
    /// move away (1 MiB reads of a file in /dev/shm, one connection over a Unix socket,
    /// alternated: 1.06-1.08x the reads a second of running them apart).
    ///
    /// A write whose payload came into a pipe has it in `piped` (its op's data is empty).
    fn run(
        &self,
        e: Arc<Served>,
        class: IoClass,
        op: Op,
        piped: Option<Piped>,
    ) -> impl Future<Output = Done> + Send + '_ {
        let class = e.export.class.unwrap_or(class);
        let max = u64::from(self.config.max_request);
        let (id, len) = (op.id, op.length);
        let counter = match op.kind {
            OpKind::Read => Some(&self.counters.bytes_read),
            OpKind::Write(_) => Some(&self.counters.bytes_written),
            _ => None,
        };
        let apart = matches!(op.kind, OpKind::Write(_)) && len >= APART_FROM;
        // The op's future made here and wrapped (not awaited in an `async` block, which
        // would hold it twice, nor an `async fn`, which holds the arguments twice): the
        // server boxes each request's future, and one of more than 1,032 bytes misses
        // glibc's per-thread cache (a slower allocation, and the free chunks consolidated).
        let fut = run_op(e, class, max, op, piped);
        let fut = if apart {
            Either::Left(tokio::spawn(fut).map(|r| {
                r.unwrap_or_else(|j| Err((errno::EIO, format!("the request's task failed: {j}"))))
            }))
        } else {
            Either::Right(fut)
        };
        fut.map(move |res| {
            if let (Some(c), Ok(_)) = (counter, &res) {
                c.fetch_add(len, Relaxed);
            }
            (id, if counter.is_some() { len } else { 0 }, res)
        })
    }
}

/// A landing for write `op` on export `e` (its payload's first bytes, `head`, put there
/// already, under a share of the read-modify-write lock): `None` if the write asks to be
/// durable (FUA), is not whole blocks, finds a read-modify-write holding or waiting for the
/// lock, or the device lends no pages for it; it then goes the usual way.
fn land(e: &Arc<Served>, op: &Op, head: &Bytes) -> Option<Taking> {
    let dev = &e.export.device;
    let lbs = u64::from(dev.info().limits.logical_block_size.max(512));
    if !matches!(op.kind, OpKind::Write(_))
        || op.fua
        || op.offset % lbs != 0
        || op.length % lbs != 0
    {
        return None;
    }
    let share = e.rmw.try_read().ok()?;
    let mut l = dev.write_landing(op.offset / 512, op.length / 512)?;
    // A head too long for the write cannot be (the session cuts it): refused, not landed.
    l.put(head).ok()?;
    drop(share);
    Some(Taking::Land(l, Arc::clone(&e.rmw)))
}

/// Writes `chunks` (replies' headers and payloads, as the session gives them) one after
/// the other: gathered into as few writes as the stream takes (`writev`, 64 chunks at a
/// time) where it writes vectors, so that a payload is not copied on its way to the kernel;
/// else copied into one buffer first, so that each chunk is not a write (and a TLS record)
/// of its own.
async fn send_all<W: AsyncWrite + Unpin>(w: &mut W, chunks: &[Bytes]) -> std::io::Result<()> {
    if chunks.len() > 1 && !w.is_write_vectored() {
        let mut all = Vec::with_capacity(chunks.iter().map(Bytes::len).sum());
        for c in chunks {
            all.extend_from_slice(c);
        }
        w.write_all(&all).await?;
        return w.flush().await;
    }
    // What is left to send, as std's IoSlice::advance_slices keeps it (empty chunks left
    // out: a write then always has bytes to take).
    let mut left: Vec<std::io::IoSlice<'_>> = chunks
        .iter()
        .filter(|c| !c.is_empty())
        .map(|c| std::io::IoSlice::new(c))
        .collect();
    let mut rest = &mut left[..];
    while !rest.is_empty() {
        let n = w
            .write_vectored(&rest[..rest.len().min(super::sendfile::IOV_AT_ONCE)])
            .await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        std::io::IoSlice::advance_slices(&mut rest, n);
    }
    w.flush().await
}

/// Asks for congestion control `name` (as `net.ipv4.tcp_available_congestion_control` lists
/// them) on TCP socket `s`.
///
/// # Errors
/// The kernel's refusal: `ENOENT` for a name it does not have, `EPERM` for one an
/// unprivileged process may not choose.
fn set_congestion<S: std::os::fd::AsRawFd>(s: &S, name: &str) -> std::io::Result<()> {
    set_option(s, libc::IPPROTO_TCP, libc::TCP_CONGESTION, name)
}

/// Sets socket option `name` at `level` on `s` to the bytes of `value`.
///
/// # Errors
/// The kernel's refusal.
fn set_option<S: std::os::fd::AsRawFd, T: ?Sized>(
    s: &S,
    level: libc::c_int,
    name: libc::c_int,
    value: &T,
) -> std::io::Result<()> {
    // SAFETY: setsockopt reads `size_of_val(value)` bytes from `value`, a live reference,
    // and keeps no pointer; the fd belongs to a socket the caller holds open. Exercised by
    // `the_congestion_control_asked_for_is_the_sockets` and every test of the server over a
    // socket (its send buffer, its congestion control).
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            level,
            name,
            std::ptr::from_ref(value).cast(),
            size_of_val(value) as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Asks for a 4 MiB send buffer on a Unix-socket connection (the kernel caps it at
/// `wmem_max`; its default of about 208 KiB splits each 1 MiB read reply into several writes
/// with a wakeup between them). Best effort: a refusal changes nothing but speed.
fn grow_send_buffer<S: std::os::fd::AsRawFd>(s: &S) {
    let size: libc::c_int = 4 << 20;
    let _ = set_option(s, libc::SOL_SOCKET, libc::SO_SNDBUF, &size);
}

/// A connection's plain socket, for what only a socket does: replies sent from the page
/// cache (Unix sockets), write payloads taken into pipes (TCP) or received in place (a
/// file in memory: either). None of it over TLS, nor for a stream served with
/// [`NbdServer::serve_connection`].
#[derive(Debug, Default)]
struct Raw {
    send: Option<Sender>,
    receive: Option<Receiver>,
    /// Payloads may go into pipes (TCP; a Unix socket's measured slower so).
    pipes: bool,
    /// The socket itself (a descriptor of its own) where `receive` is not made at once: a
    /// Unix socket's, whose payloads are only ever received in place, so that its
    /// receiver is registered only for an export that lends its pages.
    sock: Option<std::os::fd::OwnedFd>,
}

/// Where a write's payload handed off by the session is being taken to.
enum Taking {
    /// A pipe (and memory), for the device to write from.
    Pipe(Piped),
    /// The device's own pages, and the export's read-modify-write lock: each read into
    /// them is made under a share of it (see [`Receiver::land`]).
    Land(Landing, Arc<tokio::sync::RwLock<()>>),
}

/// What one connection's drive keeps across a TLS upgrade.
struct Drive<'a> {
    /// The end of the time allowed for negotiation (TLS handshake included).
    deadline: tokio::time::Instant,
    /// The session's counts already added to the server's counters.
    seen: SessionStats,
    /// The connection was counted as having reached transmission.
    counted: bool,
    timed_out: bool,
    /// Closed to make room for a newcomer.
    evicted: bool,
    /// Its place among the accept loop's connections (none for one served directly).
    slot: Option<&'a Slot>,
    /// The class of its requests on exports that name none.
    class: IoClass,
}

/// An op's id, the bytes it moved (reads and writes) and its outcome.
type Done = (u64, u64, Result<Outcome, Failure>);

enum Event {
    Done(Done),
    /// A write's payload was taken off the socket (or that failed).
    Taken(std::io::Result<()>),
    Read(std::io::Result<usize>),
    Stop,
    Timeout,
    Evict,
}

/// Replies batched into one write while their ops moved fewer bytes than this (see
/// `Server::drive`). Measured, one connection over a Unix socket, a file in /dev/shm,
/// alternated: 4 KiB random reads at QD32 1.19-1.26x the IOPS of a send per reply, random
/// writes 1.08-1.10x (4 connections: 1.47-1.49x), at 15-30% less CPU per GiB; batching
/// without a bound cost 64 KiB random 50/50 5-7%.
const BATCH_BYTES: u64 = 64 << 10;

/// Writes of this many bytes or more run in a task of their own (see `Server::run`).
const APART_FROM: u64 = 256 << 10;

/// Reads of this many bytes or more are read in parts (see `run_op`).
const PARTS_FROM: u64 = 32 << 10;

/// The most a `CACHE` request prefetches; the rest of a larger range is a hint ignored.
const CACHE_MAX: u64 = 128 << 20;

/// A share of `rmw` (the lock that keeps a read-modify-write apart from other writes):
/// taken at once when no read-modify-write holds or waits for it, as nearly always, else
/// waited for behind it (the lock is fair: a waiting read-modify-write takes the permits
/// given back, so `try_read` fails and the share queues after it).
///
/// Taken at once, it is no scheduling point: the lock's own `read` spends a unit of the
/// task's budget every time, and a connection that runs out of budget in the middle of a
/// burst of writes yields; with a second worker idle, that worker took the connection over,
/// and the two then handed it back and forth (a striped volume's 4 KiB writes through the
/// page cache, one job over a Unix socket: 46,000 context switches in 3 s instead of 800,
/// 120-146 k writes a second instead of 166-171 k; see docs/nbd-performance.md).
pub(super) async fn shared(rmw: &tokio::sync::RwLock<()>) -> tokio::sync::RwLockReadGuard<'_, ()> {
    match rmw.try_read() {
        Ok(g) => g,
        Err(_) => rmw.read().await,
    }
}

/// Runs one op against the export's device. Offsets and lengths are bytes; with no block
/// sizes agreed (`!op.strict`) they may be unaligned, and are served by read-modify-write
/// (writes, and zeroing at the edges) with every other write to the export held off.
async fn run_op(
    e: Arc<Served>,
    class: IoClass,
    max: u64,
    op: Op,
    piped: Option<Piped>,
) -> Result<Outcome, Failure> {
    let rmw = &e.rmw;
    let dev = &e.export.device;
    let lbs = u64::from(dev.info().limits.logical_block_size.max(512));
    let opts = IoOpts::new().class(class).fua(op.fua);
    let fail = |err: Error| -> Failure {
        let msg = err.to_string();
        (to_errno(err), msg)
    };
    let (off, len) = (op.offset, op.length);
    let aligned = off % lbs == 0 && len % lbs == 0;
    let a0 = off / lbs * lbs;
    let a1 = (off + len).div_ceil(lbs) * lbs;
    match op.kind {
        // Sent on at once: a device through the page cache may answer with a view of its
        // cached pages, which the socket write copies from (no copy into a buffer first);
        // a striped volume with each of its pieces so (a large read only: a list of parts
        // costs an allocation).
        OpKind::Read if aligned && len >= PARTS_FROM => {
            let parts = dev
                .read_parts_to_send(off / 512, len / 512, opts)
                .await
                .map_err(fail)?;
            Ok(match <[Bytes; 1]>::try_from(parts) {
                Ok([one]) => Outcome::Data(one),
                Err(parts) => Outcome::DataParts(parts),
            })
        }
        OpKind::Read if aligned => dev
            .read_to_send(off / 512, len / 512, opts)
            .await
            .map(Outcome::Data)
            .map_err(fail),
        OpKind::Read => {
            let d = dev
                .read(a0 / 512, (a1 - a0) / 512, opts)
                .await
                .map_err(fail)?;
            Ok(Outcome::Data(
                d.slice((off - a0) as usize..(off - a0 + len) as usize),
            ))
        }
        OpKind::Write(data) if aligned => {
            // Shared with other writes; exclusive only against a read-modify-write.
            let _w = shared(rmw).await;
            match piped {
                Some(p) => dev.write_piped(off / 512, p, opts).await,
                None => dev.write(off / 512, data, opts).await,
            }
            .map_err(fail)?;
            Ok(Outcome::Done)
        }
        OpKind::Write(data) => {
            let data = match piped {
                Some(p) => p.into_bytes().map_err(|e| (errno::EIO, e.to_string()))?,
                None => data,
            };
            let _only = rmw.write().await;
            let mut buf = vec![0u8; (a1 - a0) as usize];
            dev.read_into(a0 / 512, &mut buf, opts)
                .await
                .map_err(fail)?;
            buf[(off - a0) as usize..(off - a0 + len) as usize].copy_from_slice(&data);
            dev.write(a0 / 512, Bytes::from(buf), opts)
                .await
                .map_err(fail)?;
            Ok(Outcome::Done)
        }
        OpKind::Flush if e.export.read_only => Ok(Outcome::Done),
        OpKind::Flush => dev.flush(opts).await.map(|()| Outcome::Done).map_err(fail),
        OpKind::Trim => {
            // Advisory: only the whole blocks inside the range.
            let (t0, t1) = (off.div_ceil(lbs) * lbs, (off + len) / lbs * lbs);
            if t1 > t0 {
                dev.discard(t0 / 512, (t1 - t0) / 512, opts)
                    .await
                    .map_err(fail)?;
            }
            if op.fua {
                dev.flush(opts).await.map_err(fail)?;
            }
            Ok(Outcome::Done)
        }
        OpKind::WriteZeroes { unmap, fast } => {
            let z = Zeroes::new().unmap(unmap).fast_only(fast);
            let zeroed = |r: crate::Result<()>| match r {
                Ok(()) => Ok(Outcome::Done),
                // The protocol's answer when fast zeroing is not possible.
                Err(err) if fast && matches!(err.root(), Error::Unsupported { .. }) => {
                    Err((errno::ENOTSUP, err.to_string()))
                }
                Err(err) => Err(fail(err)),
            };
            if aligned {
                let _w = shared(rmw).await;
                return zeroed(dev.write_zeroes(off / 512, len / 512, z, opts).await);
            }
            if fast {
                return Err((
                    errno::ENOTSUP,
                    "zeroing part of a block needs a read-modify-write, which is not fast"
                        .to_owned(),
                ));
            }
            // The partial blocks at the edges by read-modify-write, the whole ones between
            // them natively.
            let _only = rmw.write().await;
            let (i0, i1) = (off.div_ceil(lbs) * lbs, (off + len) / lbs * lbs);
            for (b0, b1) in [(a0, i0.min(a1)), (i1.max(i0).max(a0), a1)] {
                if b1 <= b0 || (b0 >= i0 && b1 <= i1) {
                    continue;
                }
                let mut buf = vec![0u8; (b1 - b0) as usize];
                dev.read_into(b0 / 512, &mut buf, opts)
                    .await
                    .map_err(fail)?;
                let (z0, z1) = (off.max(b0) - b0, (off + len).min(b1) - b0);
                buf[z0 as usize..z1 as usize].fill(0);
                dev.write(b0 / 512, Bytes::from(buf), opts)
                    .await
                    .map_err(fail)?;
            }
            if i1 > i0 {
                zeroed(dev.write_zeroes(i0 / 512, (i1 - i0) / 512, z, opts).await)?;
            }
            Ok(Outcome::Done)
        }
        OpKind::Cache => {
            // Prefetch in the idle class: the device (or the server behind an NBD
            // component) gets to read ahead; the bytes are dropped.
            let end = a1.min(a0 + CACHE_MAX);
            let step = (max / lbs * lbs).max(lbs);
            let mut at = a0;
            while at < end {
                let n = step.min(end - at);
                dev.read(at / 512, n / 512, opts.class(IoClass::Idle))
                    .await
                    .map_err(fail)?;
                at += n;
            }
            Ok(Outcome::Done)
        }
        OpKind::Allocation => dev
            .allocation(off / 512, len / 512)
            .await
            .map(|v| {
                Outcome::Extents(
                    v.into_iter()
                        .map(|x| tagstripe_nbd_proto::session::Extent {
                            sectors: x.sectors,
                            hole: x.hole,
                            zero: x.zero,
                        })
                        .collect(),
                )
            })
            .map_err(fail),
    }
}

/// The NBD error for a device error.
pub(crate) fn to_errno(e: Error) -> u32 {
    match e {
        Error::Component { source, .. } => to_errno(*source),
        Error::ReadOnly { .. } => errno::EPERM,
        Error::OutOfRange { .. }
        | Error::Overflow { .. }
        | Error::Misaligned { .. }
        | Error::BadLength { .. } => errno::EINVAL,
        Error::Unsupported { .. } => errno::ENOTSUP,
        Error::Io { source, .. } if source.raw_os_error() == Some(libc::ENOSPC) => errno::ENOSPC,
        Error::Nbd { errno, .. } => errno,
        _ => errno::EIO,
    }
}

fn protocol(what: impl Into<String>) -> Error {
    Error::Protocol {
        peer: "client".to_owned(),
        what: what.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    /// The congestion control of TCP socket `s`, as the kernel reports it.
    fn congestion_of<S: std::os::fd::AsRawFd>(s: &S) -> String {
        let mut name = [0u8; 16];
        let mut len = name.len() as libc::socklen_t;
        // SAFETY: getsockopt writes at most `len` bytes into `name`, a live buffer of that
        // size on our stack, and `len` is a live socklen_t it updates; the fd is open.
        let r = unsafe {
            libc::getsockopt(
                s.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_CONGESTION,
                name.as_mut_ptr().cast(),
                &raw mut len,
            )
        };
        assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
        let name = &name[..len as usize];
        String::from_utf8_lossy(name.split(|&b| b == 0).next().unwrap_or(name)).into_owned()
    }

    #[test]
    fn the_congestion_control_asked_for_is_the_sockets() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let _client = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        // reno is built into every kernel with TCP and allowed to everyone.
        set_congestion(&s, "reno").unwrap();
        assert_eq!(congestion_of(&s), "reno");
        let before = congestion_of(&s);
        let e = set_congestion(&s, "no-such-algorithm").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}");
        assert_eq!(congestion_of(&s), before, "a refusal changes nothing");
    }

    /// A stream that takes at most `most` bytes a write, gathered or not as `vectored` says,
    /// and counts its writes.
    struct Trickle {
        got: Vec<u8>,
        most: usize,
        vectored: bool,
        writes: usize,
    }

    impl AsyncWrite for Trickle {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            let n = buf.len().min(self.most);
            self.got.extend_from_slice(&buf[..n]);
            self.writes += 1;
            Poll::Ready(Ok(n))
        }
        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[std::io::IoSlice<'_>],
        ) -> Poll<std::io::Result<usize>> {
            let mut left = self.most;
            for b in bufs {
                let n = b.len().min(left);
                self.got.extend_from_slice(&b[..n]);
                left -= n;
            }
            self.writes += 1;
            Poll::Ready(Ok(self.most - left))
        }
        fn is_write_vectored(&self) -> bool {
            self.vectored
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn replies_are_sent_whole_and_in_order_however_the_stream_takes_them() {
        // 100 chunks of 0..=40 bytes (empty ones too), some past 64 to a write.
        let chunks: Vec<Bytes> = (0..100u8)
            .map(|i| Bytes::from(vec![i; usize::from(i % 41)]))
            .chain((0..70).map(|_| Bytes::new()))
            .chain([Bytes::from_static(b"end")])
            .collect();
        let want: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
        for (most, vectored) in [(7, true), (1 << 20, true), (5, false), (1 << 20, false)] {
            let mut w = Trickle {
                got: Vec::new(),
                most,
                vectored,
                writes: 0,
            };
            send_all(&mut w, &chunks).await.unwrap();
            assert_eq!(w.got, want, "{most} a write, vectored {vectored}");
            if most == 1 << 20 {
                // Gathered: 64 chunks a write (98 that are not empty: 2); else one buffer,
                // one write.
                assert_eq!(w.writes, if vectored { 2 } else { 1 });
            }
        }
        // A stream that takes nothing is an error, not a loop.
        let mut w = Trickle {
            got: Vec::new(),
            most: 0,
            vectored: true,
            writes: 0,
        };
        let e = send_all(&mut w, &chunks).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::WriteZero);
    }

    #[tokio::test]
    async fn a_free_write_lock_share_is_taken_with_the_tasks_budget_spent() {
        use futures_util::FutureExt;
        use tokio::task::coop::{consume_budget, has_budget_remaining};
        let rmw = tokio::sync::RwLock::new(());
        // A read-modify-write holding it: a share waits.
        let only = rmw.try_write().unwrap();
        assert!(shared(&rmw).now_or_never().is_none());
        drop(only);
        // A read-modify-write waiting behind a write: a new share waits behind it (shares
        // taken at once do not starve it).
        let first = shared(&rmw).now_or_never().unwrap();
        let mut rmw_wait = Box::pin(rmw.write());
        assert!((&mut rmw_wait).now_or_never().is_none());
        assert!(rmw.try_read().is_err());
        assert!(shared(&rmw).now_or_never().is_none());
        drop(first);
        drop(rmw_wait.now_or_never().unwrap());
        // Spend the task's budget, as a connection does over a burst of requests.
        while has_budget_remaining() {
            consume_budget().await;
        }
        // The lock's own `read` would make the task yield here (and another worker could
        // take the connection over); a free share is taken at once.
        assert!(rmw.read().now_or_never().is_none());
        assert!(shared(&rmw).now_or_never().is_some());
    }
}
