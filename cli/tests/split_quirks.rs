//! `tagstripe split` and `tagstripe quirks` from the shell: the JSON contract and errors.

use std::process::{Command, Output};

use serde_json::Value;

fn tagstripe(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tagstripe"))
        .args(args)
        .output()
        .expect("run tagstripe")
}

fn json(args: &[&str]) -> Value {
    let out = tagstripe(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("json")
}

fn sizes(v: &Value) -> Vec<u64> {
    v["pieces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["sectors"].as_u64().unwrap())
        .collect()
}

#[test]
fn split_json_for_a_listed_seagate_drive() {
    let base = [
        "split",
        "--json",
        "--start",
        "0",
        "--sectors",
        "2576",
        "--max-sectors",
        "2560",
        "--device",
        "ATA|ST380023AS|3.01",
    ];
    let linux = json(&base);
    assert_eq!(linux["mod15write"], "cap15");
    assert_eq!(
        linux["quirks"][0]["source"],
        "linux:drivers/ata/sata_sil.c:sil_quirks"
    );
    let s = sizes(&linux);
    assert_eq!(s.len(), 172);
    assert!(s.iter().all(|&n| n <= 15));
    let smart = json(&[&base[..], &["--mod15write", "smart"]].concat());
    assert_eq!(sizes(&smart), [2559, 17]);
    assert_eq!(smart["limits"]["max_sectors"], 2560);
    let starts: Vec<u64> = smart["pieces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["start"].as_u64().unwrap())
        .collect();
    assert_eq!(starts, [0, 2559]);
}

#[test]
fn split_json_worked_examples() {
    let v = json(&[
        "split",
        "--json",
        "--start",
        "3",
        "--sectors",
        "6000",
        "--pbs",
        "4096",
        "--max-sectors",
        "2560",
    ]);
    assert_eq!(sizes(&v), [2557, 2560, 883]);
    assert_eq!(v["limits"]["physical_block_size"], 4096);
    assert_eq!(v["quirks"].as_array().unwrap().len(), 0);
    let v = json(&[
        "split",
        "--json",
        "--start",
        "90",
        "--sectors",
        "200",
        "--chunk-sectors",
        "96",
    ]);
    assert_eq!(sizes(&v), [6, 96, 96, 2]);
    let v = json(&[
        "split",
        "--json",
        "--op",
        "discard",
        "--start",
        "3",
        "--sectors",
        "5000",
        "--max-discard-sectors",
        "1000",
        "--discard-granularity",
        "4096",
    ]);
    assert_eq!(sizes(&v), [997, 1000, 1000, 1000, 1000, 3]);
    let v = json(&[
        "split",
        "--json",
        "--start",
        "0",
        "--sectors",
        "264",
        "--max-segments",
        "1",
        "--seg-boundary-mask",
        "0xffff",
        "--segments",
        "0xf000:135168",
    ]);
    assert_eq!(sizes(&v), [8, 128, 128]);
    let v = json(&[
        "split",
        "--json",
        "--start",
        "0",
        "--sectors",
        "100",
        "--max-sec",
        "15",
    ]);
    assert_eq!(v["limits"]["max_hw_sectors"], 15);
    assert!(sizes(&v).iter().all(|&n| n <= 15));
}

#[test]
fn split_refuses_bad_input_with_exit_2() {
    let out = tagstripe(&[
        "split",
        "--json",
        "--start",
        "3",
        "--sectors",
        "8",
        "--lbs",
        "4096",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["error"]["kind"], "misaligned");
    for bad in [
        vec!["split", "--start", "0", "--sectors", "8", "--lbs", "1000"],
        vec!["split", "--start", "0", "--sectors", "8", "--op", "discard"],
        vec![
            "split",
            "--start",
            "0",
            "--sectors",
            "8",
            "--mod15write",
            "sometimes",
        ],
        vec!["split", "--start", "-1", "--sectors", "8"],
        vec![
            "split",
            "--start",
            "0",
            "--sectors",
            "8",
            "--segments",
            "0:100",
        ],
        vec![
            "split",
            "--start",
            "0",
            "--sectors",
            "8",
            "--force",
            "*:max_sec=abc",
        ],
    ] {
        let out = tagstripe(&bad);
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        assert!(!out.stderr.is_empty(), "{bad:?} gave no message");
    }
}

#[test]
fn quirks_lists_rows_with_sources() {
    let all = json(&["quirks", "--json", "--all"]);
    let rows = all["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 112);
    assert!(
        rows.iter()
            .all(|r| !r["source"].as_str().unwrap().is_empty())
    );
    let enabled = json(&["quirks", "--json"]);
    assert!(enabled["rows"].as_array().unwrap().len() < 112);
}

#[test]
fn quirks_match_shows_layers_and_why() {
    let dir = std::env::temp_dir().join(format!("tagstripe-quirks-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("site.toml");
    std::fs::write(
        &file,
        "[[quirk]]\nvendor = \"SEAGATE\"\nmodel = \"ST3*\"\nmax_sec = 512\nsource = \"site lab\"\n",
    )
    .unwrap();
    let v = json(&[
        "quirks",
        "--json",
        "--match",
        "SEAGATE|ST34520N|1444",
        "--file",
        file.to_str().unwrap(),
        "--force",
        "*:max_tags=1",
    ]);
    let layers: Vec<&str> = v["matches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["layer"].as_str().unwrap())
        .collect();
    assert_eq!(layers, ["builtin", "file", "force"]);
    assert_eq!(
        v["matches"][0]["source"],
        "freebsd:sys/cam/scsi/scsi_xpt.c:scsi_quirk_table"
    );
    assert_eq!(v["matches"][1]["source"], "site lab");
    assert_eq!(v["settings"], "max_sec=512,max_tags=1,min_tags=2");
    std::fs::write(&file, "[[quirk]]\nmodel = \"X\"\nmax_sek = 1\n").unwrap();
    let out = tagstripe(&[
        "quirks",
        "--json",
        "--match",
        "A|B|C",
        "--file",
        file.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        v["error"]["message"].as_str().unwrap().contains("line 3"),
        "{v}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
