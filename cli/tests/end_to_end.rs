//! tagstripe against the peers a user meets outside this project:
//! - its NBD client under a volume striped over exports of nbd-server, the reference server;
//! - its NBD client under exports that fail any request breaking their advertised block
//!   sizes (nbdkit's blocksize-policy filter);
//! - fio's `nbd` engine writing through `tagstripe serve` and verifying every block it wrote;
//! - a real filesystem (ext4 on a striped volume, XFS on a mirror) made, filled, checked by
//!   its own fsck and read back after the server restarts, on a served volume reached through
//!   nbdfuse and a loop device: what a user does to put a filesystem on a volume on a kernel
//!   with no nbd driver;
//! - ext4 on a mirror whose second side (behind nbdkit's error filter) fails while files are
//!   written: the side is dropped, nothing is lost, and after a restart the side is stale,
//!   resynced online, and the same bytes as the first again.
//!
//! Each test skips with a printed reason where a tool (or root, for the loop device and the
//! mounts) is missing; CI installs the tools and runs as root.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tagstripe_striping::Geometry;

#[path = "../../lib/tests/common/mod.rs"]
mod loops;
#[path = "../../lib/tests/common/peers.rs"]
mod peers;
use peers::{have, have_from, nbd_server, nbdkit, pattern, scratch};
#[path = "common/serve.rs"]
mod serve;
use serve::{Serve, make_files, qemu_io, run, through_map};

