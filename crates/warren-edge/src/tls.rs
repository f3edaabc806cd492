//! TLS for TCP listeners (rustls, ring provider): the server's certificate chain and key,
//! and optionally a CA whose client certificates are required (gateway → node). The
//! configuration can be re-read (SIGHUP) for new connections; open ones keep theirs.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::error::EdgeError;

/// The files of a TLS listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// When set, clients must present a certificate signed by this CA.
    pub client_ca: Option<PathBuf>,
}

/// The crypto provider every Warren TLS endpoint uses.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads a PEM certificate chain.
pub fn load_certs(
    path: &Path,
    what: &'static str,
) -> Result<Vec<CertificateDer<'static>>, EdgeError> {
    let bad = |reason: String| EdgeError::Tls {
        what,
        path: path.into(),
        reason,
    };
    let bytes = std::fs::read(path).map_err(|source| EdgeError::Read {
        path: path.into(),
        source,
    })?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(format!("not PEM certificates: {e}")))?;
    if certs.is_empty() {
        return Err(bad("no certificate in the file".into()));
    }
    Ok(certs)
}

/// Reads a PEM private key (PKCS#8, PKCS#1 or SEC1).
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, EdgeError> {
    let bytes = std::fs::read(path).map_err(|source| EdgeError::Read {
        path: path.into(),
        source,
    })?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| EdgeError::Tls {
        what: "key",
        path: path.into(),
        reason: format!("no usable private key: {e}"),
    })
}

/// Builds the server configuration from `files`.
pub fn server_config(files: &TlsFiles) -> Result<ServerConfig, EdgeError> {
    let certs = load_certs(&files.cert, "certificate")?;
    let key = load_key(&files.key)?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| EdgeError::Config(format!("TLS protocol versions: {e}")))?;
    let builder = match &files.client_ca {
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for c in load_certs(ca, "client CA")? {
                roots.add(c).map_err(|e| EdgeError::Tls {
                    what: "client CA",
                    path: ca.clone(),
                    reason: e.to_string(),
                })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                .build()
                .map_err(|e| EdgeError::Tls {
                    what: "client CA",
                    path: ca.clone(),
                    reason: e.to_string(),
                })?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut cfg = builder
        .with_single_cert(certs, key)
        .map_err(|e| EdgeError::Tls {
            what: "key",
            path: files.key.clone(),
            reason: format!("does not fit the certificate: {e}"),
        })?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(cfg)
}

/// A TLS configuration that can be re-read from its files.
#[derive(Debug)]
pub struct Tls {
    files: TlsFiles,
    current: RwLock<Arc<ServerConfig>>,
}

impl Tls {
    pub fn load(files: TlsFiles) -> Result<Tls, EdgeError> {
        let cfg = server_config(&files)?;
        Ok(Tls {
            files,
            current: RwLock::new(Arc::new(cfg)),
        })
    }

    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// The configuration for the next connection.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.current.read().expect("tls lock").clone())
    }

    /// Re-reads the files; on error the configuration in force stays.
    pub fn reload(&self) -> Result<(), EdgeError> {
        let cfg = server_config(&self.files)?;
        *self.current.write().expect("tls lock") = Arc::new(cfg);
        Ok(())
    }
}
