//! A `tagstripe serve` child process for the CLI's NBD tests, and the clients they drive it
//! with. Shared by `serve.rs` and `nbd_protocol.rs`.
#![allow(dead_code, unreachable_pub)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use tagstripe_striping::Geometry;

/// A running `tagstripe serve`; killed on drop unless stopped.
pub struct Serve {
    pub child: Child,
    pub url: String,
    pub out: Vec<String>,
    /// Standard error's lines, read by a thread once [`Serve::wait_err`] started.
    err: Option<std::sync::mpsc::Receiver<String>>,
    /// The lines of standard error read so far.
    pub err_lines: Vec<String>,
}

impl Serve {
    pub fn start(args: &[&str]) -> Self {
        Self::start_on("127.0.0.1:0", args)
    }

    pub fn start_on(listen: &str, args: &[&str]) -> Self {
        Self::start_export(listen, "vol", args)
    }

    /// `serve` on `listen` with the export named `export`.
    pub fn start_export(listen: &str, export: &str, args: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tagstripe"))
            .arg("serve")
            .args(["--listen", listen, "--export", export])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The first line names the address; it is printed once the socket listens.
        let mut r = BufReader::new(child.stdout.take().unwrap());
        let mut out = Vec::new();
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        let url = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_owned();
        out.push(line.trim().to_owned());
        for _ in 0..2 {
            line.clear();
            r.read_line(&mut line).unwrap();
            out.push(line.trim().to_owned());
        }
        // Keep draining stdout so the server never writes into a closed pipe.
        std::thread::spawn(move || std::io::copy(&mut r, &mut std::io::sink()));
        Self {
            child,
            url,
            out,
            err: None,
            err_lines: Vec::new(),
        }
    }

    /// Reads standard error up to the first line that contains `needle` and returns it.
    /// Panics, with what the server said, if it ends first or says nothing of the kind for
    /// two minutes (a test that waits for an event that never comes fails, not hangs).
    pub fn wait_err(&mut self, needle: &str) -> String {
        use std::sync::mpsc::RecvTimeoutError;
        let rx = self.err.get_or_insert_with(|| {
            let r = BufReader::new(self.child.stderr.take().unwrap());
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                for line in r.lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
            rx
        });
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    let line = line.trim_end().to_owned();
                    self.err_lines.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(RecvTimeoutError::Timeout) => panic!(
                    "serve did not say {needle:?} in 120 s: {:?}",
                    self.err_lines
                ),
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("serve ended before saying {needle:?}: {:?}", self.err_lines)
                }
            }
        }
    }

    /// SIGKILL, as a crash: no flush, no clean stop.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then the exit status and stderr.
    pub fn stop(mut self) -> (bool, String) {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        let mut err = String::new();
        for l in &self.err_lines {
            err.push_str(l);
            err.push('\n');
        }
        use std::io::Read as _;
        match self.err.take() {
            // The reader thread ends at the end of standard error, when the server has exited.
            Some(rx) => {
                for line in rx {
                    err.push_str(&line);
                    err.push('\n');
                }
            }
            None => {
                _ = self
                    .child
                    .stderr
                    .take()
                    .unwrap()
                    .read_to_string(&mut err)
                    .unwrap()
            }
        };
        let ok = self.child.wait().unwrap().success();
        (ok, err)
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `cmd` and returns its standard output; panics with both outputs unless it succeeds.
pub fn run(cmd: &mut Command) -> String {
    let o = cmd
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?} did not start: {e}"));
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{cmd:?} failed ({}): {text}{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    text
}

pub fn qemu_io(url: &str, cmds: &[String]) -> String {
    let mut c = Command::new("qemu-io");
    c.args(["-f", "raw", url]);
    for cmd in cmds {
        c.arg("-c").arg(cmd);
    }
    let o = c.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "qemu-io failed: {text}");
    // qemu-io reports a pattern mismatch on stdout and still exits 0.
    assert!(!text.contains("Pattern verification failed"), "{text}");
    assert!(!text.contains("failed:"), "{text}");
    text
}

/// A new sparse file `name` of `bytes` in `dir`; its path.
pub fn blank(dir: &Path, name: &str, bytes: u64) -> PathBuf {
    let path = dir.join(name);
    std::fs::File::create(&path)
        .and_then(|f| f.set_len(bytes))
        .unwrap();
    path
}

/// Runs a Python script against libnbd's bindings (`/usr/bin/python3`) with `args`; panics
/// with its output unless it prints a line `ok` and succeeds.
pub fn python_libnbd(script: &str, args: &[&str]) {
    let out = Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.lines().any(|l| l == "ok"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether `/usr/bin/python3` has libnbd's bindings (Debian's python3-libnbd).
pub fn have_python_libnbd() -> bool {
    let ok = Command::new("/usr/bin/python3")
        .args(["-c", "import nbd"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        eprintln!("skipping: /usr/bin/python3 has no nbd module (Debian: python3-libnbd)");
    }
    ok
}

/// Reads the bytes of volume sectors `[start, start + count)` from the component files,
/// through the striping map.
pub fn through_map(g: &Geometry, files: &[PathBuf], start: u64, count: u64) -> Vec<u8> {
    let data: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(f).unwrap()).collect();
    let mut out = Vec::with_capacity(count as usize * 512);
    for p in g.map(start, count).unwrap() {
        let at = p.cblk as usize * 512;
        out.extend_from_slice(&data[p.component][at..at + p.count as usize * 512]);
    }
    out
}

pub fn make_files(dir: &Path, sizes_mib: &[u64]) -> Vec<PathBuf> {
    sizes_mib
        .iter()
        .enumerate()
        .map(|(i, &m)| {
            let p = dir.join(format!("c{i}.img"));
            std::fs::File::create(&p).unwrap().set_len(m << 20).unwrap();
            p
        })
        .collect()
}
