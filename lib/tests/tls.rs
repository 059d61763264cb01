//! NBD over TLS in process: the server in `require` mode with peer verification and the
//! library's own `nbds://` client; hostile clients before TLS (garbage, bad magic, a huge
//! option, plain EXPORT_NAME) and inside it (garbage after the handshake, bad request magic,
//! a huge option); 32 TLS connections at once; a client that reconnects does the whole
//! handshake again. The server keeps serving throughout. Certificates are made here.
#![cfg(feature = "tls")]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tagstripe::nbd::{NbdDevice, NbdServer, ServerConfig, TlsPolicy, tls};
use tagstripe::{BlockDevice, DynBlockDevice, IoOpts, MemDevice};
use tagstripe_nbd_proto::proto;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[path = "common/certs.rs"]
mod certs;
mod common;
#[path = "common/peers.rs"]
mod peers;

fn server(pki: &certs::Certs, dev: Arc<dyn DynBlockDevice>) -> NbdServer {
    NbdServer::new(ServerConfig {
        tls: TlsPolicy::Require,
        tls_config: Some(tls::server_config(&pki.server, true).unwrap()),
        handshake_timeout: Duration::from_secs(3),
        ..ServerConfig::default()
    })
    .export("vol", dev)
}

async fn start(s: NbdServer) -> (String, Arc<NbdServer>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let s = Arc::new(s);
    tokio::spawn(Arc::clone(&s).serve(l));
    (addr.to_string(), s)
}

async fn closed<S: AsyncRead + Unpin>(s: &mut S) -> bool {
    let mut b = [0u8; 64];
    loop {
        match tokio::time::timeout(Duration::from_secs(5), s.read(&mut b)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

async fn greet<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S) {
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).await.unwrap();
    assert_eq!(&hello[..8], b"NBDMAGIC");
    s.write_all(&proto::FLAG_C_FIXED_NEWSTYLE.to_be_bytes())
        .await
        .unwrap();
}

async fn option<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S, opt: u32, data: &[u8]) -> u32 {
    let h = proto::OptionHeader {
        option: opt,
        length: data.len() as u32,
    };
    s.write_all(&h.encode()).await.unwrap();
    s.write_all(data).await.unwrap();
    let mut r = [0u8; proto::OptionReply::LEN];
    s.read_exact(&mut r).await.unwrap();
    let rep = proto::OptionReply::parse(&r).unwrap();
    let mut d = vec![0u8; rep.length as usize];
    s.read_exact(&mut d).await.unwrap();
    rep.reply
}

/// A new plain connection, past the greeting.
async fn fresh(addr: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    greet(&mut s).await;
    s
}

