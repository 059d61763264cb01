//! The NBD client backend: a device on another host.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::{BlockDevice, DeviceInfo, Error, IoOpts, Result};
use tagstripe_nbd_proto::client_session::{ClientHandshake, Expect, ReplyDecoder, Status};
use tagstripe_nbd_proto::proto::{self, Command, ExportInfo, Request};

/// How the client connects and waits.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Time to connect and negotiate (default 10 s).
    pub connect_timeout: Duration,
    /// Time a request may take before it fails with [`Error::Timeout`] (default 60 s).
    pub request_timeout: Duration,
    /// After the connection is lost, the next request connects again (default on). Requests
    /// in flight when it was lost fail (whether a write among them landed is unknown); the
    /// export must come back with the same size and flags.
    pub reconnect: bool,
    /// Treat the export as read-only whatever the server offers (default off): every
    /// write, zeroing, discard and flush is refused here, before anything is sent.
    pub read_only: bool,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(60),
            reconnect: true,
            read_only: false,
        }
    }
}

/// The reading side of a connection (TCP or a Unix socket).
type ReadHalf = BufReader<Box<dyn AsyncRead + Send + Unpin>>;
/// The writing side of a connection.
type WriteHalf = Box<dyn AsyncWrite + Send + Unpin>;

/// Where an NBD export is: `nbd://host[:port][/export]` (port 10809 by default), or
/// `nbd+unix:///[export]?socket=PATH` for a Unix socket (the NBD URI forms); with TLS,
/// `nbds://host[:port][/export]?tls-certificates=DIR` and
/// `nbds+unix:///[export]?socket=PATH&tls-certificates=DIR` (libnbd's forms).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NbdUrl {
    /// Host and port, as given to `connect` (empty for a Unix socket).
    pub addr: String,
    /// The export's name ("" for the server's default).
    pub export: String,
    /// The Unix socket's path, for `nbd+unix://`.
    pub socket: Option<String>,
    /// For `nbds://`: the directory with `ca-cert.pem` (and `client-cert.pem` /
    /// `client-key.pem` to present, if there).
    pub tls_certificates: Option<String>,
    /// For `nbds://`: the name the server's certificate must carry, if not the URL's host
    /// (`localhost` over a Unix socket).
    pub tls_hostname: Option<String>,
}

/// Host and port of an NBD URI's authority (`host[:port]`, IPv6 bracketed; port 10809 if
/// none).
fn tcp_addr(authority: &str) -> std::result::Result<String, &'static str> {
    if authority.is_empty() {
        return Err("no host");
    }
    if authority.contains('@') {
        return Err("a user name (user@host) is not supported");
    }
    // An IPv6 literal is bracketed; a port follows the last colon outside brackets.
    let has_port = match authority.rfind(':') {
        Some(i) => !authority[i..].contains(']'),
        None => false,
    };
    if !has_port {
        return Ok(format!("{authority}:10809"));
    }
    let (host, port) = authority.rsplit_once(':').unwrap_or((authority, ""));
    if host.is_empty() {
        return Err("no host");
    }
    port.parse::<u16>().map_err(|_| "bad port")?;
    Ok(authority.to_owned())
}

/// Decodes RFC 3986 percent-encoding (`%20` is a space) into UTF-8 text.
fn percent_decode(s: &str) -> std::result::Result<String, String> {
    let mut out = Vec::with_capacity(s.len());
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        if b != b'%' {
            out.push(b);
            continue;
        }
        let hex = [bytes.next(), bytes.next()];
        let digit = |d: Option<u8>| char::from(d?).to_digit(16);
        match (digit(hex[0]), digit(hex[1])) {
            (Some(hi), Some(lo)) => out.push((hi * 16 + lo) as u8),
            _ => return Err(format!("bad percent-encoding in {s:?}")),
        }
    }
    String::from_utf8(out).map_err(|_| format!("{s:?} does not decode to UTF-8"))
}

