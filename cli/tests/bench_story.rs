//! `tagstripe bench` (the stories) and `tagstripe bench throughput`: the JSON contracts,
//! bad options, and that the temporary files are removed.

use std::process::Command;

fn tagstripe(args: &[&str]) -> (i32, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_tagstripe"))
        .args(args)
        .output()
        .unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn throughput_json_contract() {
    let (code, out, err) = tagstripe(&[
        "bench",
        "throughput",
        "--component",
        "sim:ssd:64M",
        "--component",
        "sim:ssd:64M",
        "--interleave",
        "64",
        "--op",
        "randread",
        "--bs",
        "4k",
        "--depth",
        "8",
        "--seconds",
        "0.3",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let j: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(j["op"], "randread");
    assert_eq!(j["bs"], 4096);
    assert_eq!(j["depth"], 8);
    assert!(j["seconds"].as_f64().unwrap() >= 0.3);
    assert!(j["iops"].as_f64().unwrap() > 0.0);
    let mb = j["mb_s"].as_f64().unwrap();
    let iops = j["iops"].as_f64().unwrap();
    assert!((mb - iops * 4096.0 / 1e6).abs() < 0.05 * mb + 0.01, "{j}");
    let lat = &j["lat_us"];
    let (p50, p99, max) = (
        lat["p50"].as_f64().unwrap(),
        lat["p99"].as_f64().unwrap(),
        lat["max"].as_f64().unwrap(),
    );
    assert!(0.0 < p50 && p50 <= p99 && p99 <= max, "{j}");
}

#[test]
fn throughput_on_files_writes_them() {
    let dir = std::env::temp_dir().join(format!("tagstripe-tp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let files: Vec<String> = (0..2)
        .map(|i| {
            let p = dir.join(format!("c{i}.img"));
            std::fs::File::create(&p).unwrap().set_len(8 << 20).unwrap();
            p.display().to_string()
        })
        .collect();
    let (code, out, err) = tagstripe(&[
        "bench",
        "throughput",
        "--component",
        &files[0],
        "--component",
        &files[1],
        "--op",
        "write",
        "--bs",
        "1M",
        "--depth",
        "2",
        "--seconds",
        "0.2",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let j: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(j["op"], "write");
    assert!(j["mb_s"].as_f64().unwrap() > 0.0);
    // The writer's bytes (0x5A) reached both components.
    for f in &files {
        let d = std::fs::read(f).unwrap();
        assert_eq!(d[0], 0x5A, "{f}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_options_exit_2_with_a_message() {
    for args in [
        &[
            "bench",
            "throughput",
            "--component",
            "sim:ssd:64M",
            "--op",
            "scan",
            "--bs",
            "4k",
        ][..],
        &[
            "bench",
            "throughput",
            "--component",
            "sim:ssd:64M",
            "--op",
            "read",
            "--bs",
            "4q",
        ],
        &[
            "bench",
            "throughput",
            "--component",
            "sim:ssd:64M",
            "--op",
            "read",
            "--bs",
            "100",
        ],
        &[
            "bench",
            "throughput",
            "--component",
            "sim:ssd:64M",
            "--op",
            "read",
            "--bs",
            "4k",
            "--seconds",
            "-1",
        ],
        &[
            "bench",
            "throughput",
            "--component",
            "sim:nope:64M",
            "--op",
            "read",
            "--bs",
            "4k",
        ],
        &["bench", "--size", "3M"],
        &["bench", "--phases", "nothing"],
    ] {
        let (code, _, err) = tagstripe(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(!err.trim().is_empty(), "{args:?}");
    }
}

#[test]
fn quick_story_prints_sweep_and_summary_as_json_and_cleans_up() {
    let (code, out, err) = tagstripe(&[
        "bench",
        "--quick",
        "--json",
        "--size",
        "8M",
        "--phases",
        "sweep,bonnie",
    ]);
    assert_eq!(code, 0, "{err}");
    let j: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let sweep = j["sweep"].as_array().unwrap();
    let sizes: Vec<u64> = sweep.iter().map(|r| r["bs"].as_u64().unwrap()).collect();
    assert_eq!(sizes, (9..=20).map(|s| 1u64 << s).collect::<Vec<_>>());
    assert!(sweep.iter().all(|r| r["read_mb_s"].as_f64().unwrap() > 0.0));
    for k in [
        "block_write_mb_s",
        "rewrite_mb_s",
        "block_read_mb_s",
        "random_seeks_per_s",
    ] {
        assert!(j["bonnie"][k].as_f64().unwrap() > 0.0, "{k}");
    }
    for c in j["components"].as_array().unwrap() {
        let p = c.as_str().unwrap();
        assert!(!std::path::Path::new(p).exists(), "{p} left behind");
    }
}

#[test]
fn a_short_soak_loses_nothing_and_serves_degraded() {
    let (code, out, err) = tagstripe(&[
        "bench",
        "soak",
        "--minutes",
        "0.05",
        "--fault-rate",
        "0.02",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let j: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(j["bytes_lost"], 0);
    assert!(j["bytes_verified"].as_u64().unwrap() > 0);
    assert!(
        j["faults"].as_u64().unwrap() > 0,
        "no fault was injected: {j}"
    );
    let vols = j["volumes"].as_array().unwrap();
    let names: Vec<&str> = vols.iter().map(|v| v["volume"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["concat", "stripes", "uniform", "mirror", "nbd-mirror"]
    );
    // The NBD mirror lost a connection halfway and kept serving from the other side.
    let nbd = &vols[4];
    assert_eq!(nbd["dropped_connections"], 1);
    assert_eq!(nbd["degraded"], serde_json::json!([0]));
    assert_eq!(nbd["sectors_unavailable"], 0);
    assert!(vols.iter().all(|v| v["sectors_unnamed_errors"] == 0), "{j}");
    let (code, _, _) = tagstripe(&["bench", "soak", "--minutes", "0"]);
    assert_eq!(code, 2);
    let (code, _, _) = tagstripe(&["bench", "soak", "--fault-rate", "2"]);
    assert_eq!(code, 2);
}

#[test]
fn the_text_run_ends_with_a_summary_table() {
    let (code, out, err) = tagstripe(&["bench", "--quick", "--size", "8M", "--phases", "sweep"]);
    assert_eq!(code, 0, "{err}");
    let tail = out.rsplit("\nsummary\n").next().unwrap_or("");
    assert!(out.contains("\nsummary\n"), "{out}");
    assert!(tail.contains("sweep: best sequential"), "{tail}");
    assert!(!tail.contains("bonnie"), "only the phases that ran: {tail}");
}

/// `bench --level raid6` runs the sweep and bonnie on an md array over the components: the
/// volume is the array's size (4 members of 8 MiB, 2 data: 16 MiB), its numbers are there,
/// and a layout md does not have is refused with exit 2.
#[test]
fn the_story_runs_on_an_md_array() {
    let (code, out, err) = tagstripe(&[
        "bench", "--quick", "--json", "--size", "8M", "--phases", "bonnie", "--level", "raid6",
        "--chunk", "64",
    ]);
    assert_eq!(code, 0, "{err}");
    let j: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(j["volume_bytes"], 16u64 << 20, "{out}");
    assert!(j["bonnie"]["block_write_mb_s"].as_f64().unwrap() > 0.0);
    let (code, _, err) = tagstripe(&[
        "bench",
        "--quick",
        "--size",
        "8M",
        "--phases",
        "bonnie",
        "--level",
        "raid5",
        "--layout",
        "left-symmetric-6",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("left-symmetric-6"), "{err}");
}
