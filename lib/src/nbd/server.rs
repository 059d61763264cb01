//! The NBD server: exports block devices (volumes) to any NBD client.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tagstripe_scheduler::IoClass;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

use super::proto::{self, Command, InfoRequest, OptionHeader, Request, SimpleReply, errno};
use crate::{BlockDevice, Error, IoOpts};

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
    /// The I/O class of every connection's requests, unless a classifier says otherwise.
    pub class: IoClass,
    /// Time a client has to finish the handshake (default 30 s).
    pub handshake_timeout: Duration,
    /// Connections served at once (default 1024); more wait to be accepted.
    pub max_connections: usize,
    /// TCP peers that may connect (default: everyone); others are closed before
    /// negotiation and counted in [`ServerCounters::refused`].
    pub allow: super::AllowList,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            max_request: 32 << 20,
            max_in_flight: 128,
            max_buffered: 128 << 20,
            class: IoClass::BestEffort,
            handshake_timeout: Duration::from_secs(30),
            max_connections: 1024,
            allow: super::AllowList::default(),
        }
    }
}

/// One exported device.
#[derive(Clone, Debug)]
struct Export {
    device: Arc<dyn BlockDevice>,
    description: String,
    read_only: bool,
    /// This connection agreed on block sizes (GO asking for `INFO_BLOCK_SIZE`): requests
    /// must keep to them. Otherwise (EXPORT_NAME, or GO without) the protocol's defaults
    /// hold: any byte alignment is served, by read-modify-write where needed.
    strict: bool,
    /// Read-modify-write of unaligned writes excludes every other write to the export.
    rmw: Arc<tokio::sync::RwLock<()>>,
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
}

