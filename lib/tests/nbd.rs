//! NBD: the server and the client backend against each other, against real peers (qemu-nbd,
//! nbdkit with its error and delay filters), and against hostile clients speaking raw bytes.
//! Tests that need a tool print why they skip when it is missing; CI installs them.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tagstripe::nbd::{ClientConfig, NbdDevice, NbdServer, ServerConfig};
use tagstripe::quirks::QuirkSet;
use tagstripe::{BlockDevice, DynBlockDevice, Error, IoOpts, MemDevice, Volume};
use tagstripe_nbd_proto::proto;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[path = "common/peers.rs"]
mod peers;
use peers::{Peer, have, nbdkit, pattern, qemu_nbd, qemu_nbd_on, scratch};

fn striped_mem(n: usize, sectors: u64) -> Volume {
    let comps: Vec<Arc<dyn DynBlockDevice>> = (0..n)
        .map(|i| Arc::new(MemDevice::new(&format!("mem{i}"), sectors)) as Arc<dyn DynBlockDevice>)
        .collect();
    Volume::builder(comps)
        .interleave(16)
        .quirks(QuirkSet::empty())
        .build()
        .unwrap()
}

/// Serves `server` on a loopback port; returns its URL base `nbd://127.0.0.1:PORT`.
async fn start(server: NbdServer) -> (String, Arc<NbdServer>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let server = Arc::new(server);
    tokio::spawn(Arc::clone(&server).serve(l));
    (format!("nbd://{addr}"), server)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_and_server_agree_at_depth() {
    let vol: Arc<dyn DynBlockDevice> = Arc::new(striped_mem(3, 32768));
    let (base, server) =
        start(NbdServer::new(ServerConfig::default()).export("vol", vol.clone())).await;
    let c = Arc::new(NbdDevice::connect(&format!("{base}/vol")).await.unwrap());
    assert_eq!(c.info().sectors, vol.info().sectors);
    assert!(c.caps().trim);
    // 64 writes in flight, then 64 reads, each checked.
    let mut tasks = Vec::new();
    for i in 0..64u64 {
        let c = Arc::clone(&c);
        tasks.push(tokio::spawn(async move {
            let d = pattern(i, 8 * 512);
            c.write(i * 160, Bytes::from(d), IoOpts::new())
                .await
                .unwrap();
        }));
    }
    for t in tasks.drain(..) {
        t.await.unwrap();
    }
    c.flush(IoOpts::new()).await.unwrap();
    for i in 0..64u64 {
        let c = Arc::clone(&c);
        tasks.push(tokio::spawn(async move {
            let got = c.read(i * 160, 8, IoOpts::new()).await.unwrap();
            assert_eq!(got, pattern(i, 8 * 512), "request {i}");
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // What the client wrote is in the volume.
    assert_eq!(
        vol.read(160, 8, IoOpts::new()).await.unwrap(),
        pattern(1, 4096)
    );
    // Discard zeroes; FUA writes complete.
    c.discard(0, 16, IoOpts::new()).await.unwrap();
    assert_eq!(
        c.read(0, 16, IoOpts::new()).await.unwrap(),
        vec![0u8; 16 * 512]
    );
    c.write(32, Bytes::from(vec![7u8; 512]), IoOpts::new().fua(true))
        .await
        .unwrap();
    assert_eq!(
        vol.read(32, 1, IoOpts::new()).await.unwrap(),
        vec![7u8; 512]
    );
    // A request larger than the server's maximum is split by the client.
    let big = pattern(99, 40 << 20);
    let c2 = NbdDevice::connect(&format!("{base}/vol")).await.unwrap();
    c2.write(0, Bytes::from(big.clone()), IoOpts::new())
        .await
        .unwrap();
    assert_eq!(
        c2.read(0, (40 << 20) / 512, IoOpts::new()).await.unwrap(),
        big
    );
    assert_eq!(c2.info().limits.max_hw_sectors, (32 << 20) / 512);
    assert!(
        server
            .counters()
            .transmissions
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_reach_the_client_typed() {
    let dev: Arc<dyn DynBlockDevice> = Arc::new(MemDevice::new("ro", 2048));
    let server = NbdServer::new(ServerConfig::default())
        .export_with("ro", dev.clone(), "read-only", true)
        .export("rw", dev);
    let (base, _s) = start(server).await;
    let ro = NbdDevice::connect(&format!("{base}/ro")).await.unwrap();
    assert!(ro.info().read_only);
    // The client refuses locally; the server would say EPERM.
    assert!(matches!(
        ro.write(0, Bytes::from(vec![1u8; 512]), IoOpts::new())
            .await,
        Err(Error::ReadOnly { .. })
    ));
    // Unknown export: a typed protocol error naming it.
    match NbdDevice::connect(&format!("{base}/nope")).await {
        Err(Error::Protocol { what, .. }) => assert!(what.contains("nope"), "{what}"),
        other => panic!("expected a protocol error, got {other:?}"),
    }
    // The empty name is the default export (the first one).
    let d = NbdDevice::connect(&base).await.unwrap();
    assert_eq!(d.info().sectors, 2048);
    // Past the end: refused before anything is sent.
    assert!(matches!(
        d.read(2040, 16, IoOpts::new()).await,
        Err(Error::OutOfRange { .. })
    ));
}

/// Reads and writes of 256 KiB and more run in tasks of their own: many at once, beside small
/// ones, on a device whose writes fail in one range, each gets its own answer (the failures
/// as errors, the rest written and read back whole).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_requests_apart_get_their_own_answers() {
    use tagstripe::{Fault, FaultDevice, FaultKind, FaultOp};
    let dev = FaultDevice::new(MemDevice::new("mem", 64 << 11));
    // Writes within the second 8 MiB fail.
    dev.inject(Fault {
        sectors: Some((8 << 11, 16 << 11)),
        ..Fault::always(FaultOp::Write, FaultKind::Error)
    });
    let dev: Arc<dyn DynBlockDevice> = Arc::new(dev);
    let (base, _s) = start(NbdServer::new(ServerConfig::default()).export("d", dev)).await;
    let d = Arc::new(NbdDevice::connect(&format!("{base}/d")).await.unwrap());
    let mut tasks = Vec::new();
    for i in 0..32u64 {
        let d = Arc::clone(&d);
        tasks.push(tokio::spawn(async move {
            // 1 MiB at MiB i (i in 8..16 fail), and 4 KiB at the end of MiB 32 + i.
            let big = d
                .write(i << 11, Bytes::from(pattern(i, 1 << 20)), IoOpts::new())
                .await;
            let small = d
                .write(
                    ((32 + i) << 11) + 2040,
                    Bytes::from(pattern(i, 4096)),
                    IoOpts::new(),
                )
                .await;
            (i, big.is_ok(), small.is_ok())
        }));
    }
    for t in tasks {
        let (i, big, small) = t.await.unwrap();
        assert_eq!(big, !(8..16).contains(&i), "1 MiB write at MiB {i}");
        assert!(small, "4 KiB write {i}");
    }
    for i in (0..8u64).chain(16..32) {
        assert_eq!(
            d.read(i << 11, 2048, IoOpts::new()).await.unwrap(),
            pattern(i, 1 << 20),
            "MiB {i}"
        );
    }
}

/// Small ops finished together are answered in batched writes: a burst of 4 KiB reads,
/// some failing, and writes beside them, 256 at once on one connection, each gets its own
/// answer (the right block's bytes, or the error).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_small_replies_batched_keeps_each_answer_its_own() {
    use tagstripe::{Fault, FaultDevice, FaultKind, FaultOp};
    let mem = MemDevice::new("mem", 8 << 11);
    for b in 0..128u64 {
        mem.write(b * 8, Bytes::from(pattern(b, 4096)), IoOpts::new())
            .await
            .unwrap();
    }
    let dev = FaultDevice::new(mem);
    // Reads of blocks 32..48 fail.
    dev.inject(Fault {
        sectors: Some((32 * 8, 48 * 8)),
        ..Fault::always(FaultOp::Read, FaultKind::Error)
    });
    let dev: Arc<dyn DynBlockDevice> = Arc::new(dev);
    let (base, _s) = start(NbdServer::new(ServerConfig::default()).export("d", dev)).await;
    let d = Arc::new(NbdDevice::connect(&format!("{base}/d")).await.unwrap());
    for round in 0..4u64 {
        let mut tasks = Vec::new();
        for b in 0..128u64 {
            let d = Arc::clone(&d);
            tasks.push(tokio::spawn(async move {
                let read = d.read(b * 8, 8, IoOpts::new()).await;
                let w = 1024 + round * 128 + b;
                let wrote = d
                    .write((128 + b) * 8, Bytes::from(pattern(w, 4096)), IoOpts::new())
                    .await;
                (b, read, wrote.is_ok())
            }));
        }
        for t in tasks {
            let (b, read, wrote) = t.await.unwrap();
            if (32..48).contains(&b) {
                assert!(read.is_err(), "block {b}: its read fails");
            } else {
                assert_eq!(read.unwrap(), pattern(b, 4096), "block {b}");
            }
            assert!(wrote, "write beside block {b}");
        }
        for b in 0..128u64 {
            assert_eq!(
                d.read((128 + b) * 8, 8, IoOpts::new()).await.unwrap(),
                pattern(1024 + round * 128 + b, 4096),
                "round {round}, written block {b}"
            );
        }
    }
}

/// A file served as `serve` opens one, and a striped volume of four: cached reads of 32 KiB
/// and more go out as views of the page cache (`read_to_send`, and for the volume each
/// piece's view, `read_parts_to_send`). Rounds of writes over every region, each followed
/// by reads of it (whole, and a 64 KiB piece) while the other regions are written: every
/// read sees the write before it, never an older or a neighbour's; a region never written
/// reads as zeroes (sent as a hole).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_sent_from_the_page_cache_see_every_write_before_them() {
    writes_then_reads_over_nbd("views", false).await;
}

/// The same with `O_DIRECT`: the server polls a connection's ops plugged, so the requests
/// read from the socket in one go are held in each io_uring's submission queue and entered
/// together (`Plugged`); every one of them completes, one device or four, and reads back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn o_direct_requests_plugged_by_the_server_complete_and_read_back() {
    writes_then_reads_over_nbd("plugged", true).await;
}

/// `files` zeroed files in `dir` of `bytes` between them, opened as `serve` opens them (with
/// `O_DIRECT` if `direct`): the one file itself, or a striped volume of them with chunks of
/// `interleave` sectors.
async fn files_device(
    dir: &std::path::Path,
    files: usize,
    bytes: usize,
    direct: bool,
    interleave: u64,
) -> Arc<dyn DynBlockDevice> {
    let mut comps = Vec::new();
    for i in 0..files {
        let img = dir.join(format!("disk{files}-{i}.img"));
        std::fs::write(&img, vec![0u8; bytes / files]).unwrap();
        let opts = tagstripe::OpenOptions::new().direct(direct);
        comps.push(tagstripe::open(img.to_str().unwrap(), &opts).await.unwrap());
    }
    if files == 1 {
        return comps.remove(0);
    }
    let vol = Volume::builder(comps)
        .interleave(interleave)
        .quirks(QuirkSet::empty())
        .build()
        .unwrap();
    Arc::new(vol)
}

/// A 16 MiB file in a directory of its own under /dev/shm (named for `tag`), opened as
/// `serve` opens it, where it lends its pages (tmpfs); else `None`, with the reason printed.
async fn shm_device(tag: &str) -> Option<(std::path::PathBuf, Arc<dyn DynBlockDevice>)> {
    let shm = std::path::PathBuf::from(format!("/dev/shm/tagstripe-{tag}-{}", std::process::id()));
    if std::fs::create_dir_all(&shm).is_err() {
        eprintln!("skipped: no /dev/shm here");
        return None;
    }
    let dev = files_device(&shm, 1, 16 << 20, false, 128).await;
    if !dev.lands_writes() {
        eprintln!("skipped: /dev/shm is not tmpfs here (no landing in place)");
        std::fs::remove_dir_all(&shm).unwrap();
        return None;
    }
    Some((shm, dev))
}

/// Serves one file and then a striped volume of four (opened as `serve` opens them, with
/// `O_DIRECT` if `direct`) and runs 6 rounds of 16 concurrent regions: a write of 512 KiB,
/// then a read of it whole and of a 64 KiB piece; then reads a region never written.
async fn writes_then_reads_over_nbd(name: &str, direct: bool) {
    let dir = scratch(name);
    for files in [1usize, 4] {
        let dev = files_device(&dir, files, 9 << 20, direct, 128).await;
        let (base, _s) = start(NbdServer::new(ServerConfig::default()).export("d", dev)).await;
        let d = Arc::new(NbdDevice::connect(&format!("{base}/d")).await.unwrap());
        const REGION: u64 = 1024; // sectors: 512 KiB
        for round in 0..6u64 {
            let mut tasks = Vec::new();
            for r in 0..16u64 {
                let d = Arc::clone(&d);
                tasks.push(tokio::spawn(async move {
                    let want = pattern(round * 16 + r, (REGION * 512) as usize);
                    d.write(r * REGION, Bytes::from(want.clone()), IoOpts::new())
                        .await
                        .unwrap();
                    let whole = d.read(r * REGION, REGION, IoOpts::new()).await.unwrap();
                    assert!(whole == want, "{files} files, round {round}, region {r}");
                    let piece = d.read(r * REGION + 192, 128, IoOpts::new()).await.unwrap();
                    assert!(
                        piece == want[192 * 512..320 * 512],
                        "{files} files, round {round}, region {r}"
                    );
                }));
            }
            // A request left in a submission queue would hang here: bounded.
            let all = async {
                for t in tasks {
                    t.await.unwrap();
                }
            };
            tokio::time::timeout(Duration::from_secs(60), all)
                .await
                .unwrap_or_else(|_| panic!("{files} files, round {round}: requests hung"));
        }
        let untouched = d.read(16 * REGION, 1024, IoOpts::new()).await.unwrap();
        assert!(untouched.iter().all(|&b| b == 0), "{files} files");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Large reads of cached data over a Unix socket go to the socket as the page cache's own
/// pages (`sendfile`): what arrives is what was written, a rewrite shows in the next read
/// (the pages are sent as they are, not a stale copy), for one file and for a striped volume
/// of two with a 64 KiB interleave (a reply in 16 views, each smaller than what is sent from
/// the page cache alone, together larger); the server counts the bytes so sent. Over TCP it
/// never sends that way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_cached_reads_over_a_unix_socket_are_sent_from_the_page_cache() {
    let dir = scratch("sendfile");
    for files in [1usize, 2] {
        let dev = files_device(&dir, files, 8 << 20, false, 128).await;
        let sock = dir.join(format!("s{files}.sock"));
        let l = tokio::net::UnixListener::bind(&sock).unwrap();
        let server =
            Arc::new(NbdServer::new(ServerConfig::default()).export("d", Arc::clone(&dev)));
        tokio::spawn(Arc::clone(&server).serve_unix(l));
        let url = format!("nbd+unix:///d?socket={}", sock.display());
        let d = NbdDevice::connect(&url).await.unwrap();
        let (l, t) = TcpListener::bind("127.0.0.1:0")
            .await
            .map(|l| (l.local_addr().unwrap(), l))
            .unwrap();
        let tcp_server = Arc::new(NbdServer::new(ServerConfig::default()).export("d", dev));
        tokio::spawn(Arc::clone(&tcp_server).serve(t));
        let over_tcp = NbdDevice::connect(&format!("nbd://{l}/d")).await.unwrap();
        const MIB: u64 = 2048; // sectors
        let mut sent = 0;
        for round in 0..3u64 {
            for m in 0..4u64 {
                let want = pattern(round * 4 + m + 100 * files as u64, (MIB * 512) as usize);
                d.write(m * MIB, Bytes::from(want.clone()), IoOpts::new())
                    .await
                    .unwrap();
                let got = d.read(m * MIB, MIB, IoOpts::new()).await.unwrap();
                assert!(got == want, "{files} files, round {round}, MiB {m}");
                // Unaligned to the views' pages and to the volume's chunks: 640 KiB from
                // 96 KiB in.
                let piece = d.read(m * MIB + 192, 1280, IoOpts::new()).await.unwrap();
                assert!(
                    piece == want[192 * 512..1472 * 512],
                    "{files} files, round {round}, MiB {m}"
                );
                let by_tcp = over_tcp.read(m * MIB, MIB, IoOpts::new()).await.unwrap();
                assert!(
                    by_tcp == want,
                    "{files} files over TCP, round {round}, MiB {m}"
                );
            }
            let now = server
                .counters()
                .bytes_sent_from_cache
                .load(std::sync::atomic::Ordering::Relaxed);
            assert!(
                now >= sent + 4 * (1 << 20),
                "{files} files, round {round}: {} bytes sent from the page cache",
                now - sent
            );
            sent = now;
        }
        assert_eq!(
            tcp_server
                .counters()
                .bytes_sent_from_cache
                .load(std::sync::atomic::Ordering::Relaxed),
            0,
            "TCP never sends from the page cache"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Large write payloads come off a TCP socket into pipes and are spliced into the file
/// (over a Unix socket they are read as usual), or, to one file in memory (/dev/shm),
/// straight into its pages over either socket: what is read back, through the server and
/// from the device itself, is what was written, with 1 MiB writes in flight together,
/// 4 KiB writes among them, a 3 MiB write and a 6 MiB one (beyond the size handed off);
/// the server counts the bytes so taken. A striped volume takes them too, each
/// component's run cut from the pipe. A client that hangs up inside a payload leaves the
/// server serving and the sectors as they were (received in place: each byte as it was or
/// as the client sent it, a torn write).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_write_payloads_come_off_the_socket_into_pipes() {
    let shm_is_tmpfs = std::fs::read_to_string("/proc/mounts")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(1) == Some("/dev/shm") && l.split(' ').nth(2) == Some("tmpfs"));
    let mut dirs = vec![(scratch("splice"), false)];
    if shm_is_tmpfs {
        let shm =
            std::path::PathBuf::from(format!("/dev/shm/tagstripe-nbd-{}", std::process::id()));
        std::fs::create_dir_all(&shm).unwrap();
        dirs.push((shm, true));
    } else {
        eprintln!("skipped in part: /dev/shm is not tmpfs here (no landing in place)");
    }
    for (dir, memory) in &dirs {
        for files in [1usize, 2] {
            for unix in [true, false] {
                let dev = files_device(dir, files, 16 << 20, false, 128).await;
                // The one file in memory lends its pages (and a file elsewhere may: /tmp is
                // tmpfs on some systems); a volume never does.
                let lands = dev.lands_writes();
                assert!(!(lands && files == 2), "a volume lends no pages");
                if *memory && files == 1 {
                    assert!(lands, "a file in /dev/shm lends its pages");
                }
                let server = NbdServer::new(ServerConfig::default()).export("d", Arc::clone(&dev));
                let (url, server) = if unix {
                    let sock = dir.join(format!("w{files}.sock"));
                    let _ = std::fs::remove_file(&sock);
                    let l = tokio::net::UnixListener::bind(&sock).unwrap();
                    let server = Arc::new(server);
                    tokio::spawn(Arc::clone(&server).serve_unix(l));
                    (format!("nbd+unix:///d?socket={}", sock.display()), server)
                } else {
                    let (base, server) = start(server).await;
                    (format!("{base}/d"), server)
                };
                let how = format!(
                    "{files} files in {}, {}",
                    dir.display(),
                    if unix { "unix" } else { "tcp" }
                );
                let d = Arc::new(NbdDevice::connect(&url).await.unwrap());
                const MIB: u64 = 2048; // sectors
                let mut want = vec![0u8; 16 << 20];
                for round in 0..3u64 {
                    let mut tasks = Vec::new();
                    for m in 0..8u64 {
                        let data = pattern(round * 8 + m + 10 * files as u64, 1 << 20);
                        want[(m * MIB * 512) as usize..][..1 << 20].copy_from_slice(&data);
                        let dd = Arc::clone(&d);
                        tasks.push(tokio::spawn(async move {
                            dd.write(m * MIB, Bytes::from(data), IoOpts::new()).await
                        }));
                        // A small write beside it, in the next MiB's last page.
                        let small = pattern(round + 1000 * m, 4096);
                        let at = (m + 8) * MIB + MIB - 8;
                        want[(at * 512) as usize..][..4096].copy_from_slice(&small);
                        let dd = Arc::clone(&d);
                        tasks.push(tokio::spawn(async move {
                            dd.write(at, Bytes::from(small), IoOpts::new()).await
                        }));
                    }
                    for t in tasks {
                        t.await.unwrap().unwrap_or_else(|e| panic!("{how}: {e}"));
                    }
                    let got = d.read(0, 16 * MIB, IoOpts::new()).await.unwrap();
                    assert!(got == want, "{how}, round {round}: read back over NBD");
                    let direct = dev.read(0, 16 * MIB, IoOpts::new()).await.unwrap();
                    assert!(direct == want, "{how}, round {round}: read from the device");
                }
                for (at, len) in [(MIB, 3usize << 20), (8 * MIB, 6 << 20)] {
                    let data = pattern(at + len as u64, len);
                    d.write(at, Bytes::from(data.clone()), IoOpts::new())
                        .await
                        .unwrap();
                    want[(at * 512) as usize..][..len].copy_from_slice(&data);
                    let got = dev.read(at, len as u64 / 512, IoOpts::new()).await.unwrap();
                    assert!(got == data, "{how}: {len} bytes at sector {at}");
                }
                // A write that asks to be durable (FUA) is not landed: it goes the usual
                // way (its payload into memory or a pipe), whole.
                let in_place = |s: &Arc<NbdServer>| {
                    (s.counters().bytes_received_in_place)
                        .load(std::sync::atomic::Ordering::Relaxed)
                };
                let before = in_place(&server);
                let data = pattern(77 + files as u64, 1 << 20);
                d.write(2 * MIB, Bytes::from(data.clone()), IoOpts::new().fua(true))
                    .await
                    .unwrap();
                want[(2 * MIB * 512) as usize..][..1 << 20].copy_from_slice(&data);
                let got = dev.read(2 * MIB, MIB, IoOpts::new()).await.unwrap();
                assert!(got == data, "{how}: the FUA write");
                assert_eq!(in_place(&server), before, "{how}: a FUA write landed");
                let piped = server
                    .counters()
                    .bytes_received_into_pipes
                    .load(std::sync::atomic::Ordering::Relaxed);
                let landed = server
                    .counters()
                    .bytes_received_in_place
                    .load(std::sync::atomic::Ordering::Relaxed);
                if lands {
                    // Over either socket: 24 writes of 1 MiB, one of 3 MiB and one of 6 MiB (in
                    // pieces of 4 MiB), each less what came with its header or piece; into
                    // pipes only the FUA write's payload, and only over TCP.
                    let fua_max = if unix { 0 } else { 1 << 20 };
                    assert!(piped <= fua_max, "{how}: {piped} bytes into pipes");
                    assert!(landed >= 24 << 20, "{how}: {landed} bytes in place");
                } else if unix {
                    assert_eq!(landed, 0, "{how}: {landed} bytes in place");
                    // A Unix socket reads them as usual.
                    assert_eq!(piped, 0, "{how}: {piped} bytes into pipes");
                } else {
                    // 24 writes of 1 MiB and one of 3 MiB, each less what came with its header
                    // (a volume's cut into its components' runs, pipe to pipe).
                    assert!(piped >= 20 << 20, "{how}: {piped} bytes into pipes");
                }
                // A client that hangs up 300 KiB into a 1 MiB payload.
                let mut raw: Box<dyn RawStream> = if unix {
                    let sock = dir.join(format!("w{files}.sock"));
                    Box::new(tokio::net::UnixStream::connect(&sock).await.unwrap())
                } else {
                    let addr = url.trim_start_matches("nbd://").trim_end_matches("/d");
                    Box::new(TcpStream::connect(addr).await.unwrap())
                };
                export_name(&mut raw, "d").await;
                let r = proto::Request {
                    flags: 0,
                    command: proto::Command::Write,
                    handle: 1,
                    offset: 4 << 20,
                    length: 1 << 20,
                };
                raw.write_all(&r.encode()).await.unwrap();
                raw.write_all(&vec![0xa5u8; 300 << 10]).await.unwrap();
                drop(raw);
                // The server goes on serving, and the sectors are as they were.
                let got = d.read(8 * MIB, MIB, IoOpts::new()).await.unwrap();
                assert!(
                    got[..] == want[(8 * MIB * 512) as usize..][..1 << 20],
                    "{how}"
                );
                let got = dev.read(8192, 2048, IoOpts::new()).await.unwrap();
                if lands {
                    let old = &want[4 << 20..5 << 20];
                    assert!(
                        got.iter().zip(old).all(|(&g, &o)| g == o || g == 0xa5),
                        "{how}: the cut-off write tore no more than its own bytes"
                    );
                } else {
                    assert!(
                        got[..] == want[4 << 20..5 << 20],
                        "{how}: the cut-off write wrote nothing"
                    );
                }
            }
        }
        std::fs::remove_dir_all(dir).unwrap();
    }
}

/// A client that stops part way through a write's payload received in place (a file in
/// /dev/shm) holds up no other client's writes: an unaligned one (a read-modify-write,
/// which waits for every write in progress) completes, as does an aligned one, and the
/// stalled write's own bytes are those of the client or as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_payload_received_in_place_holds_up_no_other_writer() {
    let Some((shm, dev)) = shm_device("stall").await else {
        return;
    };
    let server = Arc::new(NbdServer::new(ServerConfig::default()).export("d", Arc::clone(&dev)));
    let sock = shm.join("s.sock");
    let l = tokio::net::UnixListener::bind(&sock).unwrap();
    tokio::spawn(Arc::clone(&server).serve_unix(l));
    // The stalled client: a 1 MiB write at 4 MiB, 300 KiB of its payload, then nothing.
    let mut stalled = tokio::net::UnixStream::connect(&sock).await.unwrap();
    export_name(&mut stalled, "d").await;
    let w = proto::Request {
        flags: 0,
        command: proto::Command::Write,
        handle: 1,
        offset: 4 << 20,
        length: 1 << 20,
    };
    stalled.write_all(&w.encode()).await.unwrap();
    stalled.write_all(&vec![0x5au8; 300 << 10]).await.unwrap();
    // Until the server has read its header (and begun taking the payload in place).
    let requests = || (server.counters().requests).load(std::sync::atomic::Ordering::Relaxed);
    while requests() < 1 {
        tokio::task::yield_now().await;
    }
    // Another client: an unaligned write (bytes 100..1100 of the 8th MiB), then an aligned
    // 1 MiB one. A failure here is a hang: bounded at 30 s so that it says so.
    let mut other = tokio::net::UnixStream::connect(&sock).await.unwrap();
    export_name(&mut other, "d").await;
    let mut answers = Vec::new();
    for (handle, offset, len) in [(7u64, (8u64 << 20) + 100, 1000u32), (8, 10 << 20, 1 << 20)] {
        let r = proto::Request {
            flags: 0,
            command: proto::Command::Write,
            handle,
            offset,
            length: len,
        };
        other.write_all(&r.encode()).await.unwrap();
        other
            .write_all(&vec![handle as u8; len as usize])
            .await
            .unwrap();
        let mut h = [0u8; 16];
        tokio::time::timeout(Duration::from_secs(30), other.read_exact(&mut h))
            .await
            .expect("the other client's write was held up by the stalled one")
            .unwrap();
        let rep = proto::SimpleReply::parse(&h).unwrap();
        answers.push((rep.handle, rep.error));
    }
    assert_eq!(answers, [(7, 0), (8, 0)]);
    let got = dev.read((8 << 20) / 512, 8, IoOpts::new()).await.unwrap();
    assert!(got[..100].iter().all(|&b| b == 0) && got[100..1100].iter().all(|&b| b == 7));
    let got = dev
        .read((10 << 20) / 512, 2048, IoOpts::new())
        .await
        .unwrap();
    assert!(got.iter().all(|&b| b == 8));
    // The stalled client gives up: its write tore no more than its own bytes.
    drop(stalled);
    let got = dev
        .read((4 << 20) / 512, 2048, IoOpts::new())
        .await
        .unwrap();
    assert!(got.iter().all(|&b| b == 0 || b == 0x5a));
    server.shutdown();
    std::fs::remove_dir_all(&shm).unwrap();
}

/// 64 KiB writes each sent whole with its header, one after the other, to a file in
/// /dev/shm: after the first few, the server reads each request header alone, and every
/// payload is received in place (read with its header into memory, it would be written
/// from there); reads among them are answered as usual, and what is read back is what was
/// written. Over a Unix socket and over TCP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payloads_sent_with_their_headers_are_received_in_place() {
    let Some((shm, dev)) = shm_device("whole").await else {
        return;
    };
    let sock = shm.join("s.sock");
    let unix = Arc::new(NbdServer::new(ServerConfig::default()).export("d", Arc::clone(&dev)));
    tokio::spawn(Arc::clone(&unix).serve_unix(tokio::net::UnixListener::bind(&sock).unwrap()));
    let (url, tcp) =
        start(NbdServer::new(ServerConfig::default()).export("d", Arc::clone(&dev))).await;
    const WRITES: u64 = 40;
    let mut want = vec![0u8; 16 << 20];
    for (how, server) in [("unix", unix), ("tcp", tcp)] {
        let mut c: Box<dyn RawStream> = if how == "unix" {
            Box::new(tokio::net::UnixStream::connect(&sock).await.unwrap())
        } else {
            let addr = url.trim_start_matches("nbd://");
            Box::new(TcpStream::connect(addr).await.unwrap())
        };
        export_name(&mut c, "d").await;
        for i in 0..WRITES {
            let at = (i * 7 % 256) << 16;
            let data = pattern(i + if how == "unix" { 0 } else { 1000 }, 64 << 10);
            want[at as usize..][..64 << 10].copy_from_slice(&data);
            let w = proto::Request {
                flags: 0,
                command: proto::Command::Write,
                handle: i,
                offset: at,
                length: 64 << 10,
            };
            let mut wire = w.encode().to_vec();
            wire.extend_from_slice(&data);
            // A read of what was written before, every fourth request.
            let read = (i % 4 == 3).then(|| {
                let r = proto::Request {
                    command: proto::Command::Read,
                    handle: 1000 + i,
                    length: 4096,
                    ..w
                };
                r.encode()
            });
            c.write_all(&wire).await.unwrap();
            let mut h = [0u8; 16];
            c.read_exact(&mut h).await.unwrap();
            assert_eq!(
                proto::SimpleReply::parse(&h).unwrap().error,
                0,
                "{how}: write {i}"
            );
            if let Some(r) = read {
                c.write_all(&r).await.unwrap();
                c.read_exact(&mut h).await.unwrap();
                assert_eq!(
                    proto::SimpleReply::parse(&h).unwrap().error,
                    0,
                    "{how}: read {i}"
                );
                let mut got = vec![0u8; 4096];
                c.read_exact(&mut got).await.unwrap();
                assert!(got == data[..4096], "{how}: read {i}");
            }
        }
        let landed = server
            .counters()
            .bytes_received_in_place
            .load(std::sync::atomic::Ordering::Relaxed);
        // All but the first few: the server reads headers alone once long writes make up
        // much of what the client sends.
        assert!(
            landed >= (WRITES - 8) * (64 << 10),
            "{how}: {landed} bytes of {} received in place",
            WRITES * (64 << 10)
        );
        let got = dev.read(0, (16 << 20) / 512, IoOpts::new()).await.unwrap();
        assert!(got == want, "{how}: read back");
        server.shutdown();
    }
    std::fs::remove_dir_all(&shm).unwrap();
}

/// A stream a raw test client speaks over (TCP or a Unix socket).
trait RawStream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> RawStream for T {}

// ---------------------------------------------------------------------------------------
// Real peers.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_against_qemu_nbd() {
    if !have("qemu-nbd") {
        return;
    }
    let dir = scratch("qemu");
    let img = dir.join("disk.img");
    let mut init = pattern(5, 4 << 20);
    std::fs::write(&img, &init).unwrap();
    let peer = qemu_nbd(&img, "disk");
    let url = format!("nbd://127.0.0.1:{}/disk", peer.port);
    let d = Arc::new(NbdDevice::connect(&url).await.unwrap());
    assert_eq!(d.info().sectors, 8192);
    assert_eq!(d.read(0, 8192, IoOpts::new()).await.unwrap(), init);
    let mut tasks = Vec::new();
    for i in 0..32u64 {
        let d = Arc::clone(&d);
        tasks.push(tokio::spawn(async move {
            d.write(
                i * 64,
                Bytes::from(pattern(100 + i, 64 * 512)),
                IoOpts::new(),
            )
            .await
            .unwrap();
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    d.flush(IoOpts::new()).await.unwrap();
    for i in 0..32usize {
        init[i * 64 * 512..(i + 1) * 64 * 512].copy_from_slice(&pattern(100 + i as u64, 64 * 512));
    }
    // The bytes are in qemu-nbd's file.
    assert_eq!(std::fs::read(&img).unwrap(), init);
    d.discard(0, 64, IoOpts::new()).await.unwrap();
    drop(d);
    drop(peer);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_against_nbdkit_memory_and_filters() {
    if !have("nbdkit") {
        return;
    }
    let dir = scratch("nbdkit");
    // Plain memory plugin.
    let mem = nbdkit(&["memory", "16M"]);
    let d = NbdDevice::connect(&format!("nbd://127.0.0.1:{}", mem.port))
        .await
        .unwrap();
    assert_eq!(d.info().sectors, 32768);
    d.write(8, Bytes::from(pattern(1, 1 << 20)), IoOpts::new())
        .await
        .unwrap();
    assert_eq!(
        d.read(8, 2048, IoOpts::new()).await.unwrap(),
        pattern(1, 1 << 20)
    );
    d.flush(IoOpts::new()).await.unwrap();
    d.discard(8, 2048, IoOpts::new()).await.unwrap();
    assert_eq!(d.read(8, 8, IoOpts::new()).await.unwrap(), vec![0u8; 4096]);

    // The error filter: every read fails with EIO, which surfaces typed and named.
    let bad = nbdkit(&[
        "--filter=error",
        "memory",
        "16M",
        "error-pread=EIO",
        "error-pread-rate=100%",
    ]);
    let d = NbdDevice::connect(&format!("nbd://127.0.0.1:{}", bad.port))
        .await
        .unwrap();
    d.write(0, Bytes::from(vec![1u8; 4096]), IoOpts::new())
        .await
        .unwrap();
    match d.read(0, 8, IoOpts::new()).await {
        Err(Error::Nbd {
            errno, device, op, ..
        }) => {
            assert_eq!(errno, proto::errno::EIO);
            assert_eq!(op, "read");
            assert!(device.contains(&bad.port.to_string()), "{device}");
        }
        other => panic!("expected an NBD EIO, got {other:?}"),
    }
    // In a volume, the error names the component.
    let vol = Volume::builder(vec![
        Arc::new(MemDevice::new("m", 32768)) as Arc<dyn DynBlockDevice>,
        Arc::new(d),
    ])
    .interleave(16)
    .quirks(QuirkSet::empty())
    .build()
    .unwrap();
    match vol.read(16, 8, IoOpts::new()).await {
        Err(Error::Component {
            component: 1,
            source,
            ..
        }) => {
            assert!(matches!(*source, Error::Nbd { errno: 5, .. }), "{source}");
        }
        other => panic!("expected component 1's EIO, got {other:?}"),
    }

    // The delay filter: 2 s per read against a 300 ms timeout.
    let slow = nbdkit(&["--filter=delay", "memory", "16M", "rdelay=2"]);
    let d = NbdDevice::connect_with(
        &format!("nbd://127.0.0.1:{}", slow.port),
        ClientConfig {
            request_timeout: Duration::from_millis(300),
            ..ClientConfig::default()
        },
    )
    .await
    .unwrap();
    assert!(matches!(
        d.read(0, 8, IoOpts::new()).await,
        Err(Error::Timeout { op: "read", .. })
    ));
    // Writes are not delayed and still work on the same connection.
    d.write(0, Bytes::from(vec![3u8; 512]), IoOpts::new())
        .await
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------------------
// Hostile clients: raw bytes.

async fn handshake<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(s: &mut S) {
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).await.unwrap();
    assert_eq!(&hello[..8], b"NBDMAGIC");
    s.write_all(&3u32.to_be_bytes()).await.unwrap();
}

/// Negotiates export "vol" with NBD_OPT_EXPORT_NAME; returns the size.
async fn open_raw(addr: &str) -> TcpStream {
    open_raw_export(addr, "vol").await.0
}

/// Negotiates `name` with NBD_OPT_EXPORT_NAME; returns the stream and the export's
/// transmission flags.
async fn open_raw_export(addr: &str, name: &str) -> (TcpStream, u16) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let flags = export_name(&mut s, name).await;
    (s, flags)
}

/// The greeting, then `name` with NBD_OPT_EXPORT_NAME, over any stream; returns the
/// export's transmission flags.
async fn export_name<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    s: &mut S,
    name: &str,
) -> u16 {
    handshake(s).await;
    let head = proto::OptionHeader {
        option: proto::OPT_EXPORT_NAME,
        length: name.len() as u32,
    };
    s.write_all(&head.encode()).await.unwrap();
    s.write_all(name.as_bytes()).await.unwrap();
    let mut b = [0u8; 10];
    s.read_exact(&mut b).await.unwrap();
    u16::from_be_bytes([b[8], b[9]])
}

async fn request(s: &mut TcpStream, command: u16, offset: u64, length: u32) -> u32 {
    let r = proto::Request {
        flags: 0,
        command: proto::Command::from_code(command),
        handle: 42,
        offset,
        length,
    };
    s.write_all(&r.encode()).await.unwrap();
    let mut h = [0u8; 16];
    s.read_exact(&mut h).await.unwrap();
    let rep = proto::SimpleReply::parse(&h).unwrap();
    assert_eq!(rep.handle, 42);
    rep.error
}

/// Whether the server closed the connection (EOF within a few seconds).
async fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 64];
    loop {
        match tokio::time::timeout(Duration::from_secs(5), s.read(&mut b)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_clients_leave_the_server_serving() {
    let vol: Arc<dyn DynBlockDevice> = Arc::new(striped_mem(2, 2048));
    let known = pattern(7, 64 << 10);
    vol.write(0, Bytes::from(known.clone()), IoOpts::new())
        .await
        .unwrap();
    let config = ServerConfig {
        handshake_timeout: Duration::from_secs(2),
        ..ServerConfig::default()
    };
    let (base, _server) = start(NbdServer::new(config).export("vol", vol.clone())).await;
    let addr = base.trim_start_matches("nbd://").to_owned();

    // Bad client flags: closed.
    let mut s = TcpStream::connect(&addr).await.unwrap();
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).await.unwrap();
    s.write_all(&0xffu32.to_be_bytes()).await.unwrap();
    assert!(closed(&mut s).await, "unknown client flags");

    // Bad option magic: closed.
    let mut s = TcpStream::connect(&addr).await.unwrap();
    handshake(&mut s).await;
    s.write_all(b"NOTMAGIC\0\0\0\x07\0\0\0\0").await.unwrap();
    assert!(closed(&mut s).await, "bad option magic");

    // Truncated handshake: the client stops sending; the server gives up in time.
    let mut s = TcpStream::connect(&addr).await.unwrap();
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).await.unwrap();
    s.write_all(&[0, 0]).await.unwrap();
    assert!(closed(&mut s).await, "truncated handshake");

    // Huge option length: closed, nothing allocated for it.
    let mut s = TcpStream::connect(&addr).await.unwrap();
    handshake(&mut s).await;
    let head = proto::OptionHeader {
        option: proto::OPT_GO,
        length: u32::MAX,
    };
    s.write_all(&head.encode()).await.unwrap();
    assert!(closed(&mut s).await, "huge option");

    // Unknown option: an error reply, and the negotiation goes on.
    let mut s = TcpStream::connect(&addr).await.unwrap();
    handshake(&mut s).await;
    let head = proto::OptionHeader {
        option: 0x7777,
        length: 0,
    };
    s.write_all(&head.encode()).await.unwrap();
    let mut h = [0u8; proto::OptionReply::LEN];
    s.read_exact(&mut h).await.unwrap();
    let rep = proto::OptionReply::parse(&h).unwrap();
    assert_eq!(rep.reply, proto::REP_ERR_UNSUP);
    let mut msg = vec![0u8; rep.length as usize];
    s.read_exact(&mut msg).await.unwrap();
    // LIST still works on the same connection.
    let head = proto::OptionHeader {
        option: proto::OPT_LIST,
        length: 0,
    };
    s.write_all(&head.encode()).await.unwrap();
    s.read_exact(&mut h).await.unwrap();
    let rep = proto::OptionReply::parse(&h).unwrap();
    assert_eq!(rep.reply, proto::REP_SERVER);
    let mut d = vec![0u8; rep.length as usize];
    s.read_exact(&mut d).await.unwrap();
    assert_eq!(&d[4..], b"vol");

    // Transmission: past the end, oversized, unknown command, misaligned.
    let mut s = open_raw(&addr).await;
    let size = 2 * 2048 * 512;
    assert_eq!(request(&mut s, 0, size, 512).await, proto::errno::EINVAL);
    assert_eq!(
        request(&mut s, 0, u64::MAX - 100, 512).await,
        proto::errno::EINVAL
    );
    assert_eq!(request(&mut s, 0, 0, 64 << 20).await, proto::errno::EINVAL);
    assert_eq!(request(&mut s, 99, 0, 512).await, proto::errno::EINVAL);
    // No block sizes were agreed (EXPORT_NAME): a misaligned read is served.
    assert_eq!(request(&mut s, 0, 1, 512).await, 0);
    let mut skip = vec![0u8; 512];
    s.read_exact(&mut skip).await.unwrap();
    // A write larger than the volume: its payload is read off the wire and the request
    // refused (no block sizes agreed: the size alone is no reason).
    let r = proto::Request {
        flags: 0,
        command: proto::Command::Write,
        handle: 42,
        offset: 0,
        length: 33 << 20,
    };
    s.write_all(&r.encode()).await.unwrap();
    s.write_all(&vec![0xEEu8; 33 << 20]).await.unwrap();
    let mut h = [0u8; 16];
    s.read_exact(&mut h).await.unwrap();
    assert_eq!(
        proto::SimpleReply::parse(&h).unwrap().error,
        proto::errno::ENOSPC
    );
    // A write past the end: ENOSPC, and its payload consumed.
    let r = proto::Request {
        offset: size,
        length: 512,
        ..r
    };
    s.write_all(&r.encode()).await.unwrap();
    s.write_all(&[0xEE; 512]).await.unwrap();
    s.read_exact(&mut h).await.unwrap();
    assert_eq!(
        proto::SimpleReply::parse(&h).unwrap().error,
        proto::errno::ENOSPC
    );
    // Still in step: a good read works.
    assert_eq!(request(&mut s, 0, 0, 512).await, 0);
    let mut d = vec![0u8; 512];
    s.read_exact(&mut d).await.unwrap();
    assert_eq!(d, known[..512]);
    // Garbage instead of a request: that connection closes.
    s.write_all(&[0xAB; 28]).await.unwrap();
    assert!(closed(&mut s).await, "garbage request");

    // Disconnect in the middle of a write's payload: nothing of it lands.
    let mut s = open_raw(&addr).await;
    let r = proto::Request {
        flags: 0,
        command: proto::Command::Write,
        handle: 1,
        offset: 0,
        length: 4096,
    };
    s.write_all(&r.encode()).await.unwrap();
    s.write_all(&[0xCC; 1000]).await.unwrap();
    drop(s);

    // 64 connections at once, each writing and reading its own sector.
    let mut tasks = Vec::new();
    for i in 0..64u64 {
        let url = format!("{base}/vol");
        tasks.push(tokio::spawn(async move {
            let c = NbdDevice::connect(&url).await.unwrap();
            let d = pattern(1000 + i, 512);
            c.write(1024 + i, Bytes::from(d.clone()), IoOpts::new())
                .await
                .unwrap();
            assert_eq!(c.read(1024 + i, 1, IoOpts::new()).await.unwrap(), d);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }

    // Afterwards a normal client reads correct data.
    let c = NbdDevice::connect(&format!("{base}/vol")).await.unwrap();
    assert_eq!(c.read(0, 128, IoOpts::new()).await.unwrap(), known);
    for i in 0..64u64 {
        assert_eq!(
            c.read(1024 + i, 1, IoOpts::new()).await.unwrap(),
            pattern(1000 + i, 512)
        );
    }
}

/// Sends one request with `flags` (and `payload` for a write); returns the reply's error.
async fn request_with(s: &mut TcpStream, r: proto::Request, payload: &[u8]) -> u32 {
    s.write_all(&r.encode()).await.unwrap();
    s.write_all(payload).await.unwrap();
    let mut h = [0u8; 16];
    s.read_exact(&mut h).await.unwrap();
    let rep = proto::SimpleReply::parse(&h).unwrap();
    assert_eq!(rep.handle, r.handle);
    rep.error
}

/// Command flags are checked: unknown ones and ones on the wrong command get EINVAL (a
/// write's payload still read off the wire), FUA goes on any command; a read-only export
/// accepts FLUSH (it advertises it) and refuses writes with EPERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn command_flags_are_checked_and_read_only_exports_accept_flush() {
    let vol: Arc<dyn DynBlockDevice> = Arc::new(striped_mem(2, 2048));
    let (base, _server) = start(
        NbdServer::new(ServerConfig::default())
            .export("vol", vol.clone())
            .export_with("ro", vol.clone(), "read-only", true),
    )
    .await;
    let addr = base.trim_start_matches("nbd://").to_owned();
    let mut s = open_raw(&addr).await;
    let req = |command, flags, length| proto::Request {
        flags,
        command,
        handle: 7,
        offset: 0,
        length,
    };
    let data = vec![0x5Au8; 512];
    use proto::Command::{Flush, Read, Write, WriteZeroes};
    // Unknown flag bits (DF and beyond are not offered here).
    assert_eq!(
        request_with(&mut s, req(Read, 1 << 2, 512), &[]).await,
        proto::errno::EINVAL
    );
    assert_eq!(
        request_with(&mut s, req(Read, 1 << 9, 512), &[]).await,
        proto::errno::EINVAL
    );
    assert_eq!(
        request_with(&mut s, req(Write, 1 << 7, 512), &data).await,
        proto::errno::EINVAL
    );
    // Zeroing flags on other commands.
    let no_hole = proto::CMD_FLAG_NO_HOLE;
    assert_eq!(
        request_with(&mut s, req(Write, no_hole, 512), &data).await,
        proto::errno::EINVAL
    );
    let fast = proto::CMD_FLAG_FAST_ZERO;
    assert_eq!(
        request_with(&mut s, req(Read, fast, 512), &[]).await,
        proto::errno::EINVAL
    );
    // Nothing of the refused write landed; FUA is fine everywhere; NO_HOLE on zeroing too.
    let mut b = vec![0u8; 512];
    vol.read_into(0, &mut b, IoOpts::new()).await.unwrap();
    assert_eq!(b, vec![0u8; 512]);
    let fua = proto::CMD_FLAG_FUA;
    assert_eq!(request_with(&mut s, req(Write, fua, 512), &data).await, 0);
    assert_eq!(request_with(&mut s, req(Flush, fua, 0), &[]).await, 0);
    assert_eq!(
        request_with(&mut s, req(WriteZeroes, no_hole, 512), &[]).await,
        0
    );
    // The connection still serves: a plain read.
    assert_eq!(request(&mut s, 0, 0, 512).await, 0);

    // Read-only: FLUSH is advertised and succeeds; a write is EPERM.
    let (mut ro, flags) = open_raw_export(&addr, "ro").await;
    assert_ne!(flags & proto::TF_READ_ONLY, 0);
    assert_ne!(flags & proto::TF_SEND_FLUSH, 0);
    assert_eq!(request_with(&mut ro, req(Flush, 0, 0), &[]).await, 0);
    assert_eq!(
        request_with(&mut ro, req(Write, 0, 512), &data).await,
        proto::errno::EPERM
    );
}

/// A fault campaign through real NBD peers: volumes (stripes, concat, mirror) over nbdkit
/// memory exports whose error filter fails 10% of requests with EIO. Every operation
/// matches the model or fails; afterwards every acknowledged write reads back (reads are
/// retried: the filter fails them at random too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_campaign_through_nbdkit_error_filter() {
    if !have("nbdkit") {
        return;
    }
    let dir = scratch("campaign");
    for (kind, interleave, flavor, mirror) in [
        ("stripes", 16u64, tagstripe::striping::Flavor::NetBsd, false),
        ("concat", 0, tagstripe::striping::Flavor::NetBsd, false),
        ("mirror", 16, tagstripe::striping::Flavor::FreeBsd, true),
    ] {
        let peers: Vec<Peer> = (0..if mirror { 2 } else { 3 })
            .map(|_| {
                nbdkit(&[
                    "--filter=error",
                    "memory",
                    "2M",
                    "error=EIO",
                    "error-rate=10%",
                ])
            })
            .collect();
        let mut comps: Vec<Arc<dyn DynBlockDevice>> = Vec::new();
        for p in &peers {
            comps.push(Arc::new(
                NbdDevice::connect(&format!("nbd://127.0.0.1:{}", p.port))
                    .await
                    .unwrap(),
            ));
        }
        let vol = Volume::builder(comps)
            .interleave(interleave)
            .flavor(flavor)
            .mirror(mirror)
            .quirks(QuirkSet::empty())
            .build()
            .unwrap();
        let total = vol.info().sectors;
        let mut data = vec![0u8; total as usize * 512];
        let mut unknown = vec![false; total as usize];
        let (mut x, mut failures) = (0x2545_F491_4F6C_DD1Du64, 0);
        for i in 0..400u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let s = x % total;
            let n = (x >> 40) % 64 + 1;
            let n = n.min(total - s);
            let r = s as usize..(s + n) as usize;
            if i % 2 == 0 {
                let d = pattern(i, n as usize * 512);
                match vol.write(s, Bytes::from(d.clone()), IoOpts::new()).await {
                    Ok(()) => {
                        data[r.start * 512..r.end * 512].copy_from_slice(&d);
                        unknown[r].fill(false);
                    }
                    Err(e) => {
                        // The error names the component and says what the server sent.
                        assert!(e.to_string().contains("EIO"), "{kind}: {e}");
                        failures += 1;
                        unknown[r].fill(true);
                    }
                }
            } else if let Ok(got) = vol.read(s, n, IoOpts::new()).await {
                for sec in s..s + n {
                    if !unknown[sec as usize] {
                        let (a, b) = (((sec - s) * 512) as usize, (sec * 512) as usize);
                        assert!(got[a..a + 512] == data[b..b + 512], "{kind}: sector {sec}");
                    }
                }
            }
        }
        assert!(failures > 0, "{kind}: the error filter never fired");
        for s in (0..total).step_by(64) {
            let n = 64.min(total - s);
            let mut got = None;
            for _ in 0..50 {
                if let Ok(g) = vol.read(s, n, IoOpts::new()).await {
                    got = Some(g);
                    break;
                }
            }
            let got = got.unwrap_or_else(|| panic!("{kind}: sectors {s}+{n} never read"));
            for sec in s..s + n {
                if !unknown[sec as usize] {
                    let (a, b) = (((sec - s) * 512) as usize, (sec * 512) as usize);
                    assert!(
                        got[a..a + 512] == data[b..b + 512],
                        "{kind}: sector {sec} lost"
                    );
                }
            }
        }
        if mirror {
            // EIO on writes drops sides; the mirror keeps serving from what is left.
            assert!(vol.degraded().len() <= 1, "{kind}: {:?}", vol.degraded());
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The client reconnects after its server went away and came back on the same port with the
/// same export; a mirror over such a component would have dropped it, a plain component
/// carries on. Requests while the server is down fail typed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_reconnects_when_the_server_comes_back() {
    if !have("qemu-nbd") {
        return;
    }
    let dir = scratch("reconnect");
    let img = dir.join("disk.img");
    std::fs::write(&img, vec![0u8; 1 << 20]).unwrap();
    let peer = qemu_nbd(&img, "disk");
    let port = peer.port;
    let d = NbdDevice::connect(&format!("nbd://127.0.0.1:{port}/disk"))
        .await
        .unwrap();
    d.write(8, Bytes::from(pattern(3, 4096)), IoOpts::new())
        .await
        .unwrap();
    d.flush(IoOpts::new()).await.unwrap();
    peer.stop();
    // Down: the request fails with a typed error (the lost connection, or no server).
    match d.read(8, 8, IoOpts::new()).await {
        Err(Error::Closed { .. } | Error::Connect { .. } | Error::Io { .. }) => {}
        other => panic!("expected a typed failure with the server down, got {other:?}"),
    }
    // Back on the same port: the next request connects again and sees the data.
    let back = qemu_nbd_on(&img, "disk", port);
    assert_eq!(d.read(8, 8, IoOpts::new()).await.unwrap(), pattern(3, 4096));
    d.write(16, Bytes::from(pattern(4, 4096)), IoOpts::new())
        .await
        .unwrap();
    d.flush(IoOpts::new()).await.unwrap();
    assert_eq!(
        std::fs::read(&img).unwrap()[16 * 512..24 * 512],
        pattern(4, 4096)[..]
    );
    // With reconnecting off, a lost connection stays lost.
    let d2 = NbdDevice::connect_with(
        &format!("nbd://127.0.0.1:{port}/disk"),
        ClientConfig {
            reconnect: false,
            ..ClientConfig::default()
        },
    )
    .await
    .unwrap();
    back.stop();
    let _again = qemu_nbd_on(&img, "disk", port);
    for _ in 0..2 {
        assert!(
            d2.read(0, 8, IoOpts::new()).await.is_err(),
            "a lost connection came back with reconnecting off"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Settings that would stall a connection for good (no request in flight, a byte budget
/// smaller than one request) are raised to workable ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn degenerate_server_settings_still_serve() {
    let dev: Arc<dyn DynBlockDevice> = Arc::new(MemDevice::new("m", 4096));
    let config = ServerConfig {
        max_in_flight: 0,
        max_buffered: 0,
        max_request: 0,
        max_connections: 0,
        ..ServerConfig::default()
    };
    let (base, server) = start(NbdServer::new(config).export("m", dev)).await;
    assert_eq!(server.config().max_request, 4096);
    let c = NbdDevice::connect(&format!("{base}/m")).await.unwrap();
    assert_eq!(c.info().limits.max_hw_sectors, 8);
    // 64 KiB: split by the client into 4 KiB requests the server takes one at a time.
    c.write(0, Bytes::from(pattern(9, 64 << 10)), IoOpts::new())
        .await
        .unwrap();
    assert_eq!(
        c.read(0, 128, IoOpts::new()).await.unwrap(),
        pattern(9, 64 << 10)
    );
}

/// Records the order in which writes finish and flushes happen at the device.
#[derive(Debug)]
struct Logged {
    inner: tagstripe::FaultDevice<MemDevice>,
    log: std::sync::Mutex<Vec<&'static str>>,
}

impl BlockDevice for Logged {
    fn info(&self) -> &tagstripe::DeviceInfo {
        self.inner.info()
    }
    async fn read(&self, start: u64, sectors: u64, opts: IoOpts) -> tagstripe::Result<Bytes> {
        self.inner.read(start, sectors, opts).await
    }
    async fn write(&self, start: u64, data: Bytes, opts: IoOpts) -> tagstripe::Result<()> {
        let r = self.inner.write(start, data, opts).await;
        self.log.lock().unwrap().push("write");
        r
    }
    async fn flush(&self, opts: IoOpts) -> tagstripe::Result<()> {
        self.log.lock().unwrap().push("flush");
        self.inner.flush(opts).await
    }
    async fn discard(&self, start: u64, sectors: u64, opts: IoOpts) -> tagstripe::Result<()> {
        self.inner.discard(start, sectors, opts).await
    }
}

/// A clean shutdown with writes in flight: each write is answered (OK) and lands before the
/// final flush, nothing after it; `serve` returns; new connections are not taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_answers_writes_in_flight_then_flushes() {
    let inner = tagstripe::FaultDevice::new(MemDevice::new("slow", 4096));
    inner.set_latency(Duration::from_millis(300));
    let dev = Arc::new(Logged {
        inner,
        log: std::sync::Mutex::new(Vec::new()),
    });
    let server = Arc::new(NbdServer::new(ServerConfig::default()).export("s", dev.clone()));
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let serving = tokio::spawn(Arc::clone(&server).serve(l));
    let c = Arc::new(
        NbdDevice::connect(&format!("nbd://{addr}/s"))
            .await
            .unwrap(),
    );
    let writes: Vec<_> = (0..8u64)
        .map(|i| {
            let c = Arc::clone(&c);
            tokio::spawn(async move {
                c.write(i * 8, Bytes::from(pattern(i, 4096)), IoOpts::new())
                    .await
            })
        })
        .collect();
    // Let the writes reach the server, then shut it down while they are at the device.
    while server
        .counters()
        .requests
        .load(std::sync::atomic::Ordering::Relaxed)
        < 8
    {
        tokio::task::yield_now().await;
    }
    assert!(dev.log.lock().unwrap().is_empty(), "still in flight");
    server.shutdown();
    for w in writes {
        w.await
            .unwrap()
            .expect("a write in flight at shutdown is answered");
    }
    serving
        .await
        .unwrap()
        .expect("serve returns after the final flush");
    let log = dev.log.lock().unwrap().clone();
    assert_eq!(log.len(), 9, "{log:?}");
    assert_eq!(
        log.last(),
        Some(&"flush"),
        "nothing after the final flush: {log:?}"
    );
    for i in 0..8u64 {
        assert_eq!(
            dev.read(i * 8, 8, IoOpts::new()).await.unwrap(),
            pattern(i, 4096)
        );
    }
    // The listener is gone: a new client cannot connect.
    assert!(
        NbdDevice::connect(&format!("nbd://{addr}/s"))
            .await
            .is_err()
    );
}

/// WRITE_ZEROES through the server is real zeroing: with FAST_ZERO on a device that zeroes
/// natively it succeeds; on one that would only write zeroes the server answers ENOTSUP and
/// writes nothing; the server advertises FAST_ZERO.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_zeroes_and_fast_zero_through_the_server() {
    use tagstripe::scheduler::Profile;
    use tagstripe::{SimDevice, Zeroes};
    let vol: Arc<dyn DynBlockDevice> = Arc::new(striped_mem(2, 2048));
    let sim: Arc<dyn DynBlockDevice> =
        Arc::new(SimDevice::with_profile("sim", Profile::Ssd, 4096).unwrap());
    let (base, _server) = start(
        NbdServer::new(ServerConfig::default())
            .export("vol", vol.clone())
            .export("sim", sim.clone()),
    )
    .await;
    let addr = base.trim_start_matches("nbd://").to_owned();
    let (_s, flags) = open_raw_export(&addr, "vol").await;
    assert_ne!(flags & proto::TF_SEND_FAST_ZERO, 0);

    let c = NbdDevice::connect(&format!("{base}/vol")).await.unwrap();
    c.write(0, Bytes::from(pattern(5, 65536)), IoOpts::new())
        .await
        .unwrap();
    c.write_zeroes(16, 32, Zeroes::new().fast_only(true), IoOpts::new())
        .await
        .unwrap();
    c.write_zeroes(64, 16, Zeroes::new().unmap(true), IoOpts::new())
        .await
        .unwrap();
    let mut model = pattern(5, 65536);
    model[16 * 512..48 * 512].fill(0);
    model[64 * 512..80 * 512].fill(0);
    assert_eq!(vol.read(0, 128, IoOpts::new()).await.unwrap(), model);

    let s = NbdDevice::connect(&format!("{base}/sim")).await.unwrap();
    s.write(0, Bytes::from(pattern(6, 8192)), IoOpts::new())
        .await
        .unwrap();
    let fast = s
        .write_zeroes(0, 16, Zeroes::new().fast_only(true), IoOpts::new())
        .await;
    assert!(
        matches!(fast, Err(Error::Nbd { errno, .. }) if errno == proto::errno::ENOTSUP),
        "{fast:?}"
    );
    assert_eq!(
        sim.read(0, 16, IoOpts::new()).await.unwrap(),
        pattern(6, 8192)
    );
    s.write_zeroes(0, 16, Zeroes::new(), IoOpts::new())
        .await
        .unwrap();
    assert_eq!(
        sim.read(0, 16, IoOpts::new()).await.unwrap(),
        vec![0u8; 8192]
    );
}

/// Flush and FUA are advertised only when every component honours them: an export whose
/// server offers no flush makes a volume over it (and the export of that volume) offer none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flush_is_offered_only_when_every_component_honours_it() {
    let mut info = tagstripe::DeviceInfo::new("volatile", 2048);
    info.caps.flush = false;
    let volatile: Arc<dyn DynBlockDevice> = Arc::new(MemDevice::with_info(info));
    let (inner, _a) = start(NbdServer::new(ServerConfig::default()).export("v", volatile)).await;
    let addr = inner.trim_start_matches("nbd://").to_owned();
    let (_s, flags) = open_raw_export(&addr, "v").await;
    assert_eq!(flags & (proto::TF_SEND_FLUSH | proto::TF_SEND_FUA), 0);

    let remote = NbdDevice::connect(&format!("{inner}/v")).await.unwrap();
    assert!(!remote.caps().flush);
    let vol = Volume::builder(vec![
        Arc::new(remote) as Arc<dyn DynBlockDevice>,
        Arc::new(MemDevice::new("local", 2048)),
    ])
    .interleave(64)
    .quirks(QuirkSet::empty())
    .build()
    .unwrap();
    assert!(
        !vol.caps().flush,
        "one component without flush: the volume has none"
    );
    let (outer, _b) =
        start(NbdServer::new(ServerConfig::default()).export("vol", Arc::new(vol))).await;
    let (_s, flags) = open_raw_export(outer.trim_start_matches("nbd://"), "vol").await;
    assert_eq!(
        flags & (proto::TF_SEND_FLUSH | proto::TF_SEND_FUA),
        0,
        "{flags:#x}"
    );
    assert_ne!(flags & proto::TF_SEND_WRITE_ZEROES, 0);

    // With every component durable, both are offered.
    let (ok, _c) =
        start(NbdServer::new(ServerConfig::default()).export("m", Arc::new(striped_mem(2, 1024))))
            .await;
    let (_s, flags) = open_raw_export(ok.trim_start_matches("nbd://"), "m").await;
    assert_ne!(flags & proto::TF_SEND_FLUSH, 0);
    assert_ne!(flags & proto::TF_SEND_FUA, 0);
}

/// Sends OPT_GO for `name`, asking for block sizes or not; returns the stream in
/// transmission.
async fn go_raw(addr: &str, name: &str, block_sizes: bool) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    handshake(&mut s).await;
    let req = proto::InfoRequest {
        name: name.to_owned(),
        requests: if block_sizes {
            vec![proto::INFO_BLOCK_SIZE]
        } else {
            vec![]
        },
    };
    let data = req.encode();
    let head = proto::OptionHeader {
        option: proto::OPT_GO,
        length: data.len() as u32,
    };
    s.write_all(&head.encode()).await.unwrap();
    s.write_all(&data).await.unwrap();
    // Option replies until the ACK.
    loop {
        let mut h = [0u8; 20];
        s.read_exact(&mut h).await.unwrap();
        let kind = u32::from_be_bytes([h[12], h[13], h[14], h[15]]);
        let len = u32::from_be_bytes([h[16], h[17], h[18], h[19]]) as usize;
        let mut d = vec![0u8; len];
        s.read_exact(&mut d).await.unwrap();
        if kind == proto::REP_ACK {
            return s;
        }
        assert_eq!(kind, proto::REP_INFO, "unexpected reply {kind:#x}");
    }
}

/// Without agreed block sizes the server serves any alignment (read-modify-write for writes
/// and zeroing, the surrounding bytes untouched); with them (GO asking for INFO_BLOCK_SIZE)
/// a misaligned request is EINVAL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unaligned_requests_without_agreed_block_sizes() {
    let vol: Arc<dyn DynBlockDevice> = Arc::new(striped_mem(2, 2048));
    let known = pattern(9, 8192);
    vol.write(0, Bytes::from(known.clone()), IoOpts::new())
        .await
        .unwrap();
    let (base, _server) =
        start(NbdServer::new(ServerConfig::default()).export("vol", vol.clone())).await;
    let addr = base.trim_start_matches("nbd://").to_owned();
    let req = |command, offset, length| proto::Request {
        flags: 0,
        command,
        handle: 3,
        offset,
        length,
    };
    let mut model = known.clone();
    for block_sizes_asked in [false, true] {
        let mut s = go_raw(&addr, "vol", block_sizes_asked).await;
        let w = request_with(&mut s, req(proto::Command::Write, 1001, 3), b"abc").await;
        let z = request_with(&mut s, req(proto::Command::WriteZeroes, 3000, 700), &[]).await;
        let r = request_with(&mut s, req(proto::Command::Read, 999, 7), &[]).await;
        if block_sizes_asked {
            assert_eq!(
                (w, z, r),
                (
                    proto::errno::EINVAL,
                    proto::errno::EINVAL,
                    proto::errno::EINVAL
                )
            );
            continue;
        }
        assert_eq!((w, z, r), (0, 0, 0));
        let mut got = [0u8; 7];
        s.read_exact(&mut got).await.unwrap();
        model[1001..1004].copy_from_slice(b"abc");
        model[3000..3700].fill(0);
        assert_eq!(&got[..], &model[999..1006]);
    }
    // The device holds exactly the model: nothing around the bytes changed.
    assert_eq!(vol.read(0, 16, IoOpts::new()).await.unwrap(), model);
}

/// The allocation query over NBD: block status on `base:allocation`, against qemu-nbd on a
/// sparse file and against tagstripe's own server, and through a volume striped over both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocation_over_nbd_is_block_status() {
    use tagstripe::Extent;
    if !have("qemu-nbd") {
        return;
    }
    let dir = scratch("alloc");
    let file = dir.join("sparse.img");
    std::fs::File::create(&file)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    // 1 MiB of data at 4 MiB; the rest a hole.
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
        f.write_all_at(&vec![0x42u8; 1 << 20], 4 << 20).unwrap();
        f.sync_all().unwrap();
    }
    let peer = qemu_nbd(&file, "s");
    let q = NbdDevice::connect(&format!("nbd://127.0.0.1:{}/s", peer.port))
        .await
        .unwrap();
    let ext = q.allocation(0, 16384).await.unwrap();
    assert_eq!(ext.iter().map(|e| e.sectors).sum::<u64>(), 16384, "{ext:?}");
    let data: u64 = ext.iter().filter(|e| !e.zero).map(|e| e.sectors).sum();
    assert_eq!(data, 2048, "qemu-nbd: {ext:?}");
    assert!(ext.iter().any(|e| e.hole && e.zero), "{ext:?}");
    // A sub-range: starts mid-hole, ends mid-data.
    let part = q.allocation(6144, 4096).await.unwrap();
    assert_eq!(part, [Extent::hole(2048), Extent::data(2048)], "{part:?}");

    // tagstripe's server over memory: zero blocks are holes.
    let mem: Arc<dyn DynBlockDevice> = Arc::new(MemDevice::new("m", 16384));
    mem.write(0, Bytes::from(vec![1u8; 4096]), IoOpts::new())
        .await
        .unwrap();
    let (base, _s) = start(NbdServer::new(ServerConfig::default()).export("m", mem)).await;
    let t = NbdDevice::connect(&format!("{base}/m")).await.unwrap();
    assert_eq!(
        t.allocation(0, 16384).await.unwrap(),
        [Extent::data(8), Extent::hole(16376)]
    );

    // A volume over both (concatenated): the map joins their answers.
    let vol = Volume::builder([Arc::new(q) as Arc<dyn DynBlockDevice>, Arc::new(t)])
        .interleave(0)
        .quirks(QuirkSet::empty())
        .build()
        .unwrap();
    let ext = vol.allocation(0, vol.info().sectors).await.unwrap();
    assert_eq!(
        ext.iter().map(|e| e.sectors).sum::<u64>(),
        vol.info().sectors
    );
    let data: u64 = ext.iter().filter(|e| !e.zero).map(|e| e.sectors).sum();
    assert_eq!(data, 2048 + 8, "{ext:?}");
    drop(peer);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every slot held by clients that connect and say nothing (or stop half-way through the
/// negotiation): the next real client is still served, at once, because the connection
/// that has negotiated least gives way to it; clients in transmission are never closed
/// for a newcomer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_give_way_to_a_client_that_speaks() {
    let vol: Arc<dyn DynBlockDevice> = Arc::new(MemDevice::new("m", 2048));
    let config = ServerConfig {
        max_connections: 8,
        ..ServerConfig::default()
    };
    let (base, server) = start(NbdServer::new(config).export("vol", vol)).await;
    let addr = base.trim_start_matches("nbd://").to_owned();
    // A client in transmission first: it must survive the flood.
    let old = NbdDevice::connect(&format!("{base}/vol")).await.unwrap();
    old.write(0, Bytes::from(vec![5u8; 512]), IoOpts::new())
        .await
        .unwrap();
    // 200 silent connections and 20 that stop after the greeting's reply.
    let mut flood = Vec::new();
    for _ in 0..200 {
        flood.push(TcpStream::connect(&addr).await.unwrap());
    }
    for _ in 0..20 {
        let mut s = TcpStream::connect(&addr).await.unwrap();
        let mut hello = [0u8; 18];
        // Read the greeting only if this one got a slot before the rest of the flood.
        if tokio::time::timeout(Duration::from_millis(50), s.read_exact(&mut hello))
            .await
            .is_ok()
        {
            s.write_all(&proto::FLAG_C_FIXED_NEWSTYLE.to_be_bytes())
                .await
                .unwrap();
        }
        flood.push(s);
    }
    let started = std::time::Instant::now();
    let c = tokio::time::timeout(
        Duration::from_secs(1),
        NbdDevice::connect(&format!("{base}/vol")),
    )
    .await
    .expect("a client that speaks was not served within a second of a flood")
    .unwrap();
    assert_eq!(
        c.read(0, 1, IoOpts::new()).await.unwrap(),
        vec![5u8; 512],
        "served after {:?}",
        started.elapsed()
    );
    assert!(
        server
            .counters()
            .evicted
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 200,
        "the flood was not evicted"
    );
    // The client in transmission before the flood is still served.
    assert_eq!(old.read(0, 1, IoOpts::new()).await.unwrap(), vec![5u8; 512]);
    drop(flood);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_from_this_host_get_the_local_congestion_control() {
    // reno is in every kernel with TCP and allowed to everyone; a name the kernel does not
    // have is refused, and the connection is served all the same.
    for (cc, counted) in [(Some("reno"), 1), (None, 0), (Some("no-such-algorithm"), 0)] {
        let vol: Arc<dyn DynBlockDevice> = Arc::new(MemDevice::new("m", 2048));
        let config = ServerConfig {
            local_congestion: cc.map(str::to_owned),
            ..ServerConfig::default()
        };
        let (base, server) = start(NbdServer::new(config).export("vol", vol)).await;
        let c = NbdDevice::connect(&format!("{base}/vol")).await.unwrap();
        let want = pattern(3, 64 << 10);
        c.write(8, Bytes::from(want.clone()), IoOpts::new())
            .await
            .unwrap();
        assert_eq!(c.read(8, 128, IoOpts::new()).await.unwrap(), want, "{cc:?}");
        assert_eq!(
            server
                .counters()
                .local_congestion_set
                .load(std::sync::atomic::Ordering::Relaxed),
            counted,
            "{cc:?}"
        );
    }
}