/// Percent-encodes `s` for an NBD URI's path or a parameter's value: all but RFC 3986's
/// unreserved characters and `/`.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl NbdUrl {
    /// Parses an NBD URI (the NBD project's `doc/uri.md`): `nbd://host[:port][/export]`,
    /// `nbd+unix:///export?socket=PATH`, and their TLS forms `nbds://` and `nbds+unix://`,
    /// which need `tls-certificates=DIR` (libnbd's parameter) and may give `tls-hostname=NAME`
    /// (the name the server's certificate must carry). The export name and the parameters are
    /// percent-decoded (`hello%20world` is the export `hello world`); a parameter this URL
    /// does not take is refused, not ignored.
    ///
    /// ```
    /// use tagstripe::nbd::NbdUrl;
    /// let u = NbdUrl::parse("nbd://10.0.0.2/disk0").unwrap();
    /// assert_eq!((u.addr.as_str(), u.export.as_str()), ("10.0.0.2:10809", "disk0"));
    /// assert!(NbdUrl::parse("http://x").is_err());
    /// let u = NbdUrl::parse("nbd+unix:///disk0?socket=/run/nbd.sock").unwrap();
    /// assert_eq!(u.socket.as_deref(), Some("/run/nbd.sock"));
    /// let u = NbdUrl::parse("nbds://h:10810/d?tls-certificates=/etc/pki/nbd").unwrap();
    /// assert_eq!((u.export.as_str(), u.tls_certificates.as_deref()), ("d", Some("/etc/pki/nbd")));
    /// assert!(NbdUrl::parse("nbds://h/d").is_err()); // which CA to trust?
    /// let u = NbdUrl::parse("nbd://h/hello%20world").unwrap();
    /// assert_eq!(u.export, "hello world");
    /// assert_eq!(u.to_string(), "nbd://h:10809/hello%20world");
    /// assert!(NbdUrl::parse("nbd://h/disk?tls-certificates=/x").is_err()); // not for nbd://
    /// ```
    ///
    /// # Errors
    /// [`Error::BadUrl`] for another scheme, an empty host, a bad port, a Unix URL without
    /// its socket or with a host, bad percent-encoding, or a parameter the URL does not take.
    pub fn parse(url: &str) -> Result<Self> {
        let bad = |why: &str| Error::BadUrl {
            url: url.to_owned(),
            why: why.to_owned(),
        };
        let (scheme, rest) = url.split_once("://").ok_or_else(|| {
            bad("the scheme must be nbd://, nbds://, nbd+unix:// or nbds+unix://")
        })?;
        let (tls, unix) = match scheme {
            "nbd" => (false, false),
            "nbds" => (true, false),
            "nbd+unix" => (false, true),
            "nbds+unix" => (true, true),
            _ => {
                return Err(bad(
                    "the scheme must be nbd://, nbds://, nbd+unix:// or nbds+unix://",
                ));
            }
        };
        if rest.contains('#') {
            return Err(bad("a fragment (#...) has no meaning in an NBD URI"));
        }
        let (head, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority, path) = head.split_once('/').unwrap_or((head, ""));
        let export = percent_decode(path).map_err(|why| bad(&why))?;
        if export.contains('\0') {
            return Err(bad("an export name holds no NUL"));
        }
        let (mut socket, mut certs, mut hostname) = (None, None, None);
        for kv in query.split('&').filter(|kv| !kv.is_empty()) {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            let (k, v) = (
                percent_decode(k).map_err(|why| bad(&why))?,
                percent_decode(v).map_err(|why| bad(&why))?,
            );
            let slot = match k.as_str() {
                "socket" if unix => &mut socket,
                "tls-certificates" if tls => &mut certs,
                "tls-hostname" if tls => &mut hostname,
                _ => {
                    let takes = match (unix, tls) {
                        (false, false) => "none",
                        (true, false) => "socket",
                        (false, true) => "tls-certificates and tls-hostname",
                        (true, true) => "socket, tls-certificates and tls-hostname",
                    };
                    return Err(bad(&format!(
                        "parameter {k:?} is not taken here (a {scheme}:// URL takes {takes})"
                    )));
                }
            };
            if v.is_empty() {
                return Err(bad(&format!("parameter {k:?} is empty")));
            }
            *slot = Some(v);
        }
        if tls && certs.is_none() {
            return Err(bad(
                "an nbds URL needs tls-certificates=DIR (the directory with ca-cert.pem)",
            ));
        }
        let addr = if unix {
            if !authority.is_empty() {
                return Err(bad(
                    "a Unix URL names no host: nbd+unix:///export?socket=PATH",
                ));
            }
            let path = socket
                .as_ref()
                .ok_or_else(|| bad("a Unix URL needs ?socket=PATH"))?;
            if path.contains('\0') {
                return Err(bad("sockets in the abstract namespace are not supported"));
            }
            String::new()
        } else {
            tcp_addr(authority).map_err(bad)?
        };
        Ok(Self {
            addr,
            export,
            socket,
            tls_certificates: certs,
            tls_hostname: hostname,
        })
    }

    /// The name the server's certificate must carry: `tls-hostname` if given, else the host
    /// (a name or an address), or `localhost` for a Unix socket.
    #[must_use]
    pub fn server_name(&self) -> String {
        if let Some(h) = &self.tls_hostname {
            return h.clone();
        }
        if self.socket.is_some() {
            return "localhost".to_owned();
        }
        let host = match self.addr.rfind(':') {
            Some(i) if !self.addr[i..].contains(']') => &self.addr[..i],
            _ => &self.addr,
        };
        host.trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned()
    }

    /// Connects the stream the URL names: a Unix socket, or TCP with Nagle off.
    async fn connect_raw(&self) -> Result<Raw> {
        let addr = self.socket.as_ref().unwrap_or(&self.addr);
        let refused = |source| Error::Connect {
            addr: addr.clone(),
            source,
        };
        Ok(match &self.socket {
            Some(path) => Raw::Unix(UnixStream::connect(path).await.map_err(refused)?),
            None => {
                let s = TcpStream::connect(&self.addr).await.map_err(refused)?;
                let _ = s.set_nodelay(true);
                Raw::Tcp(s)
            }
        })
    }

    /// Connects the stream the URL names, whole (for a TLS upgrade).
    #[cfg(feature = "tls")]
    async fn connect_stream(&self) -> Result<Box<dyn Stream>> {
        Ok(match self.connect_raw().await? {
            Raw::Unix(s) => Box::new(s),
            Raw::Tcp(s) => Box::new(s),
        })
    }

    /// Connects the stream the URL names, split into its two sides (without a lock between
    /// them).
    async fn connect(&self) -> Result<(ReadHalf, WriteHalf)> {
        let (r, w): (Box<dyn AsyncRead + Send + Unpin>, WriteHalf) =
            match self.connect_raw().await? {
                Raw::Unix(s) => {
                    let (r, w) = s.into_split();
                    (Box::new(r), Box::new(w))
                }
                Raw::Tcp(s) => {
                    let (r, w) = s.into_split();
                    (Box::new(r), Box::new(w))
                }
            };
        Ok((BufReader::with_capacity(256 << 10, r), w))
    }
}

