//! The NBD protocol as today's clients speak it, against `tagstripe serve`: nbdinfo sees
//! structured replies, both metadata contexts, cache, fast zero and DF; nbdinfo --map and
//! qemu-img map see the holes of a sparse striped volume; nbdcopy skips them; qemu-io moves
//! data over extended headers; a python3-libnbd model test drives every command and flag;
//! `--class-export` serves the same volume under a second name. Skips with a printed reason
//! where a tool is missing (CI installs them all).

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

#[path = "../../lib/tests/common/peers.rs"]
mod peers;
use peers::{have, scratch};
#[path = "common/serve.rs"]
mod serve;
use serve::{Serve, have_python_libnbd, qemu_io, run};

/// `n` sparse component files of `mib` MiB each.
fn sparse_files(dir: &std::path::Path, n: usize, mib: u64) -> Vec<String> {
    (0..n)
        .map(|i| {
            let p: PathBuf = dir.join(format!("c{i}.img"));
            std::fs::File::create(&p)
                .unwrap()
                .set_len(mib << 20)
                .unwrap();
            p.to_str().unwrap().to_owned()
        })
        .collect()
}

#[test]
fn nbdinfo_sees_the_modern_protocol() {
    if !have("nbdinfo") {
        return;
    }
    let dir = scratch("modern-info");
    let files = sparse_files(&dir, 2, 16);
    let mut args: Vec<&str> = vec!["--interleave", "16"];
    args.extend(files.iter().map(String::as_str));
    let s = Serve::start(&args);
    let j: serde_json::Value =
        serde_json::from_str(&run(Command::new("nbdinfo").args(["--json", &s.url]))).unwrap();
    assert_eq!(j["structured"], true, "{j}");
    let e = &j["exports"][0];
    let contexts: Vec<&str> = e["contexts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c.as_str())
        .collect();
    assert!(contexts.contains(&"base:allocation"), "{contexts:?}");
    assert!(contexts.contains(&"tagstripe:component"), "{contexts:?}");
    for can in [
        "can_cache",
        "can_fast_zero",
        "can_df",
        "can_flush",
        "can_fua",
        "can_zero",
    ] {
        assert_eq!(e[can], true, "{can}: {e}");
    }
    assert_eq!(e["export-size"], 32 << 20);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A 1 GiB volume over two sparse files with 3 MiB written: nbdinfo --map and qemu-img map
/// report the rest as holes, the component map shows the stripe, and nbdcopy of the whole
/// export reads only what is there (time and bytes the server read printed).
#[test]
fn holes_are_mapped_and_skipped() {
    if !have("nbdinfo") || !have("qemu-img") || !have("nbdcopy") {
        return;
    }
    let dir = scratch("modern-holes");
    let files = sparse_files(&dir, 2, 512);
    let mut args: Vec<&str> = vec!["--interleave", "128"];
    args.extend(files.iter().map(String::as_str));
    let s = Serve::start(&args);
    qemu_io(&s.url, &["write -P 0x5a 1M 3M".to_owned()]);

    let map = run(Command::new("nbdinfo").args(["--map", &s.url]));
    let rows: Vec<Vec<String>> = map
        .lines()
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
        .collect();
    let holes: u64 = rows
        .iter()
        .filter(|r| r.get(3).is_some_and(|t| t.contains("hole")))
        .map(|r| r[1].parse::<u64>().unwrap())
        .sum();
    let data: u64 = rows
        .iter()
        .filter(|r| r.get(3).is_some_and(|t| t == "data"))
        .map(|r| r[1].parse::<u64>().unwrap())
        .sum();
    assert_eq!(data, 3 << 20, "{map}");
    assert_eq!(holes, (1 << 30) - (3 << 20), "{map}");

    let j: serde_json::Value = serde_json::from_str(&run(Command::new("qemu-img").args([
        "map",
        "-f",
        "raw",
        "--output=json",
        &s.url,
    ])))
    .unwrap();
    let qdata: u64 = j
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["data"] == true)
        .map(|e| e["length"].as_u64().unwrap())
        .sum();
    assert_eq!(qdata, 3 << 20, "qemu-img map: {j}");

    // The stripe over the wire: 64 KiB units alternating between components 0 and 1.
    let comp = run(Command::new("nbdinfo").args(["--map=tagstripe:component", "--totals", &s.url]));
    assert!(
        comp.contains("536870912"),
        "each component holds half: {comp}"
    );

    let t = Instant::now();
    let copy = dir.join("copy.img");
    run(Command::new("nbdcopy").args([&s.url, copy.to_str().unwrap()]));
    let took = t.elapsed();
    let got = std::fs::read(&copy).unwrap();
    assert_eq!(got.len(), 1 << 30);
    assert!(got[1 << 20..4 << 20].iter().all(|&b| b == 0x5a));
    assert!(
        got[..1 << 20]
            .iter()
            .chain(&got[4 << 20..])
            .all(|&b| b == 0)
    );
    let (ok, err) = s.stop();
    assert!(ok, "{err}");
    // "... N bytes read, M bytes written": qemu-io's write, then nbdcopy's reads.
    let read: u64 = err
        .split(", ")
        .find_map(|f| f.strip_suffix(" bytes read"))
        .unwrap_or_else(|| panic!("no summary: {err}"))
        .parse()
        .unwrap();
    assert!(
        read >= 3 << 20,
        "the server read {read} bytes: less than the data"
    );
    println!(
        "nbdcopy of a 1 GiB export holding 3 MiB: {:.3} s, {:.1} MiB read by the server",
        took.as_secs_f64(),
        read as f64 / (1 << 20) as f64
    );
    assert!(
        read < 64 << 20,
        "nbdcopy read {read} bytes: the holes were not skipped"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// qemu 8.2+ negotiates extended headers; data moves over them (patterns checked), and the
/// negotiation is seen in qemu's trace.
#[test]
fn qemu_io_over_extended_headers() {
    if !have("qemu-io") {
        return;
    }
    let dir = scratch("modern-ext");
    let files = sparse_files(&dir, 2, 16);
    let mut args: Vec<&str> = vec!["--interleave", "16"];
    args.extend(files.iter().map(String::as_str));
    let s = Serve::start(&args);
    let o = Command::new("qemu-io")
        .args(["-f", "raw", "--trace", "nbd_receive_option_reply", &s.url])
        .args(["-c", "write -P 0x33 512k 2M", "-c", "read -P 0x33 512k 2M"])
        .args([
            "-c",
            "write -z 1M 64k",
            "-c",
            "read -P 0 1M 64k",
            "-c",
            "read -P 0 0 512k",
        ])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success() && !text.contains("failed"), "{text}");
    assert!(!text.contains("Pattern verification failed"), "{text}");
    let version = run(Command::new("qemu-io").arg("--version"));
    if text.contains("extended headers") {
        assert!(
            text.contains("(extended headers), type 1 (ack)"),
            "qemu asked for extended headers and did not get them: {text}"
        );
    } else {
        println!("this qemu does not ask for extended headers: {version}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every command and flag from libnbd, unaligned and huge requests included, against a byte
/// model (cli/tests/nbd_model.py).
#[test]
fn python_libnbd_model_of_every_command() {
    if !have_python_libnbd() {
        return;
    }
    let dir = scratch("modern-model");
    let files = sparse_files(&dir, 2, 48);
    let mut args: Vec<&str> = vec!["--interleave", "16", "--flavor", "freebsd", "--no-offset"];
    args.extend(files.iter().map(String::as_str));
    let s = Serve::start(&args);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/nbd_model.py");
    let size = (96u64 << 20).to_string();
    let out = run(Command::new("/usr/bin/python3").args([script, &s.url, &size, "16", "2", "7"]));
    println!("{out}");
    assert!(out.contains("model ok"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--class-export backup:bulk` serves the same volume under a second name: what one export
/// writes the other reads, and both are listed.
#[test]
fn class_export_is_the_same_volume() {
    if !have("qemu-io") || !have("nbdinfo") {
        return;
    }
    let dir = scratch("modern-class");
    let files = sparse_files(&dir, 2, 16);
    let mut args: Vec<&str> = vec!["--class-export", "backup:bulk"];
    args.extend(files.iter().map(String::as_str));
    let s = Serve::start(&args);
    let backup = s.url.replace("/vol", "/backup");
    qemu_io(&s.url, &["write -P 0x71 0 1M".to_owned()]);
    qemu_io(
        &backup,
        &[
            "read -P 0x71 0 1M".to_owned(),
            "write -P 0x72 1M 1M".to_owned(),
        ],
    );
    qemu_io(&s.url, &["read -P 0x72 1M 1M".to_owned()]);
    let list = run(Command::new("nbdinfo").args(["--list", &s.url]));
    assert!(list.contains("backup") && list.contains("vol"), "{list}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// An export name with a space, a slash, a `?` and a non-ASCII letter, on TCP and on a Unix
/// socket whose path has a space: `serve` prints its URL percent-encoded (the NBD URI
/// document's rule), and libnbd, qemu and tagstripe's own client all reach the export
/// through it.
#[test]
fn export_names_in_urls_are_percent_encoded() {
    if !have("qemu-io") || !have("nbdinfo") {
        return;
    }
    let dir = scratch("modern-uri");
    let files = sparse_files(&dir, 1, 16);
    let name = "my disk/ä?";
    let sock = dir.join("a socket");
    let tcp = Serve::start_export("127.0.0.1:0", name, &[&files[0]]);
    let unix = Serve::start_export(&format!("unix:{}", sock.display()), name, &[&files[0]]);
    assert!(tcp.url.ends_with("/my%20disk/%C3%A4%3F"), "{}", tcp.url);
    assert!(
        unix.url
            .starts_with("nbd+unix:///my%20disk/%C3%A4%3F?socket=")
            && unix.url.ends_with("/a%20socket"),
        "{}",
        unix.url
    );
    for url in [&tcp.url, &unix.url] {
        let j: serde_json::Value =
            serde_json::from_str(&run(Command::new("nbdinfo").args(["--json", url]))).unwrap();
        assert_eq!(j["exports"][0]["export-name"], name, "{url}");
        qemu_io(
            url,
            &[
                "write -P 0x5e 0 64k".to_owned(),
                "read -P 0x5e 0 64k".to_owned(),
            ],
        );
        let info = run(Command::new(env!("CARGO_BIN_EXE_tagstripe")).args(["info", url]));
        assert!(
            info.contains("16 MiB") || info.contains("32768 sectors"),
            "{info}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
