//! md arrays from the shell: `serve --level` over plain files, `serve --md` over members
//! laid out by hand from md's superblock format (and, where the md driver exists, over
//! members `mdadm --create` made), read and written by qemu-io, and `info` on a member.

use std::path::{Path, PathBuf};
use std::process::Command;

use tagstripe_striping::md::{ParityLayout, Superblock1};

#[path = "../../lib/tests/common/peers.rs"]
mod peers;
use peers::{have, scratch};
#[path = "common/serve.rs"]
mod serve;
use serve::{Serve, blank, qemu_io, run};

const CHUNK: u64 = 128;
const OFFSET: u64 = 2048;
const SIZE: u64 = 8192; // each member's data sectors

/// Four raid5 members as files: md 1.2 superblocks at sector 8, data from sector 2048.
fn members(dir: &Path, events: &[u64]) -> Vec<PathBuf> {
    (0..4)
        .map(|i| {
            let p = blank(dir, &format!("sd{i}.img"), (OFFSET + SIZE) * 512);
            write_superblock(&p, i, events[i]);
            p
        })
        .collect()
}

fn write_superblock(p: &Path, role: usize, events: u64) {
    write_superblock_faulty(p, role, events, None);
}

/// As [`write_superblock`], recording member `faulty` as md records a failed one.
fn write_superblock_faulty(p: &Path, role: usize, events: u64, faulty: Option<usize>) {
    use std::os::unix::fs::FileExt;
    let sb = Superblock1 {
        feature_map: 0,
        set_uuid: [0x42; 16],
        set_name: "lab:md5".into(),
        level: 5,
        layout: ParityLayout::LeftSymmetric.md_algorithm(),
        size: SIZE,
        chunk: CHUNK as u32,
        raid_disks: 4,
        data_offset: OFFSET,
        data_size: SIZE,
        super_offset: 8,
        dev_number: role as u32,
        events,
        resync_offset: u64::MAX,
        recovery_offset: 0,
        dev_roles: (0..4u16)
            .map(|r| {
                if Some(usize::from(r)) == faulty {
                    tagstripe_striping::md::ROLE_FAULTY
                } else {
                    r
                }
            })
            .collect(),
    };
    let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
    f.write_all_at(&sb.encode(), 8 * 512).unwrap();
}

fn paths(v: &[PathBuf]) -> Vec<&str> {
    v.iter().map(|p| p.to_str().unwrap()).collect()
}