impl std::fmt::Display for NbdUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = if self.tls_certificates.is_some() {
            "s"
        } else {
            ""
        };
        let export = percent_encode(&self.export);
        let mut query = Vec::new();
        if let Some(p) = &self.socket {
            query.push(format!("socket={}", percent_encode(p)));
        }
        if let Some(d) = &self.tls_certificates {
            query.push(format!("tls-certificates={}", percent_encode(d)));
            if let Some(h) = &self.tls_hostname {
                query.push(format!("tls-hostname={}", percent_encode(h)));
            }
        }
        let query = if query.is_empty() {
            String::new()
        } else {
            format!("?{}", query.join("&"))
        };
        match &self.socket {
            Some(_) => write!(f, "nbd{s}+unix:///{export}{query}"),
            None => write!(f, "nbd{s}://{}/{export}{query}", self.addr),
        }
    }
}

/// A connected socket, before any TLS.
enum Raw {
    Unix(UnixStream),
    Tcp(TcpStream),
}

/// A byte stream a connection runs on (TCP, a Unix socket, TLS over either).
trait Stream: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Stream for T {}

/// A request waiting for its reply.
/// What a reply gives its waiter: the data and block-status extents, or why not.
type Answer = Result<(Bytes, Vec<(u64, u64)>), Failure>;

struct Pending {
    tx: oneshot::Sender<Answer>,
    expect: Expect,
}

enum Failure {
    Errno(u32),
    Closed(String),
}

#[derive(Default)]
struct State {
    pending: HashMap<u64, Pending>,
    dead: Option<String>,
}

struct Shared {
    name: String,
    writer: tokio::sync::Mutex<WriteHalf>,
    /// Requests waiting for replies, and why the connection is gone once it is: one lock,
    /// so a request is either registered before the reader gives up or refused.
    state: Mutex<State>,
    next: AtomicU64,
    /// The `base:allocation` context's id, if the server selected it for this connection.
    allocation: Option<u32>,
}

/// A block device served by an NBD server (qemu-nbd, nbdkit, nbd-server, rbd-nbd,
/// [`super::NbdServer`]): negotiated with `NBD_OPT_GO` and block-size information, with
/// many requests in flight on one connection, matched to their replies by handle. Usable as
/// a volume component like any backend; its errors name the export.
///
/// Server limits become the device's limits: the minimum block size its logical block,
/// the preferred size its physical block, the maximum its `max_hw_sectors`. FUA is sent when
/// the server supports it and done as write-then-flush otherwise; a server without flush
/// needs none.
#[derive(Debug)]
pub struct NbdDevice {
    info: DeviceInfo,
    url: NbdUrl,
    /// The current connection; replaced when it is lost and `config.reconnect` is on.
    conn: Mutex<Arc<Conn>>,
    /// One reconnection at a time.
    reconnecting: tokio::sync::Mutex<()>,
    flags: u16,
    max_bytes: u64,
    config: ClientConfig,
}

