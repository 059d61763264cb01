//! Malformed and extreme command lines: each exits 2 with a message on stderr (or the JSON
//! error with `--json`), never a panic or a hang.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::process::Command;
use std::time::Duration;

fn run(args: &[OsString]) -> (Option<i32>, String) {
    let child = Command::new(env!("CARGO_BIN_EXE_tagstripe"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    // Bad input must be refused at once: 20 s without an exit is a hang.
    let Ok(out) = rx.recv_timeout(Duration::from_secs(20)) else {
        let _ = Command::new("kill").arg(pid.to_string()).status();
        panic!("{args:?} hung");
    };
    let out = out.unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn s(v: &[&str]) -> Vec<OsString> {
    v.iter().map(OsString::from).collect()
}

#[test]
fn malformed_command_lines_exit_2() {
    let bad_utf8 = OsString::from_vec(vec![b'A', 0xff, 0xfe, b'B']);
    let cases: Vec<Vec<OsString>> = vec![
        s(&["map", "--sizes", "0", "--interleave", "16"]),
        s(&["map", "--sizes", "-5,10", "--interleave", "16"]),
        s(&[
            "map",
            "--sizes",
            "18446744073709551616",
            "--interleave",
            "1",
        ]),
        s(&[
            "map",
            "--sizes",
            "100,100",
            "--interleave",
            "16",
            "--request",
            "99999999999999999999:1",
        ]),
        s(&["split", "--start", "1", "--sectors", "8", "--lbs", "4096"]),
        s(&["split", "--start", "0", "--sectors", "8", "--lbs", "3000"]),
        s(&[
            "split",
            "--start",
            "0",
            "--sectors",
            "8",
            "--force",
            "max_sec=-1",
        ]),
        vec![
            "split".into(),
            "--start".into(),
            "0".into(),
            "--sectors".into(),
            "8".into(),
            "--device".into(),
            bad_utf8.clone(),
        ],
        vec!["quirks".into(), "--force".into(), bad_utf8.clone()],
        s(&["quirks", "--file", "/nonexistent/quirks.toml"]),
        s(&["info", "/nonexistent/device"]),
        vec!["info".into(), bad_utf8.clone()],
        s(&["serve", "--listen", "not-an-address", "/dev/null"]),
        s(&["serve", "--listen", "127.0.0.1:0", "/nonexistent/file"]),
        s(&["serve", "--listen", "127.0.0.1:0", "nbd://"]),
        s(&[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--flavor",
            "zfs",
            "/dev/null",
        ]),
        s(&[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--max-request",
            "100",
            "/dev/null",
        ]),
        s(&[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--local-congestion",
            "not a name",
            "/dev/null",
        ]),
        // A mirror without metadata must be said to be clean.
        s(&[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--flavor",
            "freebsd",
            "--mirror",
            "--no-metadata",
            "sim:ssd:8M",
            "sim:ssd:8M",
        ]),
        s(&[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--metadata",
            "end",
            "--no-metadata",
            "/dev/null",
        ]),
        s(&[
            "bench",
            "throughput",
            "--component",
            "sim:ssd:64M",
            "--op",
            "read",
            "--bs",
            "4k",
            "--depth",
            "0",
        ]),
        s(&[
            "bench",
            "throughput",
            "--component",
            "sim:ssd:0",
            "--op",
            "read",
            "--bs",
            "4k",
        ]),
        s(&[
            "bench",
            "throughput",
            "--component",
            "sim:ssd:64M",
            "--op",
            "read",
            "--bs",
            "99999999999999999999",
        ]),
        s(&[
            "bench",
            "throughput",
            "--component",
            "sim:ssd:64M",
            "--op",
            "read",
            "--bs",
            "128M",
            "--seconds",
            "1",
        ]),
        s(&["bench", "fairness", "--sim", "--seconds", "0"]),
        s(&["bench", "soak", "--minutes", "-1"]),
        s(&["bench", "soak", "--busy-delay-ms", "60001"]),
        s(&["bench", "soak", "--busy-delay-ms", "-5"]),
        s(&["bench", "--interleave", "-3"]),
        s(&["no-such-command"]),
    ];
    for args in cases {
        let (code, err) = run(&args);
        assert_eq!(code, Some(2), "{args:?}: exit {code:?}, stderr {err}");
        assert!(!err.trim().is_empty(), "{args:?}: no message");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}
