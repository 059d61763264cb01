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