#[test]
fn a_volume_striped_over_nbd_server_exports() {
    if !have_from("nbd-server", "-V", "nbd-server") || !have("qemu-io") {
        return;
    }
    let dir = scratch("nbd-server");
    let sizes = [4u64, 6, 5];
    let files = make_files(&dir, &sizes);
    let names = ["c0", "c1", "c2"];
    let exports: Vec<(&str, &Path)> = names
        .iter()
        .zip(&files)
        .map(|(n, f)| (*n, f.as_path()))
        .collect();
    let peer = nbd_server(&dir, &exports);
    let urls: Vec<String> = names
        .iter()
        .map(|n| format!("nbd://127.0.0.1:{}/{n}", peer.port))
        .collect();
    // tagstripe's client reads what nbd-server offers (it sends no block sizes).
    let info = run(Command::new(env!("CARGO_BIN_EXE_tagstripe"))
        .args(["info", "--json"])
        .arg(&urls[1]));
    let j: serde_json::Value = serde_json::from_str(&info).unwrap();
    assert_eq!(j["bytes"], 6 << 20, "{info}");
    assert_eq!(j["caps"]["flush"], true, "{info}");
    // What it does not report is said so, not shown as zeros or separators.
    let text = run(Command::new(env!("CARGO_BIN_EXE_tagstripe"))
        .arg("info")
        .arg(&urls[1]));
    assert!(text.contains("physical not reported"), "{text}");
    assert!(text.contains("identity: none reported"), "{text}");

    let mut args = vec!["--interleave", "16"];
    args.extend(urls.iter().map(String::as_str));
    let serve = Serve::start(&args);
    let text = qemu_io(
        &serve.url,
        &[
            "write -P 0xa5 0 1M".into(),
            "write -P 0x3c 3000k 700k".into(),
            "write -z 64k 64k".into(),
            "aio_write -P 0x11 8M 256k".into(),
            "aio_write -P 0x22 9M 256k".into(),
            "aio_flush".into(),
            "read -P 0xa5 0 64k".into(),
            "read -P 0 64k 64k".into(),
            "read -P 0xa5 128k 896k".into(),
            "read -P 0x3c 3000k 700k".into(),
            "read -P 0x11 8M 256k".into(),
            "read -P 0x22 9M 256k".into(),
            "flush".into(),
        ],
    );
    assert!(text.contains("read 716800/716800"), "{text}");
    let (ok, err) = serve.stop();
    assert!(ok, "serve did not stop cleanly: {err}");

    // The bytes are where the striping map puts them, in nbd-server's files.
    let g = Geometry::builder(sizes.map(|m| m * 2048), 16)
        .build()
        .unwrap();
    assert_eq!(through_map(&g, &files, 0, 128), vec![0xa5; 64 << 10]);
    assert_eq!(through_map(&g, &files, 128, 128), vec![0; 64 << 10]);
    assert_eq!(through_map(&g, &files, 256, 1792), vec![0xa5; 896 << 10]);
    assert_eq!(through_map(&g, &files, 6000, 1400), vec![0x3c; 700 << 10]);
    assert_eq!(through_map(&g, &files, 16384, 512), vec![0x11; 256 << 10]);
    assert_eq!(through_map(&g, &files, 18432, 512), vec![0x22; 256 << 10]);
    peer.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_volume_over_exports_that_refuse_what_breaks_their_block_sizes() {
    if !have("nbdkit") || !have("qemu-io") {
        return;
    }
    // nbdkit's blocksize-policy filter advertises 4 KiB blocks and 64 KiB requests, and
    // fails (EINVAL) any request that breaks them, so a client that does not honour what
    // the server advertises fails here.
    let strict = || {
        nbdkit(&[
            "--filter=blocksize-policy",
            "memory",
            "32M",
            "blocksize-minimum=4096",
            "blocksize-preferred=65536",
            "blocksize-maximum=65536",
            "blocksize-error-policy=error",
        ])
    };
    let (a, b) = (strict(), strict());
    let urls = [a.port, b.port].map(|p| format!("nbd://127.0.0.1:{p}/"));
    let serve = Serve::start(&["--interleave", "256", &urls[0], &urls[1]]);
    let info = run(Command::new(env!("CARGO_BIN_EXE_tagstripe"))
        .args(["info", "--json"])
        .arg(&serve.url));
    let j: serde_json::Value = serde_json::from_str(&info).unwrap();
    assert_eq!(j["logical_block_size"], 4096, "{info}");
    // qemu aligns to the volume's 4 KiB blocks itself (read-modify-write); tagstripe cuts
    // the 3 MiB write and read into pieces of at most 64 KiB for each component.
    qemu_io(
        &serve.url,
        &[
            "write -P 0xab 512 3M".into(),
            "write -z 1M 1M".into(),
            "flush".into(),
            "read -P 0 0 512".into(),
            "read -P 0xab 512 1047552".into(),
            "read -P 0 1M 1M".into(),
            "read -P 0xab 2M 1M".into(),
            "read -P 0xab 3M 512".into(),
            "read -P 0 3146240 3584".into(),
        ],
    );
    let (ok, err) = serve.stop();
    assert!(ok, "serve did not stop cleanly: {err}");
}

/// `serve`'s arguments: `flags`, then the component files.
fn serve_args<'a>(flags: &[&'a str], files: &'a [PathBuf]) -> Vec<&'a str> {
    let mut args = flags.to_vec();
    args.extend(files.iter().map(|p| p.to_str().unwrap()));
    args
}

/// fio's JSON for one job: bytes written and read, and its error code.
fn fio_job(j: &serde_json::Value) -> (u64, u64, i64) {
    (
        j["write"]["io_bytes"].as_u64().unwrap(),
        j["read"]["io_bytes"].as_u64().unwrap(),
        j["error"].as_i64().unwrap(),
    )
}