/// An NBD server (fixed newstyle; options `EXPORT_NAME`, `INFO`, `GO`, `LIST`, `ABORT`;
/// commands `READ`, `WRITE`, `FLUSH`, `TRIM`, `WRITE_ZEROES`, `DISC`) exporting block
/// devices by name. Any NBD client works with it: qemu, nbdkit's tools, the Linux nbd
/// driver, and [`super::NbdDevice`].
///
/// Many requests are in flight per connection and answered as they finish (the handle
/// matches a reply to its request); a failed write is never acknowledged; bad requests get
/// the protocol's error reply and malformed negotiation closes only that connection.
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
    exports: BTreeMap<String, Export>,
    default: Option<String>,
    config: ServerConfig,
    counters: ServerCounters,
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
            exports: BTreeMap::new(),
            default: None,
            config,
            counters: ServerCounters::default(),
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
    pub fn export(self, name: &str, device: Arc<dyn BlockDevice>) -> Self {
        self.export_with(name, device, "", false)
    }

    /// Exports `device` as `name` with a description, read-only if asked (or if the
    /// device is).
    #[must_use]
    pub fn export_with(
        mut self,
        name: &str,
        device: Arc<dyn BlockDevice>,
        description: &str,
        read_only: bool,
    ) -> Self {
        let read_only = read_only || device.info().read_only;
        if self.default.is_none() {
            self.default = Some(name.to_owned());
        }
        self.exports.insert(
            name.to_owned(),
            Export {
                device,
                description: description.to_owned(),
                read_only,
                strict: true,
                rmw: Arc::new(tokio::sync::RwLock::new(())),
            },
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
                        return Ok(s);
                    }
                    // Not on the allow-list: closed before a byte is sent.
                    me.counters.refused.fetch_add(1, Relaxed);
                    tracing::warn!(target: "tagstripe::nbd", peer = %peer, "connection refused: not on the allow-list");
                    drop(s);
                }
            })
            .await
    }

    /// Accepts connections on a Unix socket until the listener fails (clients reach it as
    /// `nbd+unix:///NAME?socket=PATH`).
    ///
    /// # Errors
    /// The listener's error.
    pub async fn serve_unix(self: Arc<Self>, listener: UnixListener) -> std::io::Result<()> {
        let l = &listener;
        self.accept_loop(move || async move { Ok(l.accept().await?.0) })
            .await
    }

    /// Takes connections from `accept`, at most `max_connections` at once, each on its own
    /// task with the configured class.
    async fn accept_loop<S, F, Fut>(self: Arc<Self>, mut accept: F) -> std::io::Result<()>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        F: FnMut() -> Fut,
        Fut: Future<Output = std::io::Result<S>>,
    {
        let slots = Arc::new(Semaphore::new(self.config.max_connections));
        let mut stop = self.stop.subscribe();
        loop {
            let slot = tokio::select! {
                s = Arc::clone(&slots).acquire_owned() => s,
                _ = stop.wait_for(|&v| v) => break,
            };
            let Ok(slot) = slot else { break };
            let stream = tokio::select! {
                s = accept() => s?,
                _ = stop.wait_for(|&v| v) => break,
            };
            let me = Arc::clone(&self);
            tokio::spawn(async move {
                let class = me.config.class;
                let _ = me.serve_connection(stream, class).await;
                drop(slot);
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
        for (name, e) in &self.exports {
            if !e.read_only {
                if let Err(err) = e.device.flush(IoOpts::new()).await {
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
    /// from the handshake to the end, with this I/O class for its requests.
    ///
    /// # Errors
    /// [`Error::Protocol`] if the client broke the protocol (the connection is closed).
    pub async fn serve_connection<S>(&self, stream: S, class: IoClass) -> Result<(), Error>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        self.counters.connections.fetch_add(1, Relaxed);
        let (r, w) = tokio::io::split(stream);
        let mut r = BufReader::with_capacity(64 << 10, r);
        let mut w = BufWriter::with_capacity(64 << 10, w);
        let mut stop = self.stop.subscribe();
        let negotiated = tokio::select! {
            n = tokio::time::timeout(self.config.handshake_timeout, self.negotiate(&mut r, &mut w)) => n,
            // Shutting down: a client still negotiating is closed (it has sent no request).
            _ = stop.wait_for(|&v| v) => return Ok(()),
        };
        let chosen = match negotiated {
            Ok(Ok(Some(export))) => export,
            Ok(Ok(None)) => return Ok(()),
            Ok(Err(e)) => {
                self.counters.protocol_errors.fetch_add(1, Relaxed);
                return Err(e);
            }
            Err(_) => {
                self.counters.protocol_errors.fetch_add(1, Relaxed);
                return Err(protocol("handshake timed out"));
            }
        };
        self.counters.transmissions.fetch_add(1, Relaxed);
        self.transmit(chosen, r, w, class).await
    }

    fn flags(&self, e: &Export) -> u16 {
        let mut f = proto::TF_HAS_FLAGS | proto::TF_CAN_MULTI_CONN;
        // Flush and FUA are offered only if every component honours them (a read-only
        // export's flush is a no-op, and offered as other servers do).
        let durable = e.device.info().flush;
        if e.read_only || durable {
            f |= proto::TF_SEND_FLUSH;
        }
        if e.read_only {
            f |= proto::TF_READ_ONLY;
        } else {
            if durable {
                f |= proto::TF_SEND_FUA;
            }
            f |= proto::TF_SEND_WRITE_ZEROES | proto::TF_SEND_FAST_ZERO;
            if e.device.info().discard {
                f |= proto::TF_SEND_TRIM;
            }
        }
        f
    }

    /// Minimum, preferred and maximum block sizes: the logical block; the optimal I/O size
    /// (or the physical block), reduced to the largest power of two dividing it as the
    /// protocol requires (a 3-member stripe of 8 KiB units prefers 8 KiB, not 24); and the
    /// request cap rounded down to whole minimum blocks.
    fn block_sizes(&self, e: &Export) -> (u32, u32, u32) {
        let l = &e.device.info().limits;
        let min = l.logical_block_size.clamp(512, 65536).next_power_of_two();
        let max = (self.config.max_request / min * min).max(min);
        let pref = if l.io_opt > 0 {
            l.io_opt
        } else {
            l.physical_block_size.max(4096)
        };
        let pref = (1u32 << pref.trailing_zeros()).clamp(min, max);
        // `max` is a multiple of `min`, so the clamp keeps a power of two unless max is
        // not one; then fall back to the largest power of two below it.
        let pref = if pref.is_power_of_two() {
            pref
        } else {
            1 << (31 - max.leading_zeros())
        };
        (min, pref, max)
    }

    fn lookup(&self, name: &str) -> Option<(String, &Export)> {
        let key = if name.is_empty() {
            self.default.clone()?
        } else {
            name.to_owned()
        };
        self.exports.get(&key).map(|e| (key, e))
    }

    /// The handshake: `Some(export)` to start transmission, `None` if the client aborted.
    async fn negotiate<R, W>(&self, r: &mut R, w: &mut W) -> Result<Option<Export>, Error>
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        let mut hello = Vec::with_capacity(18);
        hello.extend_from_slice(&proto::NBDMAGIC.to_be_bytes());
        hello.extend_from_slice(&proto::IHAVEOPT.to_be_bytes());
        hello
            .extend_from_slice(&(proto::FLAG_FIXED_NEWSTYLE | proto::FLAG_NO_ZEROES).to_be_bytes());
        w.write_all(&hello).await.map_err(wire_io)?;
        w.flush().await.map_err(wire_io)?;
        let client = r.read_u32().await.map_err(wire_io)?;
        if client & !(proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES) != 0 {
            return Err(protocol(format!("unknown client flags {client:#x}")));
        }
        let no_zeroes = client & proto::FLAG_C_NO_ZEROES != 0;
        loop {
            let mut head = [0u8; OptionHeader::LEN];
            r.read_exact(&mut head).await.map_err(wire_io)?;
            let opt = OptionHeader::parse(&head).map_err(|e| protocol(e.to_string()))?;
            // Option data is bounded: names are at most 4096 bytes.
            if opt.length as usize > proto::MAX_STRING + 1024 {
                return Err(protocol(format!(
                    "option {} with {} bytes of data",
                    opt.option, opt.length
                )));
            }
            let mut data = vec![0u8; opt.length as usize];
            r.read_exact(&mut data).await.map_err(wire_io)?;
            let reply = |kind: u32, data: &[u8]| proto::OptionReply::encode(opt.option, kind, data);
            match opt.option {
                proto::OPT_EXPORT_NAME => {
                    let name = String::from_utf8_lossy(&data);
                    let Some((_, e)) = self.lookup(&name) else {
                        // No error reply is possible for this option: close.
                        return Err(protocol(format!("no export named {name:?}")));
                    };
                    let mut b = Vec::with_capacity(134);
                    b.extend_from_slice(&e.device.info().bytes().to_be_bytes());
                    b.extend_from_slice(&self.flags(e).to_be_bytes());
                    if !no_zeroes {
                        b.extend_from_slice(&[0u8; 124]);
                    }
                    w.write_all(&b).await.map_err(wire_io)?;
                    w.flush().await.map_err(wire_io)?;
                    // No block sizes were negotiated.
                    return Ok(Some(Export {
                        strict: false,
                        ..e.clone()
                    }));
                }
                proto::OPT_ABORT => {
                    let _ = w.write_all(&reply(proto::REP_ACK, &[])).await;
                    let _ = w.flush().await;
                    return Ok(None);
                }
                proto::OPT_LIST => {
                    if !data.is_empty() {
                        w.write_all(&reply(proto::REP_ERR_INVALID, b"LIST takes no data"))
                            .await
                            .map_err(wire_io)?;
                    } else {
                        for name in self.exports.keys() {
                            let mut d = Vec::with_capacity(4 + name.len());
                            d.extend_from_slice(&(name.len() as u32).to_be_bytes());
                            d.extend_from_slice(name.as_bytes());
                            w.write_all(&reply(proto::REP_SERVER, &d))
                                .await
                                .map_err(wire_io)?;
                        }
                        w.write_all(&reply(proto::REP_ACK, &[]))
                            .await
                            .map_err(wire_io)?;
                    }
                }
                proto::OPT_INFO | proto::OPT_GO => {
                    let req = match InfoRequest::parse(&data) {
                        Ok(r) => r,
                        Err(e) => {
                            w.write_all(&reply(proto::REP_ERR_INVALID, e.to_string().as_bytes()))
                                .await
                                .map_err(wire_io)?;
                            w.flush().await.map_err(wire_io)?;
                            continue;
                        }
                    };
                    let Some((name, e)) = self.lookup(&req.name) else {
                        let msg = format!("no export named {:?}", req.name);
                        w.write_all(&reply(proto::REP_ERR_UNKNOWN, msg.as_bytes()))
                            .await
                            .map_err(wire_io)?;
                        w.flush().await.map_err(wire_io)?;
                        continue;
                    };
                    let (min, pref, max) = self.block_sizes(e);
                    let mut out = reply(
                        proto::REP_INFO,
                        &proto::info_export(e.device.info().bytes(), self.flags(e)),
                    );
                    out.extend(reply(
                        proto::REP_INFO,
                        &proto::info_block_size(min, pref, max),
                    ));
                    if req.requests.contains(&proto::INFO_NAME) {
                        let mut d = proto::INFO_NAME.to_be_bytes().to_vec();
                        d.extend_from_slice(name.as_bytes());
                        out.extend(reply(proto::REP_INFO, &d));
                    }
                    if req.requests.contains(&proto::INFO_DESCRIPTION) && !e.description.is_empty()
                    {
                        let mut d = proto::INFO_DESCRIPTION.to_be_bytes().to_vec();
                        d.extend_from_slice(e.description.as_bytes());
                        out.extend(reply(proto::REP_INFO, &d));
                    }
                    out.extend(reply(proto::REP_ACK, &[]));
                    w.write_all(&out).await.map_err(wire_io)?;
                    w.flush().await.map_err(wire_io)?;
                    if opt.option == proto::OPT_GO {
                        return Ok(Some(Export {
                            strict: req.requests.contains(&proto::INFO_BLOCK_SIZE),
                            ..e.clone()
                        }));
                    }
                    continue;
                }
                other => {
                    let msg = format!("option {other} is not supported");
                    w.write_all(&reply(proto::REP_ERR_UNSUP, msg.as_bytes()))
                        .await
                        .map_err(wire_io)?;
                }
            }
            w.flush().await.map_err(wire_io)?;
        }
    }

    /// The transmission phase: requests are read in order, run concurrently, answered as
    /// they finish.
    async fn transmit<R, W>(
        &self,
        export: Export,
        mut r: BufReader<R>,
        w: BufWriter<W>,
        class: IoClass,
    ) -> Result<(), Error>
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let (tx, rx) = mpsc::unbounded_channel::<Reply>();
        let writer = tokio::spawn(write_replies(w, rx));
        let slots = Arc::new(Semaphore::new(self.config.max_in_flight));
        let budget = Arc::new(Semaphore::new(self.config.max_buffered as usize));
        let ctx = Arc::new(Ctx {
            device: Arc::clone(&export.device),
            read_only: export.read_only,
            max: self.config.max_request,
            class,
            strict: export.strict,
            rmw: Arc::clone(&export.rmw),
        });
        let mut stop = self.stop.subscribe();
        let result = loop {
            let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
                break Ok(());
            };
            let mut head = [0u8; Request::LEN];
            // At shutdown no new request is read (one half read is dropped with the
            // connection); those already read finish below.
            let read = tokio::select! {
                r = r.read_exact(&mut head) => r,
                _ = stop.wait_for(|&v| v) => break Ok(()),
            };
            match read {
                Ok(_) => {}
                // The client left without NBD_CMD_DISC: finish what is in flight.
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break Ok(()),
                Err(e) => break Err(wire_io(e)),
            }
            let req = match Request::parse(&head) {
                Ok(q) => q,
                Err(e) => {
                    self.counters.protocol_errors.fetch_add(1, Relaxed);
                    break Err(protocol(e.to_string()));
                }
            };
            if req.command == Command::Disc {
                break Ok(());
            }
            self.counters.requests.fetch_add(1, Relaxed);
            let mut payload = None;
            let mut refused = None;
            if req.command == Command::Write {
                if req.length > self.config.max_request {
                    // Too large to hold: read it off the wire and refuse it.
                    if let Err(e) = skip(&mut r, req.length.into()).await {
                        break Err(wire_io(e));
                    }
                    refused = Some(errno::EINVAL);
                } else {
                    let need = req.length.max(1);
                    let Ok(permit) = Arc::clone(&budget).acquire_many_owned(need).await else {
                        break Ok(());
                    };
                    let mut b = BytesMut::with_capacity(req.length as usize);
                    if let Err(e) = read_payload(&mut r, &mut b, req.length as usize).await {
                        break Err(wire_io(e));
                    }
                    payload = Some((b.freeze(), permit));
                }
            }
            let permit = match (&payload, req.command) {
                (None, Command::Read) if req.length <= self.config.max_request => {
                    match Arc::clone(&budget)
                        .acquire_many_owned(req.length.max(1))
                        .await
                    {
                        Ok(p) => Some(p),
                        Err(_) => break Ok(()),
                    }
                }
                _ => None,
            };
            let ctx = Arc::clone(&ctx);
            let tx = tx.clone();
            tokio::spawn(async move {
                let (error, data, permit) = match refused {
                    Some(e) => (e, None, None),
                    None => {
                        let (data_in, held) = match payload {
                            Some((d, p)) => (Some(d), Some(p)),
                            None => (None, permit),
                        };
                        match ctx.run(&req, data_in).await {
                            Ok(data) => (0, data, held),
                            Err(e) => (e, None, held),
                        }
                    }
                };
                let _ = tx.send(Reply {
                    head: SimpleReply {
                        error,
                        handle: req.handle,
                    }
                    .encode(),
                    data,
                    _permits: (slot, permit),
                });
            });
        };
        // Wait for every request in flight (their replies are sent before they give their
        // slot back), then close.
        let _ = slots.acquire_many(self.config.max_in_flight as u32).await;
        drop(tx);
        if let Ok((replies, errors)) = writer.await {
            self.counters.replies.fetch_add(replies, Relaxed);
            self.counters.error_replies.fetch_add(errors, Relaxed);
        }
        if result.is_err() {
            self.counters.protocol_errors.fetch_add(1, Relaxed);
        }
        result
    }
}

/// A reply on its way to the client, holding its request's slot and buffer budget.
struct Reply {
    head: [u8; SimpleReply::LEN],
    data: Option<Bytes>,
    _permits: (OwnedSemaphorePermit, Option<OwnedSemaphorePermit>),
}

/// Writes replies in the order they finish, flushing when none is waiting.
async fn write_replies<W: AsyncWrite + Unpin>(
    mut w: BufWriter<W>,
    mut rx: mpsc::UnboundedReceiver<Reply>,
) -> (u64, u64) {
    let (mut n, mut errors) = (0u64, 0u64);
    let mut broken = false;
    while let Some(reply) = rx.recv().await {
        n += 1;
        if reply.head[4..8] != [0; 4] {
            errors += 1;
        }
        if broken {
            continue;
        }
        let mut res = w.write_all(&reply.head).await;
        if let (Ok(()), Some(d)) = (&res, &reply.data) {
            res = w.write_all(d).await;
        }
        if res.is_ok() && rx.is_empty() {
            res = w.flush().await;
        }
        // A client that went away: keep draining so requests in flight can finish.
        broken = res.is_err();
    }
    let _ = w.flush().await;
    let _ = w.shutdown().await;
    (n, errors)
}

async fn read_payload<R: AsyncRead + Unpin>(
    r: &mut R,
    b: &mut BytesMut,
    len: usize,
) -> std::io::Result<()> {
    while b.len() < len {
        let want = (len - b.len()) as u64;
        if (&mut *r).take(want).read_buf(b).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(())
}

async fn skip<R: AsyncRead + Unpin>(r: &mut R, len: u64) -> std::io::Result<()> {
    let n = tokio::io::copy(&mut (&mut *r).take(len), &mut tokio::io::sink()).await?;
    if n < len {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

/// What each request needs of its connection.
struct Ctx {
    device: Arc<dyn BlockDevice>,
    read_only: bool,
    max: u32,
    class: IoClass,
    strict: bool,
    rmw: Arc<tokio::sync::RwLock<()>>,
}

impl Ctx {
    /// Runs one request: `Ok(data)` for the reply, or the errno to reply with.
    async fn run(&self, q: &Request, data: Option<Bytes>) -> Result<Option<Bytes>, u32> {
        let size = self.device.info().bytes();
        let opts = IoOpts::new()
            .class(self.class)
            .fua(q.flags & proto::CMD_FLAG_FUA != 0);
        let writes = matches!(
            q.command,
            Command::Write | Command::Trim | Command::WriteZeroes
        );
        // Flags this server does not offer, or that belong to another command, are refused
        // (FUA is valid on every command; NO_HOLE and FAST_ZERO only on WRITE_ZEROES).
        let zero_flags = proto::CMD_FLAG_NO_HOLE | proto::CMD_FLAG_FAST_ZERO;
        let known = proto::CMD_FLAG_FUA | zero_flags;
        if q.flags & !known != 0 || (q.flags & zero_flags != 0 && q.command != Command::WriteZeroes)
        {
            return Err(errno::EINVAL);
        }
        if writes && self.read_only {
            return Err(errno::EPERM);
        }
        let lbs = u64::from(self.device.info().limits.logical_block_size.max(512));
        let end = q.offset.checked_add(q.length.into()).ok_or(errno::EINVAL)?;
        let carries_range = !matches!(
            q.command,
            Command::Flush | Command::Disc | Command::Other(_)
        );
        if carries_range && end > size {
            return Err(if writes { errno::ENOSPC } else { errno::EINVAL });
        }
        let aligned = q.offset % lbs == 0 && q.length as u64 % lbs == 0;
        if carries_range && !aligned && q.length > 0 && !self.strict {
            // No block sizes were agreed: serve any alignment.
            return self.unaligned(q, data, opts, lbs).await;
        }
        let range = |q: &Request| -> Result<(u64, u64), u32> {
            if q.offset % lbs != 0 || u64::from(q.length) % lbs != 0 || q.length == 0 {
                return Err(errno::EINVAL);
            }
            Ok((q.offset / 512, u64::from(q.length) / 512))
        };
        match q.command {
            Command::Read => {
                if q.length > self.max {
                    return Err(errno::EINVAL);
                }
                let (start, sectors) = range(q)?;
                let d = self
                    .device
                    .read(start, sectors, opts)
                    .await
                    .map_err(to_errno)?;
                Ok(Some(d))
            }
            Command::Write => {
                let (start, _) = range(q)?;
                let d = data.unwrap_or_default();
                // Shared with other writes; exclusive only against a read-modify-write.
                let _w = self.rmw.read().await;
                self.device.write(start, d, opts).await.map_err(to_errno)?;
                Ok(None)
            }
            // A read-only export has nothing of its own to write back: its flush succeeds
            // (as qemu-nbd -r and nbdkit -r answer), also over a read-only component.
            Command::Flush if self.read_only => Ok(None),
            Command::Flush => {
                self.device.flush(opts).await.map_err(to_errno)?;
                Ok(None)
            }
            Command::Trim => {
                let (start, sectors) = range(q)?;
                self.device
                    .discard(start, sectors, opts)
                    .await
                    .map_err(to_errno)?;
                if opts.fua {
                    self.device.flush(opts).await.map_err(to_errno)?;
                }
                Ok(None)
            }
            Command::WriteZeroes => {
                let (start, sectors) = range(q)?;
                let z = crate::Zeroes::new()
                    .unmap(q.flags & proto::CMD_FLAG_NO_HOLE == 0)
                    .fast_only(q.flags & proto::CMD_FLAG_FAST_ZERO != 0);
                match self.device.write_zeroes(start, sectors, z, opts).await {
                    Ok(()) => Ok(None),
                    // The protocol's answer when fast zeroing is not possible.
                    Err(e) if z.fast_only && matches!(e.root(), Error::Unsupported { .. }) => {
                        Err(errno::ENOTSUP)
                    }
                    Err(e) => Err(to_errno(e)),
                }
            }
            Command::Disc | Command::Other(_) => Err(errno::EINVAL),
        }
    }
}

impl Ctx {
    /// A request whose offset or length is not whole logical blocks, with no block sizes
    /// agreed: reads read the blocks around it and keep the bytes asked for; writes (and
    /// zeroing) read those blocks, change the bytes and write them back, with every other
    /// write to the export held off meanwhile; a trim trims the whole blocks inside it (a
    /// trim is advisory).
    async fn unaligned(
        &self,
        q: &Request,
        data: Option<Bytes>,
        opts: IoOpts,
        lbs: u64,
    ) -> Result<Option<Bytes>, u32> {
        let (off, len) = (q.offset, u64::from(q.length));
        let a0 = off / lbs * lbs;
        let a1 = (off + len).div_ceil(lbs) * lbs;
        if a1 - a0 > u64::from(self.max) + 2 * lbs {
            return Err(errno::EINVAL);
        }
        let (start, sectors) = (a0 / 512, (a1 - a0) / 512);
        let inner = (off - a0) as usize..(off - a0 + len) as usize;
        match q.command {
            Command::Read => {
                if q.length > self.max {
                    return Err(errno::EINVAL);
                }
                let d = self
                    .device
                    .read(start, sectors, opts)
                    .await
                    .map_err(to_errno)?;
                Ok(Some(d.slice(inner)))
            }
            Command::Write | Command::WriteZeroes => {
                let _only = self.rmw.write().await;
                let mut buf = vec![0u8; (a1 - a0) as usize];
                self.device
                    .read_into(start, &mut buf, opts)
                    .await
                    .map_err(to_errno)?;
                match data {
                    Some(d) if q.command == Command::Write => buf[inner].copy_from_slice(&d),
                    _ => buf[inner].fill(0),
                }
                self.device
                    .write(start, Bytes::from(buf), opts)
                    .await
                    .map_err(to_errno)?;
                Ok(None)
            }
            Command::Trim => {
                let (t0, t1) = (off.div_ceil(lbs) * lbs, (off + len) / lbs * lbs);
                if t1 > t0 {
                    self.device
                        .discard(t0 / 512, (t1 - t0) / 512, opts)
                        .await
                        .map_err(to_errno)?;
                }
                Ok(None)
            }
            _ => Err(errno::EINVAL),
        }
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

fn wire_io(e: std::io::Error) -> Error {
    protocol(format!("connection: {e}"))
}
