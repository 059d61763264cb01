//! Loop devices for the tests that need real block devices (root and `losetup`).
#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// A loop device over a temporary file, detached and removed on drop.
pub struct Loop {
    pub dev: PathBuf,
    pub file: PathBuf,
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.dev).status();
        let _ = std::fs::remove_file(&self.file);
    }
}

/// Whether loop devices can be made here: root, `losetup`, `/dev/loop-control`.
pub fn can_use_loop() -> Result<(), String> {
    // The effective user by `id -u`, which keeps the tests free of libc.
    let uid = Command::new("id")
        .arg("-u")
        .output()
        .map_err(|e| format!("id: {e}"))?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return Err("not root".into());
    }
    Command::new("losetup")
        .arg("--version")
        .output()
        .map_err(|e| format!("losetup not available: {e}"))?;
    if !Path::new("/dev/loop-control").exists() {
        return Err("no /dev/loop-control".into());
    }
    Ok(())
}

/// A loop device over a file of `mib` MiB with the given sector size.
pub fn make_loop(tag: &str, mib: u64, sector_size: u32) -> Result<Loop, String> {
    make_loop_bytes(tag, mib << 20, sector_size)
}

/// A loop device over a file of exactly `bytes` bytes.
pub fn make_loop_bytes(tag: &str, bytes: u64, sector_size: u32) -> Result<Loop, String> {
    make_loop_with(tag, bytes, sector_size, false)
}

/// A loop device over a file of exactly `bytes` bytes, with `--direct-io=on` if `direct`.
pub fn make_loop_with(
    tag: &str,
    bytes: u64,
    sector_size: u32,
    direct: bool,
) -> Result<Loop, String> {
    let file =
        std::env::temp_dir().join(format!("tagstripe-loop-{}-{tag}.img", std::process::id()));
    let f = std::fs::File::create(&file).map_err(|e| e.to_string())?;
    f.set_len(bytes).map_err(|e| e.to_string())?;
    drop(f);
    let out = Command::new("losetup")
        .args([
            "--find",
            "--show",
            "--sector-size",
            &sector_size.to_string(),
            if direct {
                "--direct-io=on"
            } else {
                "--direct-io=off"
            },
        ])
        .arg(&file)
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        let _ = std::fs::remove_file(&file);
        return Err(format!(
            "losetup failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let dev = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim().to_owned());
    Ok(Loop { dev, file })
}

/// A two-worker runtime with time and I/O, for tests that block on async code.
/// One thread and tokio's clock paused (it moves only when told, or when every task waits).
pub fn paused_rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap()
}

pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A write's payload as the NBD server takes a large one: `head` in memory, then `body`
/// sent through a socket (by a thread of its own) and taken into a pipe.
pub fn piped_payload(head: &[u8], body: &[u8]) -> tagstripe::Piped {
    use std::io::Write;
    use std::os::fd::AsFd;
    let (mut a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    b.set_nonblocking(true).unwrap();
    let (total, room) = (head.len() + body.len(), body.len());
    let body = body.to_vec();
    let sender = std::thread::spawn(move || a.write_all(&body));
    let mut p = tagstripe::Piped::new(bytes::Bytes::copy_from_slice(head), room);
    while p.len() < total {
        match p.fill_from(b.as_fd(), total - p.len()) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::yield_now(),
            Err(e) => panic!("{e}"),
        }
    }
    sender.join().unwrap().unwrap();
    p
}