#[test]
fn fio_nbd_engine_verifies_what_it_wrote_through_serve() {
    if !have_from("fio", "--version", "fio") {
        return;
    }
    let engines = run(Command::new("fio").arg("--enghelp"));
    if !engines.lines().any(|l| l.trim() == "nbd") {
        eprintln!("skipping: this fio has no nbd engine (built without libnbd)");
        return;
    }
    let dir = scratch("fio");
    let files = make_files(&dir, &[16, 16, 16]);
    let serve = Serve::start(&serve_args(&["--interleave", "16"], &files));
    // Two jobs, each on its own 24 MiB half, random writes of 4-64 KiB at depth 16, then a
    // read of every block checked against the CRC fio wrote into it.
    let out = run(Command::new("fio")
        .args([
            "--output-format=json",
            "--name=verify",
            "--ioengine=nbd",
            "--rw=randwrite",
            "--bsrange=4k-64k",
            "--iodepth=16",
            "--numjobs=2",
            "--size=24m",
            "--offset_increment=24m",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
            // No verify-state files left behind (fio writes them into its directory).
            "--verify_state_save=0",
        ])
        .current_dir(&dir)
        .arg(format!("--uri={}", serve.url)));
    let json = &out[out.find('{').expect("fio printed no JSON")..];
    let j: serde_json::Value = serde_json::from_str(json).unwrap();
    let jobs = j["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 2, "{out}");
    for job in jobs {
        let (written, read, error) = fio_job(job);
        assert_eq!(error, 0, "{out}");
        assert_eq!(written, 24 << 20, "{out}");
        assert_eq!(
            read, written,
            "every block written was read back and verified: {out}"
        );
    }
    let (ok, err) = serve.stop();
    assert!(ok, "serve did not stop cleanly: {err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// nbdfuse exposing an NBD export as the file `<mountpoint>/nbd`; unmounted on drop.
struct Fuse {
    child: Child,
    dir: PathBuf,
}

impl Fuse {
    fn start(dir: &Path, url: &str) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let pid = dir.with_extension("pid");
        let _ = std::fs::remove_file(&pid);
        let mut child = Command::new("nbdfuse")
            .arg("-P")
            .arg(&pid)
            .arg(dir)
            .arg(url)
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        // nbdfuse writes its pid file once the file system is ready.
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::fs::metadata(&pid).map_or(true, |m| m.len() == 0) {
            if let Some(st) = child.try_wait().unwrap() {
                panic!("nbdfuse ended ({st}) before it was ready");
            }
            assert!(Instant::now() < deadline, "nbdfuse was not ready in 30 s");
            std::thread::sleep(Duration::from_millis(10));
        }
        Self {
            child,
            dir: dir.to_owned(),
        }
    }

    fn file(&self) -> PathBuf {
        self.dir.join("nbd")
    }
}

impl Drop for Fuse {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).status();
        let _ = self.child.wait();
    }
}

/// A loop device over a file; detached on drop.
struct LoopDev(PathBuf);

impl LoopDev {
    fn over(file: &Path) -> Self {
        let out = run(Command::new("losetup").args(["--find", "--show"]).arg(file));
        Self(PathBuf::from(out.trim()))
    }
}

impl Drop for LoopDev {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.0).status();
    }
}

/// A mounted file system; unmounted on drop.
struct Mount(PathBuf);

impl Mount {
    fn new(dev: &Path, at: &Path) -> Self {
        std::fs::create_dir_all(at).unwrap();
        run(Command::new("mount").arg(dev).arg(at));
        Self(at.to_owned())
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// The files a user puts on a new file system: a tree of small files of many sizes and one
/// large file, each of its own bytes.
fn content() -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = (0..150usize)
        .map(|i| {
            let size = 1 + (i * 7919) % 70_000;
            (format!("d{}/f{i}", i % 12), pattern(i as u64, size))
        })
        .collect();
    files.push(("big".into(), pattern(150, 24 << 20)));
    files
}

/// Writes `files` under the mount and syncs its file system.
fn write_files(m: &Mount, files: &[(String, Vec<u8>)]) {
    for (name, data) in files {
        let p = m.0.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, data).unwrap();
    }
    run(Command::new("sync").arg("-f").arg(&m.0));
}