/// One connection: its shared state and the task reading its replies.
#[derive(Debug)]
struct Conn {
    shared: Arc<Shared>,
    reader: JoinHandle<()>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.reader.abort();
        // Say goodbye if a runtime is there to do it; the server copes either way.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let shared = Arc::clone(&self.shared);
            rt.spawn(async move {
                let req = Request {
                    flags: 0,
                    command: Command::Disc,
                    handle: 0,
                    offset: 0,
                    length: 0,
                };
                let mut w = shared.writer.lock().await;
                let _ = w.write_all(&req.encode()).await;
                let _ = w.shutdown().await;
            });
        }
    }
}

/// Connects and negotiates: a live connection and what the server said of the export.
async fn open_conn(u: &NbdUrl, config: &ClientConfig) -> Result<(Conn, ExportInfo)> {
    let name = u.to_string();
    let fut = async {
        if let Some(dir) = &u.tls_certificates {
            let (stream, info, h) = connect_tls(&name, u, dir).await?;
            let (r, w) = tokio::io::split(stream);
            let r: Box<dyn AsyncRead + Send + Unpin> = Box::new(r);
            let w: WriteHalf = Box::new(w);
            return Ok::<_, Error>((BufReader::with_capacity(256 << 10, r), w, info, h));
        }
        let (r, w) = u.connect().await?;
        let mut io = tokio::io::join(r, w);
        let mut h = ClientHandshake::new(&u.export, false).with_allocation(true);
        let Status::Ready(info) = handshake(&name, &mut h, &mut io).await? else {
            return Err(Error::Protocol {
                peer: name.clone(),
                what: "TLS started without being asked for".to_owned(),
            });
        };
        let (r, w) = io.into_inner();
        Ok::<_, Error>((r, w, info, h))
    };
    let (r, w, ei, mut h) = tokio::time::timeout(config.connect_timeout, fut)
        .await
        .map_err(|_| Error::Timeout {
            device: name.clone(),
            op: "connect",
        })??;
    let shared = Arc::new(Shared {
        name,
        writer: tokio::sync::Mutex::new(w),
        state: Mutex::new(State::default()),
        next: AtomicU64::new(1),
        allocation: h.allocation_context(),
    });
    let left = h.take_leftover();
    let dec = if h.structured() {
        ReplyDecoder::structured(left)
    } else {
        ReplyDecoder::new(left)
    };
    let reader = tokio::spawn(read_replies(Arc::clone(&shared), r, dec));
    Ok((Conn { shared, reader }, ei))
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").field("name", &self.name).finish()
    }
}

impl NbdDevice {
    /// `(start, sectors)` pieces of a range for commands with 32-bit lengths (TRIM,
    /// WRITE_ZEROES): at most 2 GiB each, whole logical blocks.
    fn pieces32(&self, start: u64, sectors: u64) -> impl Iterator<Item = (u64, u64)> {
        let lbs = (u64::from(self.info.limits.logical_block_size) / 512).max(1);
        let step = (u64::from(u32::MAX) / 512) / lbs * lbs;
        (0..sectors)
            .step_by(step as usize)
            .map(move |at| (start + at, step.min(sectors - at)))
    }

