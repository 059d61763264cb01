//! Real NBD peers for tests: qemu-nbd and nbdkit started in the background with pid files,
//! killed on drop; tests skip (with a printed reason) where a tool is missing. Shared by the
//! library's and the CLI's tests.
#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::process::Command;

pub fn have(tool: &str) -> bool {
    have_from(tool, "--version", "qemu-utils / nbdkit")
}

/// Whether `tool` runs (`tool version_arg` succeeds); prints why a test skips if not, with
/// the Debian package that has it.
pub fn have_from(tool: &str, version_arg: &str, package: &str) -> bool {
    let ok = Command::new(tool)
        .arg(version_arg)
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        eprintln!("skipping: {tool} is not installed (Debian: {package})");
    }
    ok
}

/// `len` bytes of their own for `seed` (xorshift).
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Where a peer's pid file goes: outside the tests' scratch directories, which tests remove
/// before their peers are dropped (nbdkit writes it only after it has forked, so it is read
/// when the peer is stopped, not when it starts).
fn pid_path(tool: &str, port: u16) -> PathBuf {
    std::env::temp_dir().join(format!(
        "tagstripe-{tool}-{}-{port}.pid",
        std::process::id()
    ))
}

/// A server process (qemu-nbd or nbdkit) started in the background with a pid file;
/// killed on drop.
pub struct Peer {
    pub pid_file: PathBuf,
    pub port: u16,
}

impl Peer {
    /// Stops the server and returns once the process is gone.
    pub fn stop(self) {
        if let Ok(pid) = std::fs::read_to_string(&self.pid_file) {
            let pid = pid.trim().to_owned();
            let _ = Command::new("kill").arg(&pid).status();
            // `tail --pid` blocks until the process has exited.
            let _ = Command::new("tail")
                .args(["--pid", &pid, "-f", "/dev/null"])
                .status();
        }
        // Gone: nothing left for `drop` to stop.
        let _ = std::fs::remove_file(&self.pid_file);
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if let Ok(pid) = std::fs::read_to_string(&self.pid_file) {
            let _ = Command::new("kill").arg(pid.trim()).status();
        }
        let _ = std::fs::remove_file(&self.pid_file);
    }
}

pub fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tagstripe-nbd-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// qemu-nbd serving `file` raw as export `name`; returns when it accepts connections.
pub fn qemu_nbd(file: &Path, name: &str) -> Peer {
    qemu_nbd_on(file, name, free_port())
}

/// qemu-nbd on a given port (to come back where a client had it).
pub fn qemu_nbd_on(file: &Path, name: &str, port: u16) -> Peer {
    qemu_nbd_with(file, name, port, &[])
}

/// qemu-nbd on a given port with more arguments (`--object ... --tls-creds ...`).
pub fn qemu_nbd_with(file: &Path, name: &str, port: u16, extra: &[&str]) -> Peer {
    let pid_file = pid_path("qemu-nbd", port);
    let st = Command::new("qemu-nbd")
        .args([
            "-f",
            "raw",
            "-b",
            "127.0.0.1",
            "-x",
            name,
            "--persistent",
            "--fork",
            "-e",
            "8",
        ])
        .arg("-p")
        .arg(port.to_string())
        .arg("--pid-file")
        .arg(&pid_file)
        .args(extra)
        .arg(file)
        .status()
        .unwrap();
    assert!(st.success(), "qemu-nbd failed to start");
    Peer { pid_file, port }
}

/// nbdkit with `args` (plugin, filters, parameters); returns when it accepts connections.
pub fn nbdkit(args: &[&str]) -> Peer {
    let port = free_port();
    let pid_file = pid_path("nbdkit", port);
    let st = Command::new("nbdkit")
        .args(["-i", "127.0.0.1", "-p"])
        .arg(port.to_string())
        .arg("-P")
        .arg(&pid_file)
        .args(args)
        .status()
        .unwrap();
    assert!(st.success(), "nbdkit failed to start");
    Peer { pid_file, port }
}

/// nbd-server (the reference server) with one export per `(name, file)`, on loopback;
/// returns when it accepts connections. It forks a process per client, which ends when
/// the client disconnects.
pub fn nbd_server(dir: &Path, exports: &[(&str, &Path)]) -> Peer {
    let port = free_port();
    let pid_file = pid_path("nbd-server", port);
    let mut conf = format!("[generic]\n    listenaddr = 127.0.0.1\n    port = {port}\n");
    for (name, file) in exports {
        conf.push_str(&format!(
            "[{name}]\n    exportname = {}\n    flush = true\n    fua = true\n    trim = true\n",
            file.display()
        ));
    }
    let conf_path = dir.join(format!("nbd-server-{port}.conf"));
    std::fs::write(&conf_path, conf).unwrap();
    let st = Command::new("nbd-server")
        .arg("-C")
        .arg(&conf_path)
        .arg("-p")
        .arg(&pid_file)
        .status()
        .unwrap();
    assert!(st.success(), "nbd-server failed to start");
    // It may go to the background before it listens: wait until it does.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "nbd-server is not listening on port {port}"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    Peer { pid_file, port }
}