/// Whether every one of `files` reads back as written.
fn check_files(m: &Mount, files: &[(String, Vec<u8>)]) -> Result<(), String> {
    for (name, data) in files {
        let got = std::fs::read(m.0.join(name)).map_err(|e| format!("{name}: {e}"))?;
        if &got != data {
            return Err(format!("{name} came back different"));
        }
    }
    Ok(())
}

/// One file system's life on a served volume: `mkfs`, fill, unmount, `fsck` (clean), stop
/// the server; start it again on the same components and read every file back.
fn filesystem_round_trip(
    dir: &Path,
    serve_args: &[&str],
    mkfs: &[&str],
    fsck: &[&str],
) -> Result<(), String> {
    let files = content();
    let sock = dir.join("vol.sock");
    let listen = format!("unix:{}", sock.display());
    for round in 0..2 {
        let serve = Serve::start_on(&listen, serve_args);
        {
            let fuse = Fuse::start(&dir.join("fuse"), &serve.url);
            let dev = LoopDev::over(&fuse.file());
            let mnt = dir.join("mnt");
            if round == 0 {
                run(Command::new(mkfs[0]).args(&mkfs[1..]).arg(&dev.0));
                let m = Mount::new(&dev.0, &mnt);
                write_files(&m, &files);
                drop(m);
                run(Command::new(fsck[0]).args(&fsck[1..]).arg(&dev.0));
            } else {
                run(Command::new(fsck[0]).args(&fsck[1..]).arg(&dev.0));
                let m = Mount::new(&dev.0, &mnt);
                check_files(&m, &files)?;
            }
        }
        let (ok, err) = serve.stop();
        if !ok {
            return Err(format!("serve did not stop cleanly: {err}"));
        }
    }
    Ok(())
}

/// Whether this test can mount things: loop devices (root), nbdfuse and `/dev/fuse`.
fn can_mount() -> bool {
    if let Err(why) = loops::can_use_loop() {
        eprintln!("skipping: {why}");
        return false;
    }
    if !Path::new("/dev/fuse").exists() {
        eprintln!("skipping: no /dev/fuse");
        return false;
    }
    have_from("nbdfuse", "--version", "libnbd-bin")
}

/// Whether two mirror components hold the same data: all but each one's metadata, in its
/// last 16 sectors.
fn same_data(a: &Path, b: &Path) -> bool {
    let (x, y) = (std::fs::read(a).unwrap(), std::fs::read(b).unwrap());
    let data = x.len().saturating_sub(16 * 512);
    x.len() == y.len() && x[..data] == y[..data]
}