    /// Connects to `nbd://host[:port][/export]` with the default configuration.
    ///
    /// # Errors
    /// [`Error::BadUrl`], [`Error::Connect`], [`Error::Protocol`] if negotiation fails
    /// (unknown export included), [`Error::Timeout`].
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, ClientConfig::default()).await
    }

    /// Connects with a configuration.
    ///
    /// # Errors
    /// As [`NbdDevice::connect`].
    pub async fn connect_with(url: &str, config: ClientConfig) -> Result<Self> {
        let u = NbdUrl::parse(url)?;
        let (conn, ei) = open_conn(&u, &config).await?;
        // Sized below, once the block size is known.
        let mut info = DeviceInfo::new(u.to_string(), 0);
        info.read_only = config.read_only || ei.flags & proto::TF_READ_ONLY != 0;
        info.set_discard(ei.flags & proto::TF_SEND_TRIM != 0);
        // What the server offers. FUA is done as write-then-flush where it has flush only;
        // without WRITE_ZEROES zeroes are sent as data.
        let has = |f: u16| ei.flags & f != 0;
        info.caps.flush = has(proto::TF_SEND_FLUSH);
        info.caps.fua = has(proto::TF_SEND_FUA) || has(proto::TF_SEND_FLUSH);
        info.caps.write_cache = has(proto::TF_SEND_FLUSH);
        info.caps.rotational = has(proto::TF_ROTATIONAL);
        info.caps.zeroing = if has(proto::TF_SEND_WRITE_ZEROES) {
            crate::Zeroing::Native
        } else {
            crate::Zeroing::Emulated
        };
        info.caps.fast_zero = has(proto::TF_SEND_FAST_ZERO);
        info.caps.allocation = conn.shared.allocation.is_some();
        let mut max_bytes = 32 << 20;
        if let Some((min, pref, max)) = ei.block_sizes {
            info.limits.logical_block_size = min.max(512);
            info.limits.physical_block_size = pref.clamp(min.max(512), 65536).next_power_of_two();
            max_bytes = u64::from(max).max(u64::from(min.max(512)));
        }
        max_bytes = max_bytes / u64::from(info.limits.logical_block_size)
            * u64::from(info.limits.logical_block_size);
        info.limits.max_hw_sectors = u32::try_from(max_bytes / 512).unwrap_or(u32::MAX);
        // Whole logical blocks only: a part block at the end is never reached.
        info.set_size_bytes(ei.size);
        Ok(Self {
            info,
            url: u,
            conn: Mutex::new(Arc::new(conn)),
            reconnecting: tokio::sync::Mutex::new(()),
            flags: ei.flags,
            max_bytes,
            config,
        })
    }

    /// The connection to use: the current one, or, if it was lost, a new one (when
    /// reconnecting is on and the export comes back the same).
    async fn live(&self) -> Result<Arc<Conn>> {
        let current = Arc::clone(&self.conn.lock());
        let Some(why) = current.shared.state.lock().dead.clone() else {
            return Ok(current);
        };
        let closed = |why: &str| Error::Closed {
            device: format!("{}: {why}", self.info.name),
        };
        if !self.config.reconnect {
            return Err(closed(&why));
        }
        tracing::warn!(target: "tagstripe::nbd", export = %self.info.name, why = %why, "connection lost: reconnecting");
        let _one = self.reconnecting.lock().await;
        // Someone else may have reconnected meanwhile.
        let now = Arc::clone(&self.conn.lock());
        if !Arc::ptr_eq(&now, &current) {
            return Ok(now);
        }
        let (conn, ei) = open_conn(&self.url, &self.config).await?;
        let was = self.info.bytes() + self.info.unused_tail_bytes;
        if ei.size != was || ei.flags != self.flags {
            return Err(Error::Protocol {
                peer: self.info.name.clone(),
                what: format!(
                    "the export came back different ({} bytes, flags {:#x}; was {} bytes, flags {:#x})",
                    ei.size, ei.flags, was, self.flags
                ),
            });
        }
        let conn = Arc::new(conn);
        *self.conn.lock() = Arc::clone(&conn);
        tracing::info!(target: "tagstripe::nbd", export = %self.info.name, "reconnected (the export came back the same)");
        Ok(conn)
    }

    /// The transmission flags the server sent.
    #[must_use]
    pub fn transmission_flags(&self) -> u16 {
        self.flags
    }

    /// Sends `NBD_CMD_DISC` after the requests in flight, and closes.
    pub async fn disconnect(&self) {
        let conn = Arc::clone(&self.conn.lock());
        let req = Request {
            flags: 0,
            command: Command::Disc,
            handle: conn.shared.next.fetch_add(1, Relaxed),
            offset: 0,
            length: 0,
        };
        let mut w = conn.shared.writer.lock().await;
        let _ = w.write_all(&req.encode()).await;
        let _ = w.shutdown().await;
    }

    /// One request, and its reply's data and block-status extents.
    async fn call(
        &self,
        op: &'static str,
        command: Command,
        flags: u16,
        start: u64,
        sectors: u64,
        payload: Option<Bytes>,
    ) -> Result<(Bytes, Vec<(u64, u64)>)> {
        let length = u32::try_from(sectors * 512).map_err(|_| Error::BadLength {
            device: self.info.name.clone(),
            what: format!("{sectors} sectors in one NBD request"),
        })?;
        let conn = self.live().await?;
        let shared = &conn.shared;
        let handle = shared.next.fetch_add(1, Relaxed);
        let (tx, rx) = oneshot::channel();
        let read_len = if command == Command::Read {
            length as usize
        } else {
            0
        };
        {
            let mut st = shared.state.lock();
            if let Some(why) = &st.dead {
                return Err(Error::Closed {
                    device: format!("{}: {why}", self.info.name),
                });
            }
            let expect = Expect {
                read_len,
                offset: start * 512,
            };
            st.pending.insert(handle, Pending { tx, expect });
        }
        let req = Request {
            flags,
            command,
            handle,
            offset: start * 512,
            length: if command == Command::Flush { 0 } else { length },
        };
        let sent = {
            let mut w = shared.writer.lock().await;
            let mut r = w.write_all(&req.encode()).await;
            if let (Ok(()), Some(p)) = (&r, &payload) {
                r = w.write_all(p).await;
            }
            r
        };
        if let Err(e) = sent {
            shared.state.lock().pending.remove(&handle);
            return Err(Error::Io {
                device: self.info.name.clone(),
                op,
                start,
                sectors,
                source: e,
            });
        }
        let reply = match tokio::time::timeout(self.config.request_timeout, rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(Failure::Closed("connection lost".to_owned())),
            // The entry stays until its reply comes, so that the reply's data is read
            // off the wire; only the waiter is gone.
            Err(_) => {
                return Err(Error::Timeout {
                    device: self.info.name.clone(),
                    op,
                });
            }
        };
        reply.map_err(|f| match f {
            Failure::Errno(errno) => Error::Nbd {
                device: self.info.name.clone(),
                op,
                start,
                sectors,
                errno,
            },
            Failure::Closed(why) => Error::Closed {
                device: format!("{}: {why}", self.info.name),
            },
        })
    }

    /// Pieces of at most the server's maximum block size.
    fn chunks(&self, start: u64, sectors: u64) -> impl Iterator<Item = (u64, u64)> + use<> {
        let step = (self.max_bytes / 512).max(1);
        (0..sectors.div_ceil(step)).map(move |i| {
            let s = i * step;
            (start + s, step.min(sectors - s))
        })
    }
}

