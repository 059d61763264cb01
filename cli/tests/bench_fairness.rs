//! `tagstripe bench fairness --sim --json`: the contract of the scheduler issue.

use std::process::Command;

use serde_json::Value;

#[test]
fn fairness_sim_json_has_every_baseline() {
    let out = Command::new(env!("CARGO_BIN_EXE_tagstripe"))
        .args([
            "bench",
            "fairness",
            "--sim",
            "--profile",
            "hdd-1998",
            "--seconds",
            "20",
            "--seed",
            "3",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["profile"], "hdd-1998");
    assert_eq!(v["seconds"], 20);
    assert_eq!(v["seed"], 3);
    for k in ["p50_ms", "p99_ms", "max_ms", "chain_ms"] {
        assert!(v["unloaded"][k].as_f64().unwrap() > 0.0, "unloaded.{k}");
    }
    let names: Vec<&str> = v["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["scheduler"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["fifo", "cam1998", "maxtags2", "deadline", "tagstripe"]
    );
    for r in v["runs"].as_array().unwrap() {
        for k in ["p50_ms", "p99_ms", "max_ms"] {
            assert!(r["interactive"][k].is_number());
        }
        assert!(
            r["chain_p99_ms"].is_number()
                && r["bulk_mb_s"].as_f64().unwrap() > 0.0
                && r["bulk_idle_mb_s"].as_f64().unwrap() > 0.0
        );
    }
    let fifo = &v["runs"][0]["interactive"]["p99_ms"];
    let ours = &v["runs"][4]["interactive"]["p99_ms"];
    assert!(
        ours.as_f64().unwrap() * 10.0 < fifo.as_f64().unwrap(),
        "tagstripe {ours} vs fifo {fifo}"
    );
}

#[test]
fn fairness_bad_options_exit_2() {
    for bad in [
        vec!["bench", "fairness", "--sim", "--profile", "floppy"],
        vec!["bench", "fairness", "--sim", "--seconds", "1"],
        vec!["bench", "fairness", "--live-seconds", "0"],
        vec!["bench", "fairness", "--component", "sim:floppy:1M"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_tagstripe"))
            .args(&bad)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        assert!(!out.stderr.is_empty(), "{bad:?}");
    }
}

#[test]
fn fairness_live_on_a_volume() {
    let out = Command::new(env!("CARGO_BIN_EXE_tagstripe"))
        .args([
            "bench",
            "fairness",
            "--component",
            "sim:ssd:64M",
            "--component",
            "sim:ssd:64M",
            "--live-seconds",
            "1.5",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let runs: Vec<&str> = v["live"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run"].as_str().unwrap())
        .collect();
    assert_eq!(
        runs,
        [
            "reader alone",
            "fairness off (no queue)",
            "fairness on (tagstripe)"
        ]
    );
    for r in v["live"].as_array().unwrap() {
        assert!(r["interactive"]["reads"].as_u64().unwrap() > 0, "{r}");
        // One p99 per slice, none above the whole run's maximum.
        let slices = r["interactive"]["slice_p99_ms"].as_array().unwrap();
        assert_eq!(slices.len(), 2, "{r}");
        let max = r["interactive"]["max_ms"].as_f64().unwrap();
        assert!(slices.iter().all(|p| p.as_f64().unwrap() <= max), "{r}");
    }
    assert!(v["live"][2]["bulk_mb_s"].as_f64().unwrap() > 0.0);
    // 1.5 s a run: two interleaved slices each.
    assert_eq!(v["slices"], 2, "{v}");
    assert_eq!(v["seconds"], 1.5, "{v}");
    // Each component's largest request, as its limits say (a simulated SSD's 4 MiB default
    // cap, Linux's BLK_DEF_MAX_SECTORS_CAP).
    assert_eq!(v["max_request_kib"], serde_json::json!([4096, 4096]), "{v}");
}
