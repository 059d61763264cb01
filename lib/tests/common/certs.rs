//! Test certificates, made afresh by each test (no private key is ever committed): a CA,
//! a server certificate for `localhost` and `127.0.0.1`, a client certificate, and a second
//! CA whose client certificate the first CA does not vouch for. Written in the layout qemu's
//! `tls-creds-x509`, nbdkit's `--tls-certificates` and libnbd's `tls-certificates` read.
#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// Directories of PEM files for one test.
pub struct Certs {
    /// The server's side: ca-cert.pem, server-cert.pem, server-key.pem.
    pub server: PathBuf,
    /// A client trusted by the CA: ca-cert.pem, client-cert.pem, client-key.pem.
    pub client: PathBuf,
    /// A client with no certificate: ca-cert.pem alone.
    pub anonymous: PathBuf,
    /// A client whose certificate another CA signed (ca-cert.pem is the real CA, so the
    /// client still trusts the server).
    pub stranger: PathBuf,
}

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, name);
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    CertifiedIssuer::self_signed(p, KeyPair::generate().unwrap()).unwrap()
}

/// A leaf certificate and its key, PEM, signed by `ca`.
fn leaf(ca: &CertifiedIssuer<'static, KeyPair>, cn: &str, server: bool) -> (String, String) {
    let names = if server {
        vec!["localhost".to_owned(), "127.0.0.1".to_owned()]
    } else {
        Vec::new()
    };
    let mut p = CertificateParams::new(names).unwrap();
    p.distinguished_name.push(DnType::CommonName, cn);
    p.is_ca = IsCa::ExplicitNoCa;
    p.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    p.extended_key_usages = vec![if server {
        ExtendedKeyUsagePurpose::ServerAuth
    } else {
        ExtendedKeyUsagePurpose::ClientAuth
    }];
    let key = KeyPair::generate().unwrap();
    let cert = p.signed_by(&key, ca).unwrap();
    (cert.pem(), key.serialize_pem())
}

fn write(dir: &Path, files: &[(&str, &str)]) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    for (name, text) in files {
        std::fs::write(dir.join(name), text).unwrap();
    }
    dir.to_owned()
}

/// Makes the four directories under `root`.
pub fn make(root: &Path) -> Certs {
    let ca1 = ca("tagstripe test CA");
    let ca2 = ca("another CA");
    let ca_pem = ca1.pem();
    let (scert, skey) = leaf(&ca1, "tagstripe test server", true);
    let (ccert, ckey) = leaf(&ca1, "tagstripe test client", false);
    let (xcert, xkey) = leaf(&ca2, "a stranger", false);
    Certs {
        server: write(
            &root.join("server"),
            &[
                ("ca-cert.pem", &ca_pem),
                ("server-cert.pem", &scert),
                ("server-key.pem", &skey),
            ],
        ),
        client: write(
            &root.join("client"),
            &[
                ("ca-cert.pem", &ca_pem),
                ("client-cert.pem", &ccert),
                ("client-key.pem", &ckey),
            ],
        ),
        anonymous: write(&root.join("anonymous"), &[("ca-cert.pem", &ca_pem)]),
        stranger: write(
            &root.join("stranger"),
            &[
                ("ca-cert.pem", &ca_pem),
                ("client-cert.pem", &xcert),
                ("client-key.pem", &xkey),
            ],
        ),
    }
}