#[test]
fn ext4_on_a_striped_volume_through_nbdfuse() {
    if !can_mount() || !have_from("mkfs.ext4", "-V", "e2fsprogs") {
        return;
    }
    let dir = scratch("ext4");
    let files = make_files(&dir, &[100, 140, 120]);
    filesystem_round_trip(
        &dir,
        &serve_args(&["--interleave", "64"], &files),
        &["mkfs.ext4", "-q", "-F"],
        &["fsck.ext4", "-f", "-n"],
    )
    .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn xfs_on_a_mirror_through_nbdfuse() {
    if !can_mount() || !have_from("mkfs.xfs", "-V", "xfsprogs") {
        return;
    }
    let dir = scratch("xfs");
    // XFS wants at least 300 MB; a mirror of two 160 MiB stripes on each side.
    let files = make_files(&dir, &[160, 160, 160, 160]);
    let flags = ["--mirror", "--flavor", "freebsd", "--interleave", "128"];
    filesystem_round_trip(
        &dir,
        &serve_args(&flags, &files),
        &["mkfs.xfs", "-q", "-f"],
        &["xfs_repair", "-n"],
    )
    .unwrap();
    // The two sides hold the same data, so either could serve every read.
    assert!(
        same_data(&files[0], &files[2]) && same_data(&files[1], &files[3]),
        "the mirror's sides differ"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn ext4_on_a_mirror_that_loses_a_side_and_heals() {
    if !can_mount() || !have_from("mkfs.ext4", "-V", "e2fsprogs") || !have("nbdkit") {
        return;
    }
    let dir = scratch("heal");
    let files = make_files(&dir, &[96, 96]);
    // Side 1 is behind nbdkit, whose error filter fails every request while `trigger` exists.
    let trigger = dir.join("fail-now");
    let error_file = format!("error-file={}", trigger.display());
    let side1 = nbdkit(&[
        "--filter=error",
        "file",
        files[1].to_str().unwrap(),
        "error-rate=100%",
        &error_file,
    ]);
    let url = format!("nbd://127.0.0.1:{}/", side1.port);
    let args = [
        "--mirror",
        "--flavor",
        "freebsd",
        "--interleave",
        "128",
        files[0].to_str().unwrap(),
        &url,
    ];
    let listen = format!("unix:{}", dir.join("vol.sock").display());
    let all = content();
    let (before, after) = all.split_at(80);
    let mnt = dir.join("mnt");

    // A new mirror: side 1 is copied from side 0 first; then ext4, and files on both sides.
    let mut serve = Serve::start_on(&listen, &args);
    serve.wait_err("resync complete");
    {
        let fuse = Fuse::start(&dir.join("fuse"), &serve.url);
        let dev = LoopDev::over(&fuse.file());
        run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&dev.0));
        let m = Mount::new(&dev.0, &mnt);
        write_files(&m, before);
        // Side 1 fails: the mirror drops it and goes on with side 0 alone.
        std::fs::write(&trigger, b"").unwrap();
        write_files(&m, after);
        check_files(&m, &all).unwrap();
        drop(m);
        run(Command::new("fsck.ext4").args(["-f", "-n"]).arg(&dev.0));
    }
    let dropped = serve.wait_err("dropped");
    assert!(dropped.contains("mirror side 1 dropped"), "{dropped}");
    let (ok, err) = serve.stop();
    assert!(ok, "serve did not stop cleanly: {err}");

    // The fault is fixed; the volume opens with side 1 stale (never read), and heals online.
    std::fs::remove_file(&trigger).unwrap();
    let mut serve = Serve::start_on(&listen, &args);
    serve.wait_err("mirror side 1 is stale");
    let done = serve.wait_err("resync complete");
    assert!(done.contains("side 1 in sync"), "{done}");
    {
        let fuse = Fuse::start(&dir.join("fuse"), &serve.url);
        let dev = LoopDev::over(&fuse.file());
        run(Command::new("fsck.ext4").args(["-f", "-n"]).arg(&dev.0));
        let m = Mount::new(&dev.0, &mnt);
        check_files(&m, &all).unwrap();
    }
    let (ok, err) = serve.stop();
    assert!(ok, "serve did not stop cleanly: {err}");
    // Both sides hold the same data again.
    assert!(
        same_data(&files[0], &files[1]),
        "the sides differ after the resync"
    );
    side1.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// `tagstripe crash check` over `log` with `base`, as a user runs it; its JSON.
fn crash_check(
    log: &Path,
    base: &Path,
    mode: &str,
    states: &str,
    check: &str,
) -> serde_json::Value {
    let o = Command::new(env!("CARGO_BIN_EXE_tagstripe"))
        .args(["crash", "check"])
        .arg(log)
        .arg("--base")
        .arg(base)
        .args([
            "--mode", mode, "--states", states, "--json", "--", "sh", "-c", check, "_", "{}",
        ])
        .output()
        .unwrap();
    let j: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("crash check: {e}: {}", String::from_utf8_lossy(&o.stderr)));
    assert_eq!(
        o.status.code(),
        Some(if j["failed"] == 0 { 0 } else { 1 }),
        "{j}"
    );
    j
}

/// A file system made on a served volume, then used (files written and fsync'd, renamed
/// over, removed) with the volume recorded; every prefix state and 100 subset states of that
/// use must pass `check` (its journal replayed, then checked without changes).
fn filesystem_crash_states(name: &str, mib: u64, mkfs: &[&str], check: &str) {
    let dir = scratch(name);
    let disk = serve::blank(&dir, "disk.img", mib << 20);
    let sock = dir.join("vol.sock");
    let listen = format!("unix:{}", sock.display());
    let log = dir.join("log");
    let base = dir.join("base.img");
    for round in 0..2 {
        let mut args = vec![disk.to_str().unwrap()];
        if round == 1 {
            // The state the recording starts from: the new file system, copied.
            run(Command::new("cp")
                .arg("--sparse=always")
                .arg(&disk)
                .arg(&base));
            args.extend(["--record", log.to_str().unwrap()]);
        }
        let serve = Serve::start_on(&listen, &args);
        {
            let fuse = Fuse::start(&dir.join("fuse"), &serve.url);
            let dev = LoopDev::over(&fuse.file());
            if round == 0 {
                run(Command::new(mkfs[0]).args(&mkfs[1..]).arg(&dev.0));
            } else {
                let m = Mount::new(&dev.0, &dir.join("mnt"));
                for i in 0..40usize {
                    let d = m.0.join(format!("d{}", i % 5));
                    std::fs::create_dir_all(&d).unwrap();
                    let tmp = d.join(format!("f{i}.tmp"));
                    let mut f = std::fs::File::create(&tmp).unwrap();
                    std::io::Write::write_all(&mut f, &pattern(i as u64, 1 + i * 5000)).unwrap();
                    f.sync_all().unwrap();
                    std::fs::rename(&tmp, d.join(format!("f{i}"))).unwrap();
                    if i % 4 == 3 {
                        std::fs::remove_file(d.join(format!("f{}", i - 2))).unwrap_or_default();
                    }
                }
                std::fs::write(m.0.join("big"), pattern(99, 3 << 20)).unwrap();
                run(Command::new("sync").arg("-f").arg(&m.0));
            }
        }
        let (ok, err) = serve.stop();
        assert!(ok, "serve did not stop cleanly: {err}");
    }
    let j = crash_check(&log, &base, "prefix", "1000000", check);
    assert_eq!(j["failed"], 0, "prefix: {j}");
    assert!(
        j["states"].as_u64().unwrap() >= 40,
        "a prefix state a fsync at least: {j}"
    );
    let j = crash_check(&log, &base, "subset", "100", check);
    assert_eq!(j["failed"], 0, "subset: {j}");
    eprintln!(
        "{name}: prefix and 100 subset states clean ({} states/s)",
        j["states_per_second"]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn ext4_is_clean_in_every_prefix_state_and_100_subset_states_of_a_recorded_volume() {
    if !can_mount() || !have_from("mkfs.ext4", "-V", "e2fsprogs") {
        return;
    }
    filesystem_crash_states(
        "crash-ext4",
        120,
        &["mkfs.ext4", "-q", "-F"],
        r#"e2fsck -y -E journal_only "$1" >/dev/null 2>&1; e2fsck -fn "$1""#,
    );
}

#[test]
fn xfs_is_clean_in_every_prefix_state_and_100_subset_states_of_a_recorded_volume() {
    if !can_mount() || !have_from("mkfs.xfs", "-V", "xfsprogs") {
        return;
    }
    // XFS replays its log only when mounted: mount the state's image (a loop device of its
    // own), unmount, then check it without changes.
    filesystem_crash_states(
        "crash-xfs",
        // mkfs.xfs makes nothing under 300 MB.
        320,
        &["mkfs.xfs", "-q", "-f"],
        r#"m=$(mktemp -d) && mount -o loop,nouuid "$1" "$m" && umount "$m"; r=$?; rmdir "$m"; [ $r = 0 ] && xfs_repair -n "$1""#,
    );
}
