//! TLS credentials for NBD (feature `tls`), read from a directory in the layout qemu's
//! `tls-creds-x509` and nbdkit's `--tls-certificates` read: `ca-cert.pem`, and
//! `server-cert.pem` / `server-key.pem` for a server, `client-cert.pem` / `client-key.pem` for
//! a client (optional for a client). TLS itself is rustls with its `ring` provider: it builds
//! with nothing but a C compiler (aws-lc-rs, rustls' default, also needs cmake), and links no
//! OpenSSL.
//!
//! ```no_run
//! let server = tagstripe::nbd::tls::server_config("/etc/pki/tagstripe".as_ref(), true)?;
//! let client = tagstripe::nbd::tls::client_config("/etc/pki/tagstripe".as_ref())?;
//! # Ok::<(), tagstripe::Error>(())
//! ```

use std::path::Path;
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::{Error, Result};

fn tls_err(path: &Path, what: impl std::fmt::Display) -> Error {
    Error::Tls {
        path: path.display().to_string(),
        what: what.to_string(),
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|e| tls_err(path, e))?
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| tls_err(path, e))?;
    if certs.is_empty() {
        return Err(tls_err(path, "holds no certificate"));
    }
    Ok(certs)
}

fn key(path: &Path) -> Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| tls_err(path, e))
}

fn roots(dir: &Path) -> Result<RootCertStore> {
    let path = dir.join("ca-cert.pem");
    let mut roots = RootCertStore::empty();
    for c in certs(&path)? {
        roots.add(c).map_err(|e| tls_err(&path, e))?;
    }
    Ok(roots)
}

/// A server's TLS configuration from `dir`: its certificate chain and key; with
/// `verify_peer`, clients must present a certificate that chains to `ca-cert.pem`.
///
/// # Errors
/// [`Error::Tls`] naming the file that is missing or unusable.
pub fn server_config(dir: &Path, verify_peer: bool) -> Result<Arc<rustls::ServerConfig>> {
    let chain = certs(&dir.join("server-cert.pem"))?;
    let key = key(&dir.join("server-key.pem"))?;
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_err(dir, e))?;
    let builder = if verify_peer {
        let v = WebPkiClientVerifier::builder_with_provider(Arc::new(roots(dir)?), provider())
            .build()
            .map_err(|e| tls_err(&dir.join("ca-cert.pem"), e))?;
        builder.with_client_cert_verifier(v)
    } else {
        builder.with_no_client_auth()
    };
    let config = builder
        .with_single_cert(chain, key)
        .map_err(|e| own_failure(dir, "server", &e))?;
    Ok(Arc::new(config))
}

/// A client's TLS configuration from `dir`: servers are verified against `ca-cert.pem`;
/// `client-cert.pem` and `client-key.pem` are presented when both are there.
///
/// # Errors
/// [`Error::Tls`] naming the file that is missing or unusable.
pub fn client_config(dir: &Path) -> Result<Arc<rustls::ClientConfig>> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_err(dir, e))?
        .with_root_certificates(roots(dir)?);
    let (cert, key_path) = (dir.join("client-cert.pem"), dir.join("client-key.pem"));
    let config = if cert.exists() && key_path.exists() {
        builder
            .with_client_auth_cert(certs(&cert)?, key(&key_path)?)
            .map_err(|e| own_failure(dir, "client", &e))?
    } else {
        builder.with_no_client_auth()
    };
    Ok(Arc::new(config))
}

/// Why our own certificate and key (`<who>-cert.pem`, `<who>-key.pem` in `dir`) cannot be
/// used, naming the file at fault: the certificate when rustls cannot take it, else the key.
fn own_failure(dir: &Path, who: &str, e: &rustls::Error) -> Error {
    match e {
        rustls::Error::InvalidCertificate(c) => tls_err(
            &dir.join(format!("{who}-cert.pem")),
            match certificate_hint(e) {
                Some(h) => format!("unusable certificate: {h}"),
                None => format!("unusable certificate: {c:?}"),
            },
        ),
        rustls::Error::InconsistentKeys(_) => tls_err(
            &dir.join(format!("{who}-key.pem")),
            format!("does not match {who}-cert.pem ({e})"),
        ),
        _ => tls_err(&dir.join(format!("{who}-key.pem")), e),
    }
}

/// What a failed handshake says, with a hint where the cause is a certificate made in a way
/// that TLS here (rustls, WebPKI rules) refuses but older tools accept: the pitfalls of
/// making certificates by hand with `openssl`.
pub(crate) fn handshake_failure(e: &std::io::Error) -> String {
    let hint = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .and_then(certificate_hint);
    match hint {
        Some(h) => format!("handshake failed: {e} ({h})"),
        None => format!("handshake failed: {e}"),
    }
}

/// What to change, for a certificate refusal that rustls words only by its error's name.
fn certificate_hint(e: &rustls::Error) -> Option<&'static str> {
    use rustls::CertificateError as C;
    let rustls::Error::InvalidCertificate(c) = e else {
        return None;
    };
    Some(match c {
        C::NotValidForName | C::NotValidForNameContext { .. } => {
            "the name or address connected to must be in the certificate's subjectAltName \
             (DNS: or IP:); its common name (CN) is not used"
        }
        C::UnknownIssuer => "the certificate is not signed by a CA in ca-cert.pem",
        C::Other(other) => match other.0.downcast_ref::<webpki::Error>()? {
            webpki::Error::UnsupportedCertVersion => {
                "the certificate is X.509 version 1, which has no extensions (`openssl x509 \
                 -req` makes one unless given -extfile): make it version 3 with a \
                 subjectAltName"
            }
            webpki::Error::CaUsedAsEndEntity => {
                "the certificate presented is a CA's (basicConstraints CA:TRUE): present one \
                 the CA issued"
            }
            _ => return None,
        },
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(e: rustls::CertificateError) -> String {
        let io = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(e),
        );
        handshake_failure(&io)
    }

    fn webpki(e: webpki::Error) -> rustls::CertificateError {
        rustls::CertificateError::Other(rustls::OtherError(Arc::new(e)))
    }

    #[test]
    fn certificate_pitfalls_are_explained() {
        let v1 = failure(webpki(webpki::Error::UnsupportedCertVersion));
        assert!(
            v1.starts_with("handshake failed: invalid peer certificate"),
            "{v1}"
        );
        assert!(v1.contains("X.509 version 1"), "{v1}");
        assert!(failure(rustls::CertificateError::NotValidForName).contains("subjectAltName"));
        assert!(failure(rustls::CertificateError::UnknownIssuer).contains("ca-cert.pem"));
        assert!(failure(webpki(webpki::Error::CaUsedAsEndEntity)).contains("CA:TRUE"));
        // Anything else is said as rustls says it, with no hint.
        let expired = failure(rustls::CertificateError::Expired);
        assert!(!expired.contains('('), "{expired}");
        let plain = handshake_failure(&std::io::Error::other("connection reset"));
        assert_eq!(plain, "handshake failed: connection reset");
    }
}
