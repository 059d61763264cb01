//! `tagstripe info` on a file and, as root, on a loop device.

use std::process::Command;

use serde_json::Value;

fn info(path: &str) -> (Option<i32>, Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_tagstripe"))
        .args(["info", "--json", path])
        .output()
        .unwrap();
    (
        out.status.code(),
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null),
    )
}

#[test]
fn info_on_a_file() {
    let path = std::env::temp_dir().join(format!("tagstripe-info-{}.img", std::process::id()));
    std::fs::File::create(&path)
        .unwrap()
        .set_len(5 << 20)
        .unwrap();
    let (code, v) = info(path.to_str().unwrap());
    std::fs::remove_file(&path).unwrap();
    assert_eq!(code, Some(0));
    assert_eq!(v["kind"], "file");
    assert_eq!(v["sectors"], 10240);
    assert_eq!(v["logical_block_size"], 512);
    assert!(v["quirks"]["matches"].as_array().unwrap().is_empty());
    let (code, v) = info("/nonexistent/tagstripe");
    assert_eq!(code, Some(2));
    assert_eq!(v["error"]["kind"], "open");
}

#[test]
fn info_on_a_loop_device() {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if !matches!(root, Ok(true)) || !std::path::Path::new("/dev/loop-control").exists() {
        eprintln!("skipping: needs root and loop devices");
        return;
    }
    let file = std::env::temp_dir().join(format!("tagstripe-info-loop-{}.img", std::process::id()));
    std::fs::File::create(&file)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    let out = Command::new("losetup")
        .args(["--find", "--show", "--sector-size", "4096"])
        .arg(&file)
        .output()
        .unwrap();
    let dev = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let (code, v) = info(&dev);
    let _ = Command::new("losetup").args(["-d", &dev]).status();
    std::fs::remove_file(&file).unwrap();
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(v["kind"], "block");
    assert_eq!(v["sectors"], 16384);
    assert_eq!(v["logical_block_size"], 4096);
    assert!(v["hardware_limits"]["max_hw_sectors"].as_u64().unwrap() > 0);
}

/// A file and an NBD export whose size is not a whole number of sectors: `info` says how
/// many bytes at the end are not used, a command that builds a volume says it on stderr,
/// and writing the whole volume leaves those bytes as they were.
#[test]
fn a_part_sector_at_the_end_is_reported_and_left_alone() {
    let bin = env!("CARGO_BIN_EXE_tagstripe");
    let path = std::env::temp_dir().join(format!("tagstripe-info-odd-{}.img", std::process::id()));
    let p = path.to_str().unwrap().to_owned();
    let original: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(&path, &original).unwrap();
    let (code, v) = info(&p);
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(
        (&v["sectors"], &v["bytes"], &v["unused_tail_bytes"]),
        (&1953.into(), &999_936.into(), &64.into()),
        "{v}"
    );
    let said = "its last 64 bytes are not a whole 512-byte block and are not used (it holds 1000000 bytes)";
    let out = Command::new(bin).args(["info", &p]).output().unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(said),
        "{out:?}"
    );
    let out = Command::new(bin)
        .args(["bench", "throughput", "--component", &p, "--op", "write"])
        .args(["--bs", "64k", "--depth", "4", "--seconds", "0.3", "--json"])
        .output()
        .unwrap();
    let now = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("note: {p}: {said}")), "{stderr}");
    assert_eq!(now.len(), original.len());
    assert_ne!(now[..999_936], original[..999_936], "the benchmark wrote");
    assert_eq!(
        now[999_936..],
        original[999_936..],
        "the last 64 bytes are untouched"
    );
    // The same from an NBD export of that size (nbdkit's memory plugin).
    let nbdkit = Command::new("nbdkit").arg("--version").output();
    if !nbdkit.is_ok_and(|o| o.status.success()) {
        eprintln!("skipping the NBD half: nbdkit is not installed (Debian: nbdkit)");
        return;
    }
    // Through the blocksize-policy filter the export's blocks are 4 KiB: whole ones only.
    let policy = [
        "--filter=blocksize-policy",
        "memory",
        "1000000",
        "blocksize-minimum=4096",
        "blocksize-preferred=4096",
        "blocksize-maximum=65536",
    ];
    for (args, sectors, tail) in [
        (&["memory", "1000000"][..], 1953, 64),
        (&policy[..], 1952, 576),
    ] {
        let out = Command::new("nbdkit")
            .args(["-U", "-"])
            .args(args)
            .arg("--run")
            .arg(format!("'{bin}' info --json \"$uri\""))
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            (&v["sectors"], &v["unused_tail_bytes"]),
            (&sectors.into(), &tail.into()),
            "{args:?}: {v}"
        );
        // Its metadata area (at the end of whole blocks) reads: no request runs into the
        // part block or breaks the block size.
        assert!(v["metadata"]["error"].is_null(), "{args:?}: {v}");
    }
}