/// Written through `serve --level raid5 --reserved 2048` (the layout md would use), the
/// members then assemble from their superblocks with `serve --md`, in another order, and read
/// back the same bytes; with a member missing, or one behind on events, they still do.
#[test]
fn serve_md_assembles_members_laid_out_by_hand() {
    if !have("qemu-io") {
        return;
    }
    let dir = scratch("md-by-hand");
    let files = members(&dir, &[5, 5, 5, 5]);
    let mut args = vec!["--level", "raid5", "--chunk", "128", "--reserved", "2048"];
    args.extend(paths(&files));
    let s = Serve::start(&args);
    assert!(s.out[2].contains("md array over 4 members"), "{:?}", s.out);
    qemu_io(
        &s.url,
        &["write -P 0x6d 0 3M".into(), "write -P 0x17 5M 700k".into()],
    );
    let (ok, err) = s.stop();
    assert!(ok, "{err}");

    let reads = [
        "read -P 0x6d 0 3M".to_owned(),
        "read -P 0x17 5M 700k".to_owned(),
    ];
    let shuffled = [&files[2], &files[0], &files[3], &files[1]];
    let mut args = vec!["--md", "--read-only"];
    args.extend(shuffled.iter().map(|p| p.to_str().unwrap()));
    let s = Serve::start(&args);
    let text = run(Command::new("qemu-io")
        .args(["-r", "-f", "raw", &s.url])
        .args(reads.iter().flat_map(|r| ["-c", r.as_str()])));
    assert!(!text.contains("Pattern verification failed"), "{text}");
    drop(s);

    // Member 1 missing: degraded, same bytes.
    let mut args = vec!["--md", "--read-only"];
    args.extend([&files[0], &files[2], &files[3]].map(|p| p.to_str().unwrap()));
    let mut s = Serve::start(&args);
    let text = run(Command::new("qemu-io")
        .args(["-r", "-f", "raw", &s.url])
        .args(reads.iter().flat_map(|r| ["-c", r.as_str()])));
    assert!(!text.contains("Pattern verification failed"), "{text}");
    let said = s.wait_err("degraded");
    assert!(said.contains("[1]"), "{said}");
    drop(s);

    // Member 3 failed (the others record it faulty, an event on) and garbage in its data:
    // left out.
    for (i, f) in files.iter().enumerate() {
        if i == 3 {
            write_superblock(f, i, 5);
        } else {
            write_superblock_faulty(f, i, 6, Some(3));
        }
    }
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&files[3])
            .unwrap();
        f.write_all_at(&vec![0xee; 1 << 20], OFFSET * 512).unwrap();
    }
    let mut args = vec!["--md", "--read-only"];
    args.extend(paths(&files));
    let s = Serve::start(&args);
    let text = run(Command::new("qemu-io")
        .args(["-r", "-f", "raw", &s.url])
        .args(reads.iter().flat_map(|r| ["-c", r.as_str()])));
    assert!(!text.contains("Pattern verification failed"), "{text}");
    drop(s);

    // `info` reads a member's superblock.
    let out = run(Command::new(env!("CARGO_BIN_EXE_tagstripe")).args([
        "info",
        "--json",
        files[2].to_str().unwrap(),
    ]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["md"]["level"], 5, "{out}");
    assert_eq!(v["md"]["layout"], "left-symmetric");
    assert_eq!(v["md"]["role"], 2);
    assert_eq!(v["md"]["data_offset"], OFFSET);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `serve --md` refuses a set with too many members gone, and a file that is no member,
/// before listening, with the reason.
#[test]
fn serve_md_refusals() {
    let dir = scratch("md-refusals");
    let files = members(&dir, &[5, 5, 5, 5]);
    let plain = blank(&dir, "plain.img", 1 << 20);
    for set in [
        vec![files[0].to_str().unwrap(), files[1].to_str().unwrap()],
        vec![files[0].to_str().unwrap(), plain.to_str().unwrap()],
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_tagstripe"))
            .args(["serve", "--listen", "127.0.0.1:0", "--md"])
            .args(&set)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(
            err.contains("redundancy") || err.contains("md superblock"),
            "{err}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Members made by `mdadm --create` on loop devices, written through the kernel's md
/// driver, then served by `serve --md` with the array stopped: the same bytes. Needs root,
/// mdadm and the md driver (`/proc/mdstat`); skips with the reason where absent.
#[test]
fn serve_md_reads_what_the_md_driver_wrote() {
    if !have("mdadm") || !have("qemu-io") {
        eprintln!("skipping: mdadm or qemu-io missing (Debian: mdadm, qemu-utils)");
        return;
    }
    if !Path::new("/proc/mdstat").exists() {
        eprintln!(
            "skipping: this kernel has no md driver (/proc/mdstat is absent), so mdadm cannot create an array"
        );
        return;
    }
    let dir = scratch("md-mdadm");
    let mut loops = Vec::new();
    for i in 0..4 {
        let f = blank(&dir, &format!("l{i}.img"), 64 << 20);
        let dev = run(Command::new("losetup").args(["--find", "--show"]).arg(&f));
        loops.push(dev.trim().to_owned());
    }
    let md = "/dev/md/tagstripe-test";
    let created = Command::new("mdadm")
        .args([
            "--create",
            md,
            "--run",
            "--assume-clean",
            "--metadata=1.2",
            "--level=5",
            "--raid-devices=4",
            "--chunk=64",
            "--layout=left-symmetric",
        ])
        .args(&loops)
        .output()
        .unwrap();
    if !created.status.success() {
        eprintln!(
            "skipping: mdadm --create failed here: {}",
            String::from_utf8_lossy(&created.stderr)
        );
        for l in &loops {
            let _ = Command::new("losetup").args(["-d", l]).status();
        }
        return;
    }
    run(Command::new("qemu-io").args(["-f", "raw", md, "-c", "write -P 0x3e 0 4M"]));
    run(Command::new("mdadm").args(["--stop", md]));
    let mut args = vec!["--md", "--read-only"];
    args.extend(loops.iter().map(String::as_str));
    let s = Serve::start(&args);
    qemu_io(&s.url, &["read -P 0x3e 0 4M".into()]);
    drop(s);
    for l in &loops {
        let _ = Command::new("mdadm")
            .args(["--zero-superblock", l])
            .status();
        let _ = Command::new("losetup").args(["-d", l]).status();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `serve --md --add NEW`: a blank device takes a missing member's place and is rebuilt
/// online; afterwards it is a member of its own (its superblock written), and the array
/// read without another member gives the same bytes. `--add` with nothing to replace is
/// refused.
#[test]
fn serve_md_add_rebuilds_a_new_member_in_place_of_a_missing_one() {
    if !have("qemu-io") {
        return;
    }
    let dir = scratch("md-add");
    let files = members(&dir, &[5, 5, 5, 5]);
    let mut args = vec!["--level", "raid5", "--chunk", "128", "--reserved", "2048"];
    args.extend(paths(&files));
    let s = Serve::start(&args);
    qemu_io(
        &s.url,
        &["write -P 0x5e 0 2M".into(), "write -P 0x21 4M 1M".into()],
    );
    let (ok, err) = s.stop();
    assert!(ok, "{err}");

    let new = blank(&dir, "new.img", (OFFSET + SIZE) * 512);
    let mut s = Serve::start(&[
        "--md",
        files[0].to_str().unwrap(),
        files[2].to_str().unwrap(),
        files[3].to_str().unwrap(),
        "--add",
        new.to_str().unwrap(),
    ]);
    let said = s.wait_err("in sync");
    assert!(said.contains("member 1"), "{said}");
    let (ok, err) = s.stop();
    assert!(ok && err.contains("added in place of member 1"), "{err}");

    // The new member serves in member 1's role, member 0 left out.
    let s = Serve::start(&[
        "--md",
        "--read-only",
        new.to_str().unwrap(),
        files[2].to_str().unwrap(),
        files[3].to_str().unwrap(),
    ]);
    let text = run(Command::new("qemu-io")
        .args(["-r", "-f", "raw", &s.url])
        .args(["-c", "read -P 0x5e 0 2M", "-c", "read -P 0x21 4M 1M"]));
    assert!(!text.contains("Pattern verification failed"), "{text}");
    drop(s);

    // Nothing missing: --add is refused before listening.
    let mut args = vec!["serve", "--listen", "127.0.0.1:0", "--md"];
    args.extend(paths(&files));
    args.extend(["--add", new.to_str().unwrap()]);
    let o = Command::new(env!("CARGO_BIN_EXE_tagstripe"))
        .args(&args)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--add") && err.contains("0 missing or failed"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
