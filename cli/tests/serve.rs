//! `tagstripe serve` driven by the real qemu tools: qemu-io (patterns, aio at depth, flush,
//! discard, write-zeroes), qemu-img convert and compare; the bytes checked on the component
//! files where the striping map says; a volume striped over three qemu-nbd exports. Skips
//! with a printed reason when qemu-utils is missing (CI installs it).

use std::path::PathBuf;
use std::process::Command;

use tagstripe_striping::Geometry;

#[path = "../../lib/tests/common/peers.rs"]
mod peers;
use peers::{Peer, have, qemu_nbd, scratch};
#[path = "common/serve.rs"]
mod serve;
use serve::{
    Serve, blank, have_python_libnbd, make_files, python_libnbd, qemu_io, run, through_map,
};

#[test]
fn qemu_io_and_qemu_img_against_serve() {
    if !have("qemu-io") || !have("qemu-img") {
        return;
    }
    let dir = scratch("qemu");
    let sizes = [4u64, 6, 5];
    let files = make_files(&dir, &sizes);
    let names: Vec<&str> = files.iter().map(|p| p.to_str().unwrap()).collect();
    let mut args = vec!["--interleave", "16"];
    args.extend(&names);
    let serve = Serve::start(&args);
    assert!(serve.out[2].contains("interleave 16"), "{:?}", serve.out);
    let g = Geometry::builder(sizes.map(|m| m * 2048), 16)
        .build()
        .unwrap();
    let total = g.total_sectors();

    // Patterns at unaligned-to-stripe offsets, verified by reading back.
    let text = qemu_io(
        &serve.url,
        &[
            "write -P 0xab 0 1M".into(),
            "write -P 0x5c 3000k 700k".into(),
            "read -P 0xab 0 1M".into(),
            "read -P 0x5c 3000k 700k".into(),
        ],
    );
    assert!(text.contains("read 716800/716800"), "{text}");
    // aio at depth: 32 writes in flight, then a flush, then reads.
    let mut cmds = Vec::new();
    for i in 0..32u64 {
        cmds.push(format!("aio_write -P {} {}k 64k", 0x10 + i, 4096 + i * 64));
    }
    cmds.push("aio_flush".into());
    for i in 0..32u64 {
        cmds.push(format!("aio_read -P {} {}k 64k", 0x10 + i, 4096 + i * 64));
    }
    cmds.push("aio_flush".into());
    cmds.push("flush".into());
    qemu_io(&serve.url, &cmds);
    // Discard and write-zeroes read back as zeroes.
    qemu_io(
        &serve.url,
        &[
            "discard 64k 64k".into(),
            "read -P 0 64k 64k".into(),
            "write -z 256k 128k".into(),
            "read -P 0 256k 128k".into(),
            "read -P 0xab 0 64k".into(),
            "read -P 0xab 384k 640k".into(),
        ],
    );

    // The bytes are on the component files where the map says.
    assert_eq!(through_map(&g, &files, 0, 128), vec![0xab; 64 << 10]);
    assert_eq!(through_map(&g, &files, 128, 128), vec![0; 64 << 10]);
    assert_eq!(through_map(&g, &files, 768, 1280), vec![0xab; 640 << 10]);
    assert_eq!(through_map(&g, &files, 6000, 1400), vec![0x5c; 700 << 10]);
    for i in 0..32u64 {
        let got = through_map(&g, &files, (4096 + i * 64) * 2, 128);
        assert!(
            got.iter().all(|&b| u64::from(b) == 0x10 + i),
            "aio write {i}"
        );
    }

    // qemu-img convert of the whole volume equals the volume read through the map, and
    // qemu-img compare agrees.
    let out = dir.join("copy.img");
    let st = Command::new("qemu-img")
        .args(["convert", "-f", "raw", "-O", "raw", &serve.url])
        .arg(&out)
        .status()
        .unwrap();
    assert!(st.success());
    let copy = std::fs::read(&out).unwrap();
    assert_eq!(copy.len() as u64, total * 512);
    assert!(
        copy == through_map(&g, &files, 0, total),
        "convert differs from the map"
    );
    let st = Command::new("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw", &serve.url])
        .arg(&out)
        .status()
        .unwrap();
    assert!(st.success(), "qemu-img compare");

    // SIGTERM: a clean stop with a flush.
    let (ok, err) = serve.stop();
    assert!(ok, "exit status; stderr: {err}");
    assert!(err.contains("flushed"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn volume_striped_over_three_qemu_nbd_exports() {
    if !have("qemu-io") || !have("qemu-nbd") {
        return;
    }
    let dir = scratch("remote");
    let sizes = [3u64, 4, 5];
    let files = make_files(&dir, &sizes);
    let peers: Vec<Peer> = files
        .iter()
        .enumerate()
        .map(|(i, f)| qemu_nbd(f, &format!("c{i}")))
        .collect();
    let urls: Vec<String> = peers
        .iter()
        .enumerate()
        .map(|(i, p)| format!("nbd://127.0.0.1:{}/c{i}", p.port))
        .collect();
    let mut args = vec!["--interleave", "32", "--class", "bulk"];
    args.extend(urls.iter().map(String::as_str));
    let serve = Serve::start(&args);
    let g = Geometry::builder(sizes.map(|m| m * 2048), 32)
        .build()
        .unwrap();
    let total = g.total_sectors();
    qemu_io(
        &serve.url,
        &[
            "write -P 0x3c 0 2M".into(),
            format!("write -P 0x77 {} 512k", (total - 1024) * 512),
            "aio_write -P 0x41 4M 256k".into(),
            "aio_write -P 0x42 5M 256k".into(),
            "aio_flush".into(),
            "read -P 0x3c 0 2M".into(),
            "read -P 0x42 5M 256k".into(),
            "flush".into(),
        ],
    );
    let (ok, err) = serve.stop();
    assert!(ok, "{err}");
    drop(peers);
    // Verified through the component images behind qemu-nbd.
    assert_eq!(through_map(&g, &files, 0, 4096), vec![0x3c; 2 << 20]);
    assert_eq!(
        through_map(&g, &files, total - 1024, 1024),
        vec![0x77; 512 << 10]
    );
    assert_eq!(through_map(&g, &files, 8192, 512), vec![0x41; 256 << 10]);
    assert_eq!(through_map(&g, &files, 10240, 512), vec![0x42; 256 << 10]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn one_component_read_only_with_o_direct() {
    if !have("qemu-io") {
        return;
    }
    let dir = scratch("ro");
    let files = make_files(&dir, &[4]);
    std::fs::write(&files[0], vec![0x42u8; 4 << 20]).unwrap();
    let serve = Serve::start(&["--read-only", "--direct", files[0].to_str().unwrap()]);
    assert!(serve.out[1].contains("read-only"), "{:?}", serve.out);
    assert!(
        serve.out[2].contains("exported directly"),
        "{:?}",
        serve.out
    );
    // qemu-io opens read-only (`-r`): the export says it is read-only.
    let o = Command::new("qemu-io")
        .args(["-r", "-f", "raw", &serve.url, "-c", "read -P 0x42 0 4M"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && text.contains("read 4194304/4194304"),
        "{text}"
    );
    assert!(!text.contains("Pattern verification failed"), "{text}");
    // Opening it for writing is refused.
    let o = Command::new("qemu-io")
        .args(["-f", "raw", &serve.url, "-c", "write -P 0x11 0 4k"])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        !o.status.success() || text.contains("failed") || text.contains("read-only"),
        "the write was not refused: {text}"
    );
    assert!(std::fs::read(&files[0]).unwrap().iter().all(|&b| b == 0x42));
    let (ok, err) = serve.stop();
    assert!(ok, "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn info_on_an_nbd_export() {
    if !have("qemu-nbd") {
        return;
    }
    let dir = scratch("info");
    let files = make_files(&dir, &[3]);
    let peer = qemu_nbd(&files[0], "disk");
    let o = Command::new(env!("CARGO_BIN_EXE_tagstripe"))
        .args([
            "info",
            &format!("nbd://127.0.0.1:{}/disk", peer.port),
            "--json",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["kind"], "nbd");
    assert_eq!(j["bytes"], 3 << 20);
    assert_eq!(j["logical_block_size"], 512);
    // qemu-nbd's maximum block size (32 MiB) is the hardware limit.
    assert_eq!(j["hardware_limits"]["max_hw_sectors"], 65536);
    drop(peer);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn serve_on_a_unix_socket_and_stripe_over_one() {
    if !have("qemu-io") || !have("qemu-nbd") {
        return;
    }
    let dir = scratch("unix");
    let files = make_files(&dir, &[2, 2]);
    // A component behind qemu-nbd on a Unix socket...
    let sock = dir.join("c1.sock");
    let st = Command::new("qemu-nbd")
        .args(["-f", "raw", "-x", "c1", "--persistent", "--fork", "-k"])
        .arg(&sock)
        .arg("--pid-file")
        .arg(dir.join("c1.pid"))
        .arg(&files[1])
        .status()
        .unwrap();
    assert!(st.success());
    let c1 = format!("nbd+unix:///c1?socket={}", sock.display());
    // ...and the volume served on a Unix socket too.
    let ours = dir.join("vol.sock");
    let serve = Serve::start_on(
        &format!("unix:{}", ours.display()),
        &["--interleave", "16", files[0].to_str().unwrap(), &c1],
    );
    assert_eq!(
        serve.url,
        format!("nbd+unix:///vol?socket={}", ours.display())
    );
    qemu_io(
        &serve.url,
        &[
            "write -P 0x6d 0 1M".into(),
            "read -P 0x6d 0 1M".into(),
            "flush".into(),
        ],
    );
    let g = Geometry::builder([4096, 4096], 16).build().unwrap();
    assert_eq!(through_map(&g, &files, 0, 2048), vec![0x6d; 1 << 20]);
    let (ok, err) = serve.stop();
    assert!(ok, "{err}");
    assert!(
        !ours.exists(),
        "the socket is removed when the server stops"
    );
    if let Ok(pid) = std::fs::read_to_string(dir.join("c1.pid")) {
        let _ = Command::new("kill").arg(pid.trim()).status();
        let _ = Command::new("tail")
            .args(["--pid", pid.trim(), "-f", "/dev/null"])
            .status();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// libnbd starts `tagstripe serve` the two ways the ecosystem starts servers: with
/// `connect_command` (`--listen -`, one connection on stdin/stdout) and with
/// `connect_systemd_socket_activation` (LISTEN_PID / LISTEN_FDS); data written through one
/// is read back through the other and is in the file; nbdinfo's `[ CMD ]` form works too.
#[test]
fn libnbd_starts_serve_by_command_and_by_socket_activation() {
    if !have_python_libnbd() {
        return;
    }
    let dir = scratch("start-modes");
    let img = dir.join("disk.img");
    std::fs::File::create(&img)
        .and_then(|f| f.set_len(16 << 20))
        .unwrap();
    let bin = env!("CARGO_BIN_EXE_tagstripe");
    let script = r#"
import sys, nbd
bin, img = sys.argv[1], sys.argv[2]
h = nbd.NBD()
h.connect_command([bin, "serve", "--listen", "-", img])
assert h.get_size() == 16 << 20, h.get_size()
h.pwrite(b"\xab" * 65536, 1 << 20)
h.flush()
h.shutdown()
h = nbd.NBD()
h.connect_systemd_socket_activation([bin, "serve", img])
assert h.pread(65536, 1 << 20) == b"\xab" * 65536
h.pwrite(b"\xcd" * 4096, 0)
h.flush()
h.shutdown()
print("ok")
"#;
    python_libnbd(script, &[bin, img.to_str().unwrap()]);
    let raw = std::fs::read(&img).unwrap();
    assert!(raw[..4096].iter().all(|&b| b == 0xcd));
    assert!(raw[1 << 20..(1 << 20) + 65536].iter().all(|&b| b == 0xab));
    if have("nbdinfo") {
        let out = Command::new("nbdinfo")
            .args([
                "--json",
                "--",
                "[",
                bin,
                "serve",
                img.to_str().unwrap(),
                "]",
            ])
            .output()
            .unwrap();
        let j = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{j}");
        assert!(j.contains("\"export-size\": 16777216"), "{j}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Who may connect: a peer not on `--allow` is closed before a byte of negotiation (and the
/// server keeps serving those that are); listening beyond loopback with no allow-list and no
/// `--insecure` is refused with a message that says how to proceed.
#[test]
fn allow_list_and_the_refusal_to_listen_openly() {
    use std::io::Read as _;
    let dir = scratch("allow");
    let img = dir.join("disk.img");
    std::fs::File::create(&img)
        .and_then(|f| f.set_len(4 << 20))
        .unwrap();
    let img = img.to_str().unwrap();
    let peer_of = |url: &str| {
        url.trim_start_matches("nbd://")
            .split('/')
            .next()
            .unwrap()
            .to_owned()
    };

    // 127.0.0.1 is not in 192.0.2.0/24: closed at once, nothing sent.
    let s = Serve::start(&["--allow", "192.0.2.0/24", img]);
    let mut c = std::net::TcpStream::connect(peer_of(&s.url)).unwrap();
    c.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let mut b = [0u8; 18];
    assert_eq!(
        c.read(&mut b).unwrap_or(0),
        0,
        "a refused peer sees no greeting"
    );
    drop(s);

    // On the list: the greeting comes.
    let s = Serve::start(&["--allow", "192.0.2.0/24,127.0.0.0/8", img]);
    let mut c = std::net::TcpStream::connect(peer_of(&s.url)).unwrap();
    c.read_exact(&mut b).unwrap();
    assert_eq!(&b[..8], b"NBDMAGIC");
    drop(s);

    // Not loopback, no --allow: refused, exit 2, and the message names the ways out.
    let out = Command::new(env!("CARGO_BIN_EXE_tagstripe"))
        .args(["serve", "--listen", "0.0.0.0:0", img])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--allow") && err.contains("--insecure") && err.contains("--tls require"),
        "{err}"
    );
    // A bad network is a clear error too.
    let out = Command::new(env!("CARGO_BIN_EXE_tagstripe"))
        .args(["serve", "--allow", "10.0.0.0/40", img])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("prefix must be 0 to 32"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `serve --mirror` with the geometry flags: a FreeBSD mirror with no reserved area and
/// primary reads; qemu-io writes through it and both halves hold the bytes where the
/// geometry puts them.
#[test]
fn serve_mirror_with_geometry_flags() {
    if !have("qemu-io") {
        return;
    }
    let dir = scratch("mirror");
    let files: Vec<PathBuf> = (0..2).map(|i| dir.join(format!("m{i}.img"))).collect();
    for f in &files {
        std::fs::File::create(f)
            .and_then(|h| h.set_len(8 << 20))
            .unwrap();
    }
    let paths: Vec<&str> = files.iter().map(|p| p.to_str().unwrap()).collect();
    let mut args = vec![
        "--flavor",
        "freebsd",
        "--mirror",
        "--no-offset",
        "--mirror-reads",
        "primary",
        "--interleave",
        "16",
    ];
    args.extend(&paths);
    let s = Serve::start(&args);
    assert!(s.out.iter().any(|l| l.contains("mirror")), "{:?}", s.out);
    qemu_io(
        &s.url,
        &[
            "write -P 0x5c 1M 256k".to_owned(),
            "read -P 0x5c 1M 256k".to_owned(),
            "flush".to_owned(),
        ],
    );
    let (ok, err) = s.stop();
    assert!(ok, "{err}");
    // No reserved area, one data component: volume sector = component sector, twice.
    for f in &files {
        let raw = std::fs::read(f).unwrap();
        assert!(
            raw[1 << 20..(1 << 20) + (256 << 10)]
                .iter()
                .all(|&b| b == 0x5c)
        );
        assert!(raw[..1 << 20].iter().all(|&b| b == 0));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The mirror that forgot which side was stale, fixed and healed: side 0 an nbdkit export
/// behind the error filter (writes fail while a trigger file exists), side 1 an nbdkit file
/// export whose reads fail while another trigger exists. A new mirror first copies side 1
/// from side 0; write A, arm side 0's trigger, write B (side 0 is dropped, every write
/// succeeds), stop; disarm, serve again on the same components: side 0 is announced stale,
/// everything reads B, a resync of side 0 is announced and completes; then, with side 1's
/// reads failing, everything still reads B, from side 0.
#[test]
fn serve_mirror_remembers_a_stale_side_across_a_restart_and_resyncs_it() {
    if !have("nbdkit") || !have("qemu-io") {
        return;
    }
    let dir = scratch("mirror-restart");
    let trigger0 = dir.join("trigger0");
    let trigger1 = dir.join("trigger1");
    let kit0 = peers::nbdkit(&[
        "--filter=error",
        "memory",
        "16M",
        "error-pwrite-rate=100%",
        &format!("error-pwrite-file={}", trigger0.display()),
    ]);
    let file1 = dir.join("side1.img");
    std::fs::File::create(&file1)
        .and_then(|f| f.set_len(16 << 20))
        .unwrap();
    let kit1 = peers::nbdkit(&[
        "--filter=error",
        "file",
        file1.to_str().unwrap(),
        "error-pread-rate=100%",
        &format!("error-pread-file={}", trigger1.display()),
    ]);
    let side0 = format!("nbd://127.0.0.1:{}/", kit0.port);
    let side1 = format!("nbd://127.0.0.1:{}/", kit1.port);
    let args = [
        "--flavor",
        "freebsd",
        "--mirror",
        "--no-offset",
        "--interleave",
        "16",
        side0.as_str(),
        side1.as_str(),
    ];
    // 16 MiB less the 16 sectors of metadata.
    let size = (16 << 20) - 16 * 512;
    let mut s = Serve::start(&args);
    let first = s.wait_err("resync complete");
    assert!(first.contains("side 1 in sync"), "{first}");
    qemu_io(&s.url, &[format!("write -P 0xaa 0 {size}")]);
    std::fs::write(&trigger0, b"").unwrap();
    qemu_io(
        &s.url,
        &[format!("write -P 0xbb 0 {size}"), "flush".to_owned()],
    );
    let (ok, err) = s.stop();
    assert!(ok, "{err}");
    assert!(err.contains("mirror side 0 dropped"), "{err}");
    std::fs::remove_file(&trigger0).unwrap();
    // Side 0 still holds A.
    qemu_io(&side0, &["read -P 0xaa 0 1M".to_owned()]);

    let mut s = Serve::start(&args);
    // Reads while the resync may still run: B, never A.
    qemu_io(&s.url, &[format!("read -P 0xbb 0 {size}")]);
    let started = s.wait_err("resync of side 0 started");
    assert!(started.contains("16.0 MiB"), "{started}");
    let done = s.wait_err("resync complete");
    assert!(done.contains("side 0 in sync"), "{done}");
    // Side 0 holds B now; with side 1's reads failing everything is still B.
    qemu_io(&side0, &[format!("read -P 0xbb 0 {size}")]);
    std::fs::write(&trigger1, b"").unwrap();
    qemu_io(&s.url, &[format!("read -P 0xbb 0 {size}")]);
    let (ok, err) = s.stop();
    assert!(ok, "{err}");
    assert!(err.contains("mirror side 0 is stale"), "{err}");
    std::fs::remove_file(&trigger1).unwrap();
    // `info` shows side 1's metadata: both sides in sync, the bitmap clean (flushed at stop).
    let out = Command::new(env!("CARGO_BIN_EXE_tagstripe"))
        .args(["info", file1.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("component 1 of 2") && text.contains("sides [in-sync, in-sync]"),
        "{text}"
    );
    drop((kit0, kit1));
    let _ = std::fs::remove_dir_all(&dir);
}

/// SIGKILL in the middle of a resync, then a restart: the resync goes on from where it was
/// recorded (less to copy than the first time), and nothing is lost. Side 1 is slow (nbdkit's
/// delay filter), side 0 a file with data; a client writes during the second resync.
#[test]
fn a_resync_killed_midway_resumes_and_loses_nothing() {
    if !have("nbdkit") || !have("qemu-io") {
        return;
    }
    let dir = scratch("mirror-kill");
    const MIB: usize = 1 << 20;
    let size = 96 * MIB;
    let file0 = dir.join("side0.img");
    let file1 = dir.join("side1.img");
    // Side 0: a pattern that differs in every MiB; side 1: blank.
    let data: Vec<u8> = (0..size).map(|i| ((i / MIB) as u8) ^ (i as u8)).collect();
    std::fs::write(&file0, &data).unwrap();
    std::fs::File::create(&file1)
        .and_then(|f| f.set_len(size as u64))
        .unwrap();
    let kit1 = peers::nbdkit(&[
        "--filter=delay",
        "file",
        file1.to_str().unwrap(),
        "delay-write=25ms",
    ]);
    let side1 = format!("nbd://127.0.0.1:{}/", kit1.port);
    let args = [
        "--flavor",
        "freebsd",
        "--mirror",
        "--no-offset",
        "--interleave",
        "16",
        file0.to_str().unwrap(),
        side1.as_str(),
    ];
    let mut s = Serve::start(&args);
    let first = s.wait_err("resync of side 1 started");
    assert!(first.contains("(the whole side)"), "{first}");
    // Killed once progress is on disk.
    s.wait_err("recorded");
    s.kill();

    let mut s = Serve::start(&args);
    let again = s.wait_err("resync of side 1 started");
    let mib_of = |line: &str| -> f64 {
        let at = line.find(" MiB to copy").unwrap();
        line[..at].rsplit(' ').next().unwrap().parse().unwrap()
    };
    let (whole, rest) = (mib_of(&first), mib_of(&again));
    assert!(
        rest < whole,
        "resumed with {rest} MiB of {whole} MiB to copy"
    );
    // A write while the resync runs reaches both sides.
    qemu_io(&s.url, &["write -P 0x77 90M 1M".to_owned()]);
    s.wait_err("resync complete");
    let (ok, err) = s.stop();
    assert!(ok, "{err}");
    // Both sides hold the same data area: side 0's pattern, and the write.
    let mut want = data.clone();
    want[90 * MIB..91 * MIB].fill(0x77);
    let meta = 16 * 512;
    for f in [&file0, &file1] {
        let got = std::fs::read(f).unwrap();
        let bad = (0..size - meta).find(|&i| got[i] != want[i]);
        assert_eq!(bad, None, "{} differs at byte {bad:?}", f.display());
    }
    drop(kit1);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Makes a mirror with metadata over `sides` (files or NBD URLs), in sync, holding 0x3c in
/// its first MiB and 0x7d in its second, then stopped cleanly; returns the serve arguments.
fn make_clean_mirror(sides: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "--flavor",
        "freebsd",
        "--mirror",
        "--no-offset",
        "--interleave",
        "16",
    ]
    .map(str::to_owned)
    .to_vec();
    args.extend(sides.iter().map(|s| (*s).to_owned()));
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut s = Serve::start(&argv);
    s.wait_err("resync complete");
    qemu_io(
        &s.url,
        &[
            "write -P 0x3c 0 1M".to_owned(),
            "write -P 0x7d 1M 1M".to_owned(),
            "flush".to_owned(),
        ],
    );
    let (ok, err) = s.stop();
    assert!(ok, "{err}");
    args
}

/// `serve --read-only` on `args`: it starts, serves the mirror's bytes, refuses a write
/// (qemu-io fails), and stops cleanly.
fn read_only_session(args: &[String]) {
    let mut argv: Vec<&str> = vec!["--read-only"];
    argv.extend(args.iter().map(String::as_str));
    let s = Serve::start(&argv);
    assert!(s.out[1].contains("read-only"), "{:?}", s.out);
    let read = |cmds: &[&str]| {
        let mut c = Command::new("qemu-io");
        c.args(["-r", "-f", "raw", &s.url]);
        for cmd in cmds {
            c.args(["-c", cmd]);
        }
        let text = run(&mut c);
        assert!(!text.contains("Pattern verification failed"), "{text}");
        assert!(!text.contains("failed:"), "{text}");
    };
    read(&["read -P 0x3c 0 1M", "read -P 0x7d 1M 1M"]);
    let o = Command::new("qemu-io")
        .args(["-f", "raw", &s.url, "-c", "write -P 0x11 0 64k"])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        !o.status.success() || text.contains("failed"),
        "a write to a read-only export went through: {text}"
    );
    read(&["read -P 0x3c 0 64k"]);
    let (ok, err) = s.stop();
    assert!(ok, "{err}");
    assert!(!err.contains("dropped"), "{err}");
}

/// A read-only open writes nothing, to any component, ever: a mirror with metadata over
/// two files is served read-only (reads right, writes refused), and both files are byte for
/// byte what they were, metadata included.
#[test]
fn read_only_mirror_over_files_writes_nothing() {
    if !have("qemu-io") {
        return;
    }
    let dir = scratch("ro-mirror-files");
    let files: Vec<PathBuf> = (0..2)
        .map(|i| blank(&dir, &format!("m{i}.img"), 8 << 20))
        .collect();
    let paths: Vec<&str> = files.iter().map(|p| p.to_str().unwrap()).collect();
    let args = make_clean_mirror(&paths);
    let before: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(f).unwrap()).collect();
    read_only_session(&args);
    read_only_session(&args);
    for (f, b) in files.iter().zip(&before) {
        assert!(
            std::fs::read(f).unwrap() == *b,
            "{} changed under --read-only",
            f.display()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The same over two writable nbdkit exports of two files: --read-only must not write to
/// them although the server would take it.
#[test]
fn read_only_mirror_over_writable_nbd_exports_writes_nothing() {
    if !have("qemu-io") || !have("nbdkit") {
        return;
    }
    let dir = scratch("ro-mirror-nbd");
    let files: Vec<PathBuf> = (0..2)
        .map(|i| blank(&dir, &format!("m{i}.img"), 8 << 20))
        .collect();
    let kits: Vec<Peer> = files
        .iter()
        .map(|f| peers::nbdkit(&["file", f.to_str().unwrap()]))
        .collect();
    let urls: Vec<String> = kits
        .iter()
        .map(|k| format!("nbd://127.0.0.1:{}/", k.port))
        .collect();
    let sides: Vec<&str> = urls.iter().map(String::as_str).collect();
    let args = make_clean_mirror(&sides);
    let before: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(f).unwrap()).collect();
    read_only_session(&args);
    for (f, b) in files.iter().zip(&before) {
        assert!(
            std::fs::read(f).unwrap() == *b,
            "{} changed under --read-only",
            f.display()
        );
    }
    drop(kits);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A write larger than the agreed maximum payload, sent by libnbd with strict mode off: it
/// is refused with EINVAL, its payload read and dropped, and the connection goes on serving
/// (as nbdkit does), with and without extended headers.
#[test]
fn an_oversize_write_is_refused_and_the_connection_serves_on() {
    if !have_python_libnbd() {
        return;
    }
    let dir = scratch("oversize");
    let img = blank(&dir, "disk.img", 96 << 20);
    let sock = dir.join("s.sock");
    let s = Serve::start_export(
        &format!("unix:{}", sock.display()),
        "d",
        &["--max-request", "1048576", img.to_str().unwrap()],
    );
    let script = r#"
import sys, errno, nbd
uri = sys.argv[1]
for extended in (True, False):
    h = nbd.NBD()
    h.set_strict_mode(0)
    if hasattr(h, "set_request_extended_headers"):
        h.set_request_extended_headers(extended)
    elif not extended:
        continue
    h.connect_uri(uri)
    assert h.get_block_size(nbd.SIZE_MAXIMUM) == 1 << 20, h.get_block_size(nbd.SIZE_MAXIMUM)
    h.pwrite(b"\x5a" * 4096, 0)
    try:
        h.pwrite(b"\x01" * (8 << 20), 0)
        raise SystemExit("an 8 MiB write over a 1 MiB maximum was accepted")
    except nbd.Error as e:
        assert e.errno in ("EINVAL", errno.EINVAL), (e.string, e.errno)
    # The payload was skipped, not read as requests: the connection still works.
    assert h.pread(4096, 0) == b"\x5a" * 4096
    h.pwrite(b"\x6b" * (1 << 20), 1 << 20)
    assert h.pread(1 << 20, 1 << 20) == b"\x6b" * (1 << 20)
    h.shutdown()
print("ok")
"#;
    python_libnbd(script, &[&s.url]);
    let (ok, err) = s.stop();
    assert!(ok, "{err}");
    let raw = std::fs::read(&img).unwrap();
    assert!(
        raw[..4096].iter().all(|&b| b == 0x5a),
        "the refused write landed"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Started the inetd way: the connected socket is standard input only (standard output is
/// /dev/null); `serve --listen -` answers over that socket, both ways.
#[test]
fn serve_on_a_socket_passed_as_standard_input() {
    if !have_python_libnbd() {
        return;
    }
    let dir = scratch("inetd");
    let img = blank(&dir, "disk.img", 16 << 20);
    let bin = env!("CARGO_BIN_EXE_tagstripe");
    let script = r#"
import socket, subprocess, sys, nbd
bin, img = sys.argv[1], sys.argv[2]
ours, theirs = socket.socketpair()
p = subprocess.Popen([bin, "serve", "--listen", "-", img], stdin=theirs,
                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
theirs.close()
h = nbd.NBD()
h.connect_socket(ours.fileno())
assert h.get_size() == 16 << 20, h.get_size()
h.pwrite(b"\xee" * 65536, 4096)
h.flush()
assert h.pread(65536, 4096) == b"\xee" * 65536
h.shutdown()
err = p.communicate(timeout=60)[1]
assert p.returncode == 0, err
print("ok")
"#;
    python_libnbd(script, &[bin, img.to_str().unwrap()]);
    let raw = std::fs::read(&img).unwrap();
    assert!(raw[4096..4096 + 65536].iter().all(|&b| b == 0xee));
    let _ = std::fs::remove_dir_all(&dir);
}

/// 3,000 connections to serve's Unix socket that connect and say nothing: a client that
/// speaks next is still served within a second (the silent ones give way).
#[test]
fn a_flood_of_silent_connections_does_not_lock_a_client_out() {
    let dir = scratch("flood");
    let img = blank(&dir, "disk.img", 1 << 20);
    let sock = dir.join("s.sock");
    let s = Serve::start_export(
        &format!("unix:{}", sock.display()),
        "d",
        &[img.to_str().unwrap()],
    );
    let mut flood = Vec::new();
    for i in 0..3000 {
        match std::os::unix::net::UnixStream::connect(&sock) {
            Ok(c) => flood.push(c),
            // This process's own descriptor limit: what it could open is the flood.
            Err(e) if e.raw_os_error() == Some(24) => {
                eprintln!("flood stopped at {i} connections: {e}");
                break;
            }
            Err(e) => panic!("connection {i}: {e}"),
        }
    }
    assert!(flood.len() > 1024, "only {} connections", flood.len());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let started = std::time::Instant::now();
    let got = rt.block_on(async {
        use tagstripe::BlockDevice;
        let c = tokio::time::timeout(
            std::time::Duration::from_secs(1),
            tagstripe::nbd::NbdDevice::connect(&s.url),
        )
        .await
        .expect("no greeting within a second of the flood")
        .unwrap();
        c.read(0, 1, tagstripe::IoOpts::new()).await.unwrap()
    });
    assert_eq!(got, vec![0u8; 512], "served in {:?}", started.elapsed());
    drop(flood);
    let (ok, err) = s.stop();
    assert!(ok, "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
