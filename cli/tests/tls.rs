//! NBD over TLS against real peers: `tagstripe serve --tls require --tls-verify-peer` read
//! and written by qemu-io (`tls-creds-x509`), nbdinfo and python3-libnbd (`nbds://`); plain
//! clients, clients without a certificate and clients of another CA refused with nothing
//! of the export shown, the server serving on; nothing but STARTTLS answered before TLS; a
//! volume over two `nbdkit --tls=require --tls-verify-peer` exports and a `qemu-nbd
//! --tls-creds` export given as `nbds://` components. Certificates are made by the tests.
//! Skips with a printed reason where a tool is missing (CI installs them all).

use std::io::{Read, Write};
use std::process::Command;

use tagstripe_nbd_proto::proto;

#[path = "../../lib/tests/common/peers.rs"]
mod peers;
use peers::{Peer, free_port, have, have_from, nbdkit, qemu_nbd_with, scratch};
#[path = "../../lib/tests/common/certs.rs"]
mod certs;
#[path = "common/serve.rs"]
mod serve;
use serve::{Serve, have_python_libnbd};

fn out(cmd: &mut Command) -> (bool, String) {
    let o = cmd.output().unwrap();
    (
        o.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

fn qemu_io_tls(port: &str, dir: &std::path::Path, export: &str, cmds: &[&str]) -> (bool, String) {
    let mut c = Command::new("qemu-io");
    c.arg("--object")
        .arg(format!("tls-creds-x509,id=tls0,endpoint=client,dir={}", dir.display()))
        .arg("--image-opts")
        .arg(format!(
            "driver=nbd,server.type=inet,server.host=127.0.0.1,server.port={port},export={export},tls-creds=tls0"
        ));
    for cmd in cmds {
        c.arg("-c").arg(cmd);
    }
    let (ok, text) = out(&mut c);
    (
        ok && !text.contains("failed") && !text.contains("Pattern verification"),
        text,
    )
}

/// Reads one option reply from a raw connection.
fn option_reply(s: &mut std::net::TcpStream) -> (u32, Vec<u8>) {
    let mut h = [0u8; proto::OptionReply::LEN];
    s.read_exact(&mut h).unwrap();
    let r = proto::OptionReply::parse(&h).unwrap();
    let mut d = vec![0u8; r.length as usize];
    s.read_exact(&mut d).unwrap();
    (r.reply, d)
}

#[test]
fn serve_requires_tls_and_verifies_peers() {
    if !have("qemu-io") || !have("nbdinfo") {
        return;
    }
    let dir = scratch("tls-serve");
    let pki = certs::make(&dir.join("pki"));
    let img = dir.join("disk.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let s = Serve::start(&[
        "--tls",
        "require",
        "--tls-certificates",
        pki.server.to_str().unwrap(),
        "--tls-verify-peer",
        img.to_str().unwrap(),
    ]);
    let hostport = s
        .url
        .trim_start_matches("nbd://")
        .trim_end_matches("/vol")
        .to_owned();
    let port = hostport.rsplit_once(':').unwrap().1.to_owned();
    let nbds =
        |d: &std::path::Path| format!("nbds://{hostport}/vol?tls-certificates={}", d.display());

    // qemu-io with a client certificate: writes and reads back.
    let (ok, text) = qemu_io_tls(
        &port,
        &pki.client,
        "vol",
        &["write -P 0x61 0 1M", "read -P 0x61 0 1M"],
    );
    assert!(ok, "qemu-io over TLS: {text}");
    // nbdinfo sees TLS and the export.
    let (ok, text) = out(Command::new("nbdinfo").args(["--json", &nbds(&pki.client)]));
    assert!(
        ok && text.contains("\"TLS\": true") && text.contains("16777216"),
        "{text}"
    );
    // libnbd reads what qemu wrote and writes more.
    if have_python_libnbd() {
        let script = r#"
import sys, nbd
h = nbd.NBD()
h.set_uri_allow_local_file(True)
h.connect_uri(sys.argv[1])
assert h.pread(1 << 20, 0) == b"\x61" * (1 << 20)
h.pwrite(b"\x62" * 65536, 1 << 20)
h.flush()
h.shutdown()
print("libnbd tls ok")
"#;
        let (ok, text) =
            out(Command::new("/usr/bin/python3").args(["-c", script, &nbds(&pki.client)]));
        assert!(ok && text.contains("libnbd tls ok"), "{text}");
    }

    // Refused, and shown nothing of the export: a plain client, one with no certificate,
    // one whose certificate another CA signed, qemu without TLS.
    for (who, url) in [
        ("plain", s.url.clone()),
        ("no certificate", nbds(&pki.anonymous)),
        ("another CA", nbds(&pki.stranger)),
    ] {
        let (ok, text) = out(Command::new("nbdinfo").args(["--json", &url]));
        assert!(!ok, "{who}: nbdinfo succeeded: {text}");
        assert!(
            !text.contains("16777216") && !text.contains("export-size"),
            "{who}: {text}"
        );
    }
    let (ok, text) = out(Command::new("qemu-io").args(["-f", "raw", &s.url, "-c", "read 0 4k"]));
    assert!(!ok || text.contains("failed"), "plain qemu-io: {text}");
    let (ok, text) = qemu_io_tls(&port, &pki.stranger, "vol", &["read 0 4k"]);
    assert!(!ok, "qemu-io with another CA's certificate: {text}");

    // Before TLS only STARTTLS and ABORT are answered: LIST and GO get TLS_REQD with no
    // data; EXPORT_NAME (which cannot be refused) closes the connection.
    let mut raw = std::net::TcpStream::connect(&hostport).unwrap();
    let mut hello = [0u8; 18];
    raw.read_exact(&mut hello).unwrap();
    raw.write_all(&proto::FLAG_C_FIXED_NEWSTYLE.to_be_bytes())
        .unwrap();
    raw.write_all(
        &proto::OptionHeader {
            option: proto::OPT_LIST,
            length: 0,
        }
        .encode(),
    )
    .unwrap();
    let (rep, _) = option_reply(&mut raw);
    assert_eq!(rep, proto::REP_ERR_TLS_REQD);
    let go = proto::InfoRequest {
        name: "vol".to_owned(),
        requests: vec![],
    }
    .encode();
    raw.write_all(
        &proto::OptionHeader {
            option: proto::OPT_GO,
            length: go.len() as u32,
        }
        .encode(),
    )
    .unwrap();
    raw.write_all(&go).unwrap();
    let (rep, _) = option_reply(&mut raw);
    assert_eq!(rep, proto::REP_ERR_TLS_REQD, "GO before TLS");
    raw.write_all(
        &proto::OptionHeader {
            option: proto::OPT_EXPORT_NAME,
            length: 3,
        }
        .encode(),
    )
    .unwrap();
    raw.write_all(b"vol").unwrap();
    let mut rest = Vec::new();
    let _ = raw.read_to_end(&mut rest);
    assert!(
        rest.is_empty(),
        "EXPORT_NAME before TLS got {} bytes",
        rest.len()
    );

    // The server kept serving: the good client still reads what libnbd wrote.
    let (ok, text) = qemu_io_tls(&port, &pki.client, "vol", &["read -P 0x61 0 1M"]);
    assert!(ok, "after the refusals: {text}");
    let (ok, err) = s.stop();
    assert!(ok, "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A volume over two `nbdkit --tls=require --tls-verify-peer` exports and one `qemu-nbd
/// --tls-creds` export (verify-peer on), given as `nbds://` components with a client
/// certificate: data written through the volume reads back, and lands on qemu-nbd's file.
#[test]
fn volume_over_tls_components() {
    if !have("nbdkit") || !have("qemu-nbd") || !have("qemu-io") {
        return;
    }
    let dir = scratch("tls-components");
    let pki = certs::make(&dir.join("pki"));
    let sdir = pki.server.to_str().unwrap().to_owned();
    let kit = |_: ()| -> Peer {
        nbdkit(&[
            "--tls=require",
            &format!("--tls-certificates={sdir}"),
            "--tls-verify-peer",
            "memory",
            "16M",
        ])
    };
    let (k1, k2) = (kit(()), kit(()));
    let file = dir.join("q.img");
    std::fs::File::create(&file)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let obj = format!("tls-creds-x509,id=tls0,endpoint=server,dir={sdir},verify-peer=on");
    let q = qemu_nbd_with(
        &file,
        "q",
        free_port(),
        &["--object", &obj, "--tls-creds", "tls0"],
    );
    let c = pki.client.to_str().unwrap();
    let comps = [
        format!("nbds://127.0.0.1:{}/?tls-certificates={c}", k1.port),
        format!("nbds://127.0.0.1:{}/?tls-certificates={c}", k2.port),
        format!("nbds://127.0.0.1:{}/q?tls-certificates={c}", q.port),
    ];
    let mut args = vec!["--interleave", "16"];
    args.extend(comps.iter().map(String::as_str));
    let s = Serve::start(&args);
    let (ok, text) = out(Command::new("qemu-io").args([
        "-f",
        "raw",
        &s.url,
        "-c",
        "write -P 0x77 0 6M",
        "-c",
        "read -P 0x77 0 6M",
        "-c",
        "read -P 0 6M 1M",
    ]));
    assert!(
        ok && !text.contains("failed") && !text.contains("Pattern"),
        "{text}"
    );
    let (ok, err) = s.stop();
    assert!(ok, "{err}");
    // Every third 8 KiB unit is on qemu-nbd's file: some of it holds the pattern.
    let raw = std::fs::read(&file).unwrap();
    assert!(
        raw[..8192].iter().all(|&b| b == 0x77),
        "the qemu-nbd component got its units"
    );
    drop((k1, k2, q));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `openssl` with `args` in `dir` and panics with what it said unless it succeeds.
fn openssl(dir: &std::path::Path, args: &[&str]) {
    let (ok, text) = out(Command::new("openssl").current_dir(dir).args(args));
    assert!(ok, "openssl {args:?}: {text}");
}

/// A new CA in `dir`: `ca-cert.pem` (self-signed, RSA) and `ca-key.pem`.
fn new_ca(dir: &std::path::Path, name: &str) {
    let subject = format!("/CN={name}");
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca-key.pem",
            "-out",
            "ca-cert.pem",
            "-days",
            "2",
            "-subj",
            &subject,
        ],
    );
}

/// Signs `csr` with the CA in `dir` into `cert`, with the extensions in `ext` (none: an
/// X.509 version 1 certificate, what `openssl x509 -req` makes without `-extfile`).
fn sign(dir: &std::path::Path, csr: &str, cert: &str, ext: Option<&str>) {
    let mut args = vec![
        "x509",
        "-req",
        "-in",
        csr,
        "-CA",
        "ca-cert.pem",
        "-CAkey",
        "ca-key.pem",
        "-CAcreateserial",
        "-days",
        "2",
        "-out",
        cert,
    ];
    if let Some(ext) = ext {
        std::fs::write(dir.join("ext.cnf"), ext).unwrap();
        args.extend(["-extfile", "ext.cnf"]);
    }
    openssl(dir, &args);
}

/// `tagstripe info` on an `nbds://` URL verified against `ca_dir`: whether it connected, and
/// what it said.
fn info_over_tls(port: u16, ca_dir: &std::path::Path) -> (bool, String) {
    out(Command::new(env!("CARGO_BIN_EXE_tagstripe"))
        .arg("info")
        .arg(format!(
            "nbds://127.0.0.1:{port}/vol?tls-certificates={}",
            ca_dir.display()
        )))
}

#[test]
fn certificates_made_by_openssl_and_their_pitfalls_explained() {
    if !have_from("openssl", "version", "openssl") {
        return;
    }
    // A CA, and a server key in each of the three forms openssl writes: RSA in PKCS#8
    // (`req -newkey`), RSA in PKCS#1 (`rsa -traditional`) and EC in SEC1 (`ecparam`).
    let dir = scratch("openssl");
    let ca = |args: &[&str]| openssl(&dir, args);
    new_ca(&dir, "tagstripe test CA");
    ca(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "rsa-key.pem",
        "-out",
        "rsa.csr",
        "-subj",
        "/CN=localhost",
    ]);
    ca(&[
        "rsa",
        "-in",
        "rsa-key.pem",
        "-traditional",
        "-out",
        "rsa1-key.pem",
    ]);
    ca(&[
        "ecparam",
        "-name",
        "prime256v1",
        "-genkey",
        "-noout",
        "-out",
        "ec-key.pem",
    ]);
    ca(&[
        "req",
        "-new",
        "-key",
        "ec-key.pem",
        "-out",
        "ec.csr",
        "-subj",
        "/CN=localhost",
    ]);
    let san = "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n";
    sign(&dir, "rsa.csr", "rsa-cert.pem", Some(san));
    sign(&dir, "ec.csr", "ec-cert.pem", Some(san));
    sign(&dir, "rsa.csr", "v1-cert.pem", None);
    sign(
        &dir,
        "rsa.csr",
        "cn-cert.pem",
        Some("extendedKeyUsage=serverAuth\n"),
    );
    sign(
        &dir,
        "rsa.csr",
        "eku-cert.pem",
        Some("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=clientAuth\n"),
    );
    let clients = dir.join("client");
    std::fs::create_dir_all(&clients).unwrap();
    std::fs::copy(dir.join("ca-cert.pem"), clients.join("ca-cert.pem")).unwrap();
    let disk = dir.join("v.img");
    std::fs::File::create(&disk)
        .unwrap()
        .set_len(4 << 20)
        .unwrap();

    // A server's directory with one certificate and key, and `serve` on one.
    let server_dir = |cert: &str, key: &str| {
        let name = format!(
            "{}+{}",
            cert.trim_end_matches(".pem"),
            key.trim_end_matches(".pem")
        );
        let d = dir.join(name);
        std::fs::create_dir_all(&d).unwrap();
        for (from, to) in [
            ("ca-cert.pem", "ca-cert.pem"),
            (cert, "server-cert.pem"),
            (key, "server-key.pem"),
        ] {
            std::fs::copy(dir.join(from), d.join(to)).unwrap();
        }
        d
    };
    let serve_with = |cert: &str, key: &str| {
        let d = server_dir(cert, key);
        Serve::start(&[
            "--tls",
            "require",
            "--tls-certificates",
            d.to_str().unwrap(),
            disk.to_str().unwrap(),
        ])
    };
    let port = |s: &Serve| {
        s.url
            .rsplit(':')
            .next()
            .unwrap()
            .split('/')
            .next()
            .unwrap()
            .parse::<u16>()
            .unwrap()
    };

    for (cert, key) in [
        ("rsa-cert.pem", "rsa-key.pem"),
        ("rsa-cert.pem", "rsa1-key.pem"),
        ("ec-cert.pem", "ec-key.pem"),
    ] {
        let s = serve_with(cert, key);
        let (ok, text) = info_over_tls(port(&s), &clients);
        assert!(ok, "{cert} with {key}: {text}");
        assert!(text.contains("8192 sectors"), "{text}");
        if have_from("nbdinfo", "--version", "libnbd-bin") {
            let (ok, text) = out(Command::new("nbdinfo").arg(format!(
                "nbds://127.0.0.1:{}/vol?tls-certificates={}",
                port(&s),
                clients.display()
            )));
            assert!(
                ok && text.contains("with TLS"),
                "nbdinfo, {cert} with {key}: {text}"
            );
        }
    }

    // What openssl makes when the steps are not quite right. qemu-nbd (GnuTLS) serves
    // with each; tagstripe's client refuses them (rustls follows the WebPKI rules) and says
    // what to change (rustls' own words where they say it).
    if have("qemu-nbd") {
        for (cert, says) in [
            ("v1-cert.pem", "X.509 version 1"),
            ("cn-cert.pem", "its common name (CN) is not used"),
            (
                "eku-cert.pem",
                "does not allow extended key usage for server authentication",
            ),
        ] {
            let d = server_dir(cert, "rsa-key.pem");
            let port = free_port();
            let creds = format!("tls-creds-x509,id=tls0,endpoint=server,dir={}", d.display());
            let peer = qemu_nbd_with(
                &disk,
                "vol",
                port,
                &["--object", &creds, "--tls-creds", "tls0"],
            );
            let (ok, text) = info_over_tls(port, &clients);
            assert!(!ok, "{cert} was taken: {text}");
            assert!(
                text.contains("handshake failed") && text.contains(says),
                "{cert}: {text}"
            );
            peer.stop();
        }
    }
    // `serve` itself refuses a version 1 certificate when it starts, naming the file.
    let d = server_dir("v1-cert.pem", "rsa-key.pem");
    let (ok, text) = out(Command::new(env!("CARGO_BIN_EXE_tagstripe"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--tls",
            "require",
            "--tls-certificates",
        ])
        .arg(&d)
        .arg(&disk));
    assert!(!ok, "{text}");
    assert!(
        text.contains("server-cert.pem: unusable certificate: the certificate is X.509 version 1"),
        "{text}"
    );
    // A CA that did not sign the server's certificate.
    let other = dir.join("other");
    std::fs::create_dir_all(&other).unwrap();
    new_ca(&other, "another CA");
    let s = serve_with("rsa-cert.pem", "rsa-key.pem");
    let (ok, text) = info_over_tls(port(&s), &other);
    assert!(
        !ok && text.contains("not signed by a CA in ca-cert.pem"),
        "{text}"
    );
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}