/// A raw connection upgraded to TLS with the client certificate: the TLS stream, after
/// the greeting and STARTTLS.
async fn tls_raw(addr: &str, pki: &certs::Certs) -> tokio_rustls::client::TlsStream<TcpStream> {
    let mut s = TcpStream::connect(addr).await.unwrap();
    greet(&mut s).await;
    assert_eq!(
        option(&mut s, proto::OPT_STARTTLS, &[]).await,
        proto::REP_ACK
    );
    let cfg = tls::client_config(&pki.client).unwrap();
    tokio_rustls::TlsConnector::from(cfg)
        .connect("127.0.0.1".try_into().unwrap(), s)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_clients_before_and_inside_tls() {
    let dir = peers::scratch("tls-hostile");
    let pki = certs::make(&dir);
    let dev: Arc<dyn DynBlockDevice> = Arc::new(MemDevice::new("m", 8192));
    let (addr, srv) = start(server(&pki, Arc::clone(&dev))).await;
    let url = format!(
        "nbds://{addr}/vol?tls-certificates={}",
        pki.client.display()
    );
    let good = NbdDevice::connect(&url).await.unwrap();
    good.write(0, Bytes::from(vec![0x5a; 4096]), IoOpts::new())
        .await
        .unwrap();

    // Before TLS: garbage, a bad option magic, a huge option, a plain EXPORT_NAME.
    let mut s = fresh(&addr).await;
    s.write_all(&[0xAB; 64]).await.unwrap();
    assert!(closed(&mut s).await, "garbage before TLS");
    let mut s = fresh(&addr).await;
    let huge = proto::OptionHeader {
        option: proto::OPT_GO,
        length: u32::MAX,
    };
    s.write_all(&huge.encode()).await.unwrap();
    assert!(closed(&mut s).await, "a huge option before TLS");
    let mut s = fresh(&addr).await;
    assert_eq!(
        option(&mut s, proto::OPT_LIST, &[]).await,
        proto::REP_ERR_TLS_REQD
    );
    let name = proto::OptionHeader {
        option: proto::OPT_EXPORT_NAME,
        length: 3,
    };
    s.write_all(&name.encode()).await.unwrap();
    s.write_all(b"vol").await.unwrap();
    assert!(closed(&mut s).await, "EXPORT_NAME before TLS");
    // STARTTLS, then not a TLS handshake but plain bytes: closed.
    let mut s = fresh(&addr).await;
    assert_eq!(
        option(&mut s, proto::OPT_STARTTLS, &[]).await,
        proto::REP_ACK
    );
    s.write_all(&[0x16, 0x03, 0x01, 0xff, 0xff, 1, 2, 3])
        .await
        .unwrap();
    assert!(closed(&mut s).await, "a broken handshake");

    // Inside TLS: STARTTLS again is refused; garbage options close; a bad request magic
    // after GO closes; a huge option closes.
    let mut t = tls_raw(&addr, &pki).await;
    assert_eq!(
        option(&mut t, proto::OPT_STARTTLS, &[]).await,
        proto::REP_ERR_INVALID
    );
    t.write_all(b"NOTMAGIC\0\0\0\x07\0\0\0\0").await.unwrap();
    t.flush().await.unwrap();
    assert!(closed(&mut t).await, "bad option magic inside TLS");
    let mut t = tls_raw(&addr, &pki).await;
    t.write_all(&huge.encode()).await.unwrap();
    t.flush().await.unwrap();
    assert!(closed(&mut t).await, "a huge option inside TLS");
    let mut t = tls_raw(&addr, &pki).await;
    let go = proto::InfoRequest {
        name: "vol".to_owned(),
        requests: vec![],
    }
    .encode();
    let h = proto::OptionHeader {
        option: proto::OPT_GO,
        length: go.len() as u32,
    };
    t.write_all(&h.encode()).await.unwrap();
    t.write_all(&go).await.unwrap();
    t.flush().await.unwrap();
    let mut r = [0u8; proto::OptionReply::LEN];
    loop {
        t.read_exact(&mut r).await.unwrap();
        let rep = proto::OptionReply::parse(&r).unwrap();
        let mut d = vec![0u8; rep.length as usize];
        t.read_exact(&mut d).await.unwrap();
        if rep.reply == proto::REP_ACK {
            break;
        }
    }
    t.write_all(&[0xCD; 28]).await.unwrap();
    t.flush().await.unwrap();
    assert!(closed(&mut t).await, "a bad request magic inside TLS");

    // 32 TLS connections at once, each writing and reading its own sector.
    let mut tasks = Vec::new();
    for i in 0..32u64 {
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            let c = NbdDevice::connect(&url).await.unwrap();
            let d = vec![i as u8 + 1; 512];
            c.write(1024 + i, Bytes::from(d.clone()), IoOpts::new())
                .await
                .unwrap();
            assert_eq!(c.read(1024 + i, 1, IoOpts::new()).await.unwrap(), d);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // The first client, connected all along, still works and sees the others' writes.
    assert_eq!(
        good.read(0, 8, IoOpts::new()).await.unwrap(),
        vec![0x5a; 4096]
    );
    assert_eq!(
        good.read(1031, 1, IoOpts::new()).await.unwrap(),
        vec![8u8; 512]
    );
    assert!(
        srv.counters()
            .protocol_errors
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 6
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The client's connection is lost (the server shut down and comes back on the same port):
/// the next request connects again and does the whole TLS handshake again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnecting_client_handshakes_again() {
    let dir = peers::scratch("tls-reconnect");
    let pki = certs::make(&dir);
    let dev: Arc<dyn DynBlockDevice> = Arc::new(MemDevice::new("m", 4096));
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let first = Arc::new(server(&pki, Arc::clone(&dev)));
    let serving = tokio::spawn(Arc::clone(&first).serve(l));
    let url = format!(
        "nbds://{addr}/vol?tls-certificates={}",
        pki.client.display()
    );
    let c = NbdDevice::connect(&url).await.unwrap();
    c.write(8, Bytes::from(vec![3u8; 4096]), IoOpts::new())
        .await
        .unwrap();
    first.shutdown();
    serving.await.unwrap().unwrap();
    let l = TcpListener::bind(addr).await.unwrap();
    let second = Arc::new(server(&pki, Arc::clone(&dev)));
    tokio::spawn(Arc::clone(&second).serve(l));
    // The first request after the loss may fail (it was on the old connection); the next
    // ones go over a new TLS connection.
    let mut back = None;
    for _ in 0..3 {
        if let Ok(d) = c.read(8, 8, IoOpts::new()).await {
            back = Some(d);
            break;
        }
    }
    assert_eq!(back.as_deref(), Some(&vec![3u8; 4096][..]));
    assert!(
        second
            .counters()
            .transmissions
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 1,
        "the new connection went through the new server's TLS"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
