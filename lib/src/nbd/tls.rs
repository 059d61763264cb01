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
        .map_err(|e| tls_err(&dir.join("server-key.pem"), e))?;
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
            .map_err(|e| tls_err(&key_path, e))?
    } else {
        builder.with_no_client_auth()
    };
    Ok(Arc::new(config))
}
