//! `serve --tenant`: every refusal names what is wrong before anything listens; a tenant's
//! export serves the volume, through NBD clients, and its figures are printed at exit and on
//! SIGUSR1.

use std::process::Command;

#[path = "../../lib/tests/common/peers.rs"]
mod peers;
use peers::{have, scratch};
#[path = "common/serve.rs"]
mod serve;
use serve::{Serve, blank, qemu_io, run};

#[test]
fn bad_tenant_specs_are_refused_before_listening_naming_the_key() {
    let dir = scratch("tenant-bad");
    let disk = blank(&dir, "disk.img", 4 << 20);
    for (spec, want) in [
        ("a:colour=red", "unknown key \"colour\""),
        ("a:weight=0", "weight=\"0\" must be 1-10000"),
        ("a:weight=lots", "weight=\"lots\""),
        (
            "a:reserve-iops=500,limit-iops=100",
            "reservation 500 is above the limit 100",
        ),
        ("a:limit-mbs=-3", "limit-mbs=\"-3\""),
        ("a:class=urgent", "class=\"urgent\""),
        ("a:weight", "is not KEY=VALUE"),
        (":weight=3", "name is empty"),
        ("disk", "a name already exported"),
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_tagstripe"))
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--export",
                "disk",
                "--tenant",
                spec,
            ])
            .arg(&disk)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{spec}: {err}");
        assert!(err.contains(want), "{spec}: {err}");
        assert!(o.stdout.is_empty(), "{spec}: listened before refusing");
    }
    let o = Command::new(env!("CARGO_BIN_EXE_tagstripe"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--tenant",
            "a",
            "--tenant",
            "a:weight=2",
        ])
        .arg(&disk)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--tenant a: a name already exported"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_tenant_export_serves_the_volume_and_reports_its_figures() {
    if !have("qemu-io") {
        return;
    }
    let dir = scratch("tenant-serve");
    let disk = blank(&dir, "disk.img", 8 << 20);
    let mut s = Serve::start(&[
        "--tenant",
        "db:weight=300,class=interactive",
        "--tenant",
        "backup:weight=1,limit-mbs=20,class=bulk",
        "--class-export",
        "scan:idle",
        disk.to_str().unwrap(),
    ]);
    let backup = s.url.replace("/vol", "/backup");
    let db = s.url.replace("/vol", "/db");
    qemu_io(&db, &["write -P 0x3c 0 1M".into()]);
    qemu_io(&backup, &["read -P 0x3c 0 1M".into()]);
    qemu_io(&s.url, &["read -P 0x3c 512k 512k".into()]);
    // SIGUSR1: the figures now, and serving goes on.
    Command::new("kill")
        .args(["-USR1", &s.child.id().to_string()])
        .status()
        .unwrap();
    let line = s.wait_err("tenant backup:");
    assert!(
        line.contains("weight 1") && line.contains("limit 20 MB/s"),
        "{line}"
    );
    qemu_io(&s.url, &["read -P 0x3c 0 4k".into()]);
    let (ok, err) = s.stop();
    assert!(ok, "{err}");
    for name in ["vol", "scan", "db", "backup"] {
        assert!(err.contains(&format!("tenant {name}: ")), "{name}: {err}");
    }
    assert!(err.contains("requests at the device at most now"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Without tenants SIGUSR1 is not fatal (its default action): the server says its figures
/// so far and goes on serving.
#[test]
fn sigusr1_without_tenants_reports_and_serving_goes_on() {
    if !have("qemu-io") {
        return;
    }
    let dir = scratch("usr1-plain");
    let disk = blank(&dir, "disk.img", 4 << 20);
    let mut s = Serve::start(&[disk.to_str().unwrap()]);
    qemu_io(&s.url, &["write -P 0x5a 0 64k".into()]);
    Command::new("kill")
        .args(["-USR1", &s.child.id().to_string()])
        .status()
        .unwrap();
    let line = s.wait_err("so far:");
    assert!(line.contains("bytes written"), "{line}");
    qemu_io(&s.url, &["read -P 0x5a 0 64k".into()]);
    let (ok, err) = s.stop();
    assert!(ok, "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `bench tenants --sim --json` on the disk models: the same seed gives the same report
/// (a paused clock), and the story's goals are met: the database alone as a tenant at 0.9x
/// or more of no tenants, the backup alone at its limit, the database and the backup split
/// by weight 3:1 and the backup within its limit beside it, the VM's reservation met and
/// its p99 within 4x of alone.
#[test]
fn bench_tenants_on_the_disk_models_is_deterministic_and_meets_its_goals() {
    let run = |profile: &str| {
        let o = Command::new(env!("CARGO_BIN_EXE_tagstripe"))
            .args(["bench", "tenants", "--sim", "--json", "--profile", profile])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    };
    for profile in ["hdd-modern", "hdd-1998"] {
        let a = run(profile);
        assert_eq!(a, run(profile), "{profile}: two runs differ");
        let v: serde_json::Value = serde_json::from_str(&a).unwrap();
        assert_eq!(v["mode"], "sim");
        assert_eq!(v["runs"].as_array().unwrap().len(), 7, "{v}");
        let goals = v["goals"].as_array().unwrap();
        assert_eq!(goals.len(), 8, "{v}");
        for g in goals {
            assert_eq!(g["met"], true, "{profile}: {g}");
        }
        assert_eq!(v["met"], true);
        // The backup's limit held it back, and the VM was served to meet its reservation.
        let row = |run: &str, t: &str| {
            v["runs"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["run"] == run)
                .and_then(|r| {
                    r["tenants"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .find(|x| x["tenant"] == t)
                })
                .cloned()
                .unwrap()
        };
        assert!(
            row("backup alone, a tenant", "backup")["held_s"]
                .as_f64()
                .unwrap()
                > 1.0
        );
        assert!(row("vm, db and backup", "vm")["reserved"].as_u64().unwrap() > 0);
    }
}

#[test]
fn bench_tenants_refuses_bad_numbers() {
    for arg in [
        "--seconds=0",
        "--vm-reserve-iops=-5",
        "--backup-limit-mbs=nan",
        "--profile=floppy",
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_tagstripe"))
            .args(["bench", "tenants", "--sim", arg])
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{arg}");
        let err = String::from_utf8_lossy(&o.stderr);
        let flag = arg.split('=').next().unwrap();
        assert!(err.contains(flag), "{arg}: {err}");
    }
}

/// One component shared by exports of two classes goes through the tagged queue and the
/// quirk split (so the interactive export is served ahead of the bulk one), and is still the
/// image as it is: the same size to the byte (no stripe geometry, no offset), sector 0 the
/// image's, what one export writes the other reads, its last sectors included.
#[test]
fn one_component_shared_by_two_classes_is_the_image_as_it_is() {
    if !have("qemu-io") || !have("nbdinfo") {
        return;
    }
    let dir = scratch("shared-one");
    let bytes = (5 << 20) + 4096;
    let disk = blank(&dir, "disk.img", bytes);
    let s = Serve::start(&[
        "--class-export",
        "reader:interactive",
        "--class-export",
        "backup:bulk",
        disk.to_str().unwrap(),
    ]);
    let (reader, backup) = (
        s.url.replace("/vol", "/reader"),
        s.url.replace("/vol", "/backup"),
    );
    for url in [&s.url, &reader, &backup] {
        let size = run(Command::new("nbdinfo").args(["--size", url]));
        assert_eq!(size.trim(), bytes.to_string(), "{url}");
    }
    qemu_io(
        &backup,
        &[
            "write -P 0x5e 0 2M".into(),
            format!("write -P 0x6f {} 4k", bytes - 4096),
        ],
    );
    qemu_io(
        &reader,
        &[
            "read -P 0x5e 0 2M".into(),
            format!("read -P 0x6f {} 4k", bytes - 4096),
        ],
    );
    let (ok, err) = s.stop();
    assert!(ok, "{err}");
    let image = std::fs::read(&disk).unwrap();
    assert!(
        image[..2 << 20].iter().all(|&b| b == 0x5e),
        "the image's own sector 0 on"
    );
    assert!(image[image.len() - 4096..].iter().all(|&b| b == 0x6f));
    let _ = std::fs::remove_dir_all(&dir);
}