async fn read_replies(shared: Arc<Shared>, mut r: ReadHalf, mut dec: ReplyDecoder) {
    let why = 'conn: loop {
        // Every whole reply received so far, then read more.
        loop {
            let next = dec.next(|h| shared.state.lock().pending.get(&h).map(|p| p.expect));
            match next {
                Ok(Some(reply)) => {
                    let Some(p) = shared.state.lock().pending.remove(&reply.handle) else {
                        break 'conn format!("reply for unknown handle {:#x}", reply.handle);
                    };
                    let result = if reply.error != 0 {
                        Err(Failure::Errno(reply.error))
                    } else {
                        Ok((reply.data, reply.extents))
                    };
                    let _ = p.tx.send(result);
                }
                Ok(None) => break,
                Err(e) => break 'conn format!("protocol error: {e}"),
            }
        }
        match r.read_buf(dec.input_buffer()).await {
            Ok(0) => break "connection lost".to_owned(),
            Ok(_) => {}
            Err(e) => break format!("connection lost: {e}"),
        }
    };
    let mut st = shared.state.lock();
    st.dead = Some(why.clone());
    for (_, p) in st.pending.drain() {
        let _ = p.tx.send(Err(Failure::Closed(why.clone())));
    }
}

/// Connects and upgrades to TLS at once (`NBD_OPT_STARTTLS` before any other option, so
/// nothing is said in the clear), verifying the server against `dir`'s `ca-cert.pem`; then
/// negotiates inside TLS.
#[cfg(feature = "tls")]
async fn connect_tls(
    name: &str,
    u: &NbdUrl,
    dir: &str,
) -> Result<(Box<dyn Stream>, ExportInfo, ClientHandshake)> {
    let config = super::tls::client_config(std::path::Path::new(dir))?;
    let mut raw = u.connect_stream().await?;
    let mut h = ClientHandshake::new(&u.export, true).with_allocation(true);
    if handshake(name, &mut h, &mut raw).await? != Status::StartTls {
        return Err(Error::Tls {
            path: name.to_owned(),
            what: "negotiation ended before TLS".to_owned(),
        });
    }
    let server =
        rustls_pki_types::ServerName::try_from(u.server_name()).map_err(|e| Error::Tls {
            path: name.to_owned(),
            what: format!("server name {:?}: {e}", u.server_name()),
        })?;
    let mut tls = tokio_rustls::TlsConnector::from(config)
        .connect(server, raw)
        .await
        .map_err(|e| Error::Tls {
            path: name.to_owned(),
            what: super::tls::handshake_failure(&e),
        })?;
    h.tls_established();
    let Status::Ready(info) = handshake(name, &mut h, &mut tls).await? else {
        return Err(Error::Tls {
            path: name.to_owned(),
            what: "a second STARTTLS inside TLS".to_owned(),
        });
    };
    Ok((Box::new(tls), info, h))
}

#[cfg(not(feature = "tls"))]
async fn connect_tls(
    name: &str,
    _u: &NbdUrl,
    _dir: &str,
) -> Result<(Box<dyn Stream>, ExportInfo, ClientHandshake)> {
    Err(Error::Unsupported {
        device: name.to_owned(),
        op: "TLS (built without the tls feature)",
    })
}

/// Runs the negotiation state machine over `io` until it is ready or asks for TLS.
async fn handshake<IO: AsyncRead + AsyncWrite + Unpin>(
    name: &str,
    h: &mut ClientHandshake,
    io: &mut IO,
) -> Result<Status> {
    let perr = |what: String| Error::Protocol {
        peer: name.to_owned(),
        what,
    };
    let ioe = |e: std::io::Error| perr(format!("negotiation: {e}"));
    let mut buf = vec![0u8; 16 << 10];
    loop {
        let out = h.take_output();
        if !out.is_empty() {
            io.write_all(&out).await.map_err(ioe)?;
            io.flush().await.map_err(ioe)?;
        }
        let n = io.read(&mut buf).await.map_err(ioe)?;
        if n == 0 {
            return Err(perr(
                "the server closed the connection during negotiation".to_owned(),
            ));
        }
        match h.receive(&buf[..n]).map_err(|e| perr(e.to_string()))? {
            Status::NeedInput => {}
            st => {
                let out = h.take_output();
                if !out.is_empty() {
                    io.write_all(&out).await.map_err(ioe)?;
                    io.flush().await.map_err(ioe)?;
                }
                return Ok(st);
            }
        }
    }
}

impl BlockDevice for NbdDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// Block status on `base:allocation` when the server selected it (qemu-nbd, nbdkit,
    /// `tagstripe serve`), asked again from where each answer stops; all data otherwise.
    async fn allocation(&self, start: u64, sectors: u64) -> Result<Vec<crate::Extent>> {
        self.info.check(start, sectors)?;
        if self.live().await?.shared.allocation.is_none() {
            return Ok(vec![crate::Extent::data(sectors)]);
        }
        let lbs = self.info.limits.lbs_sectors();
        let mut out = Vec::new();
        let (mut at, end) = (start, start + sectors);
        while at < end {
            let n = (end - at).min(self.pieces32(at, end - at).next().map_or(0, |p| p.1));
            let (_, ext) = self
                .call("block-status", Command::BlockStatus, 0, at, n, None)
                .await?;
            let mut got = 0;
            for (len, status) in ext {
                // Whole blocks (the server keeps to the minimum block; a stray tail is
                // left to the next question).
                let secs = (len / 512 / lbs * lbs).min(n - got);
                if secs == 0 {
                    break;
                }
                let e = crate::Extent {
                    sectors: secs,
                    hole: status & u64::from(proto::STATE_HOLE) != 0,
                    zero: status & u64::from(proto::STATE_ZERO) != 0,
                };
                crate::device::push_extent(&mut out, e);
                got += secs;
                if got >= n {
                    break;
                }
            }
            if got == 0 {
                // No usable answer: say data (always safe) for one block and go on.
                crate::device::push_extent(&mut out, crate::Extent::data(lbs.min(n)));
                got = lbs.min(n);
            }
            at += got;
        }
        Ok(out)
    }

    async fn read(&self, start: u64, sectors: u64, _opts: IoOpts) -> Result<Bytes> {
        self.info.check(start, sectors)?;
        let parts = crate::device::all(self.chunks(start, sectors).map(|(s, n)| async move {
            Ok(self.call("read", Command::Read, 0, s, n, None).await?.0)
        }))
        .await?;
        Ok(gather(parts))
    }

    async fn write(&self, start: u64, data: Bytes, opts: IoOpts) -> Result<()> {
        let sectors = self.info.check_write(start, data.len())?;
        let native_fua = self.flags & proto::TF_SEND_FUA != 0;
        let flags = if opts.fua && native_fua {
            proto::CMD_FLAG_FUA
        } else {
            0
        };
        crate::device::all(self.chunks(start, sectors).map(|(s, n)| {
            let off = ((s - start) * 512) as usize;
            let part = data.slice(off..off + n as usize * 512);
            self.call("write", Command::Write, flags, s, n, Some(part))
        }))
        .await?;
        if opts.fua && !native_fua {
            self.flush(opts).await?;
        }
        Ok(())
    }

    async fn flush(&self, _opts: IoOpts) -> Result<()> {
        if self.info.read_only {
            return Err(Error::ReadOnly {
                device: self.info.name.clone(),
            });
        }
        if self.flags & proto::TF_SEND_FLUSH == 0 {
            return Ok(());
        }
        self.call("flush", Command::Flush, 0, 0, 0, None).await?;
        Ok(())
    }

    async fn write_zeroes(
        &self,
        start: u64,
        sectors: u64,
        z: crate::Zeroes,
        opts: IoOpts,
    ) -> Result<()> {
        crate::device::check_zeroes(&self.info, start, sectors)?;
        let zeroes = self.flags & proto::TF_SEND_WRITE_ZEROES != 0;
        let fast = self.flags & proto::TF_SEND_FAST_ZERO != 0;
        if !zeroes || (z.fast_only && !fast) {
            // The server cannot zero (fast): write zeroes, or refuse if only fast would do.
            return crate::device::write_zero_buffers(self, start, sectors, z, opts).await;
        }
        let mut flags = 0;
        if !z.unmap {
            flags |= proto::CMD_FLAG_NO_HOLE;
        }
        if z.fast_only {
            flags |= proto::CMD_FLAG_FAST_ZERO;
        }
        if opts.fua && self.flags & proto::TF_SEND_FUA != 0 {
            flags |= proto::CMD_FLAG_FUA;
        }
        for (at, n) in self.pieces32(start, sectors) {
            self.call("write-zeroes", Command::WriteZeroes, flags, at, n, None)
                .await?;
        }
        if opts.fua && self.flags & proto::TF_SEND_FUA == 0 {
            self.flush(opts).await?;
        }
        Ok(())
    }

    async fn discard(&self, start: u64, sectors: u64, _opts: IoOpts) -> Result<()> {
        self.info.check_discard(start, sectors)?;
        for (at, n) in self.pieces32(start, sectors) {
            self.call("discard", Command::Trim, 0, at, n, None).await?;
        }
        Ok(())
    }
}

/// Joins read pieces in order: the piece itself when there is one (no copy).
fn gather(mut parts: Vec<Bytes>) -> Bytes {
    if parts.len() == 1 {
        return parts.pop().unwrap_or_default();
    }
    let mut out = bytes::BytesMut::with_capacity(parts.iter().map(Bytes::len).sum());
    for p in parts {
        out.extend_from_slice(&p);
    }
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let u = NbdUrl::parse("nbd://h:1234/exp/with/slash").unwrap();
        assert_eq!(u.addr, "h:1234");
        assert_eq!(u.export, "exp/with/slash");
        assert_eq!(NbdUrl::parse("nbd://h").unwrap().export, "");
        assert_eq!(NbdUrl::parse("nbd://[::1]").unwrap().addr, "[::1]:10809");
        assert_eq!(NbdUrl::parse("nbd://[::1]:99/x").unwrap().addr, "[::1]:99");
        for bad in [
            "nbd://",
            "nbd://:80",
            "nbd://h:99999",
            "nbd://h:x/e",
            "file:///x",
            // What the NBD URI document says a parser should diagnose, not pass on.
            "nbd://h/disk?socket=/s",
            "nbd://h/disk?x-unknown=1",
            "nbd+unix:///d?socket=/s&tls-certificates=/p",
            "nbd+unix://h/d?socket=/s",
            "nbd+unix:///d?socket=",
            "nbd+unix:///d?socket=%00abstract",
            "nbds://h/d?tls-certificates=/p&tls-hostname=",
            "nbd://user@h/d",
            "nbd://h/d#frag",
            "nbd://h/bad%2",
            "nbd://h/bad%zz",
            "nbd://h/%ff",
            "nbd://h/a%00b",
        ] {
            assert!(NbdUrl::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn urls_are_percent_encoded_both_ways() {
        // The URI document's examples.
        for (url, export) in [
            ("nbd://example.com/disk", "disk"),
            ("nbd+unix:///disk?socket=sock", "disk"),
            ("nbd://example.com/", ""),
            ("nbd://example.com", ""),
            ("nbd://example.com//disk", "/disk"),
            ("nbd://example.com/hello%20world", "hello world"),
        ] {
            assert_eq!(NbdUrl::parse(url).unwrap().export, export, "{url}");
        }
        let u = NbdUrl::parse("nbds+unix:///caf%C3%A9%3F?socket=/run/my%20nbd.sock&tls-certificates=/etc/p%20ki&tls-hostname=nbd.example").unwrap();
        assert_eq!(u.export, "café?");
        assert_eq!(u.socket.as_deref(), Some("/run/my nbd.sock"));
        assert_eq!(u.tls_certificates.as_deref(), Some("/etc/p ki"));
        assert_eq!(u.server_name(), "nbd.example");
        assert_eq!(
            u.to_string(),
            "nbds+unix:///caf%C3%A9%3F?socket=/run/my%20nbd.sock&tls-certificates=/etc/p%20ki&tls-hostname=nbd.example"
        );
        // What Display writes parses back to the same URL.
        for export in ["a b/c", "100%", "x?y#z&w=1", "é/ü", ""] {
            let tls = [
                (None, None),
                (Some("/etc/my pki".to_owned()), None),
                (Some("/p".to_owned()), Some("nbd.example".to_owned())),
            ];
            for (socket, (certs, host)) in [None, Some("/tmp/a b?c.sock".to_owned())]
                .into_iter()
                .flat_map(|s| tls.clone().map(|t| (s.clone(), t)))
            {
                let u = NbdUrl {
                    addr: if socket.is_some() {
                        String::new()
                    } else {
                        "[::1]:99".into()
                    },
                    export: export.to_owned(),
                    socket,
                    tls_certificates: certs,
                    tls_hostname: host,
                };
                assert_eq!(NbdUrl::parse(&u.to_string()).unwrap(), u, "{u}");
            }
        }
    }
}
