//! TLS settings of a client: which CAs to trust (`WARREN_CA` or the system's roots) and an
//! optional client certificate (gateways presenting themselves to nodes), plus handshake
//! failures put into words that say what to fix.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::{CertificateError, ClientConfig, RootCertStore};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::error::ClientError;

/// The environment variable naming a PEM file of CAs to trust instead of the system's.
pub const CA_ENV: &str = "WARREN_CA";

fn bad(path: &Path, reason: impl Into<String>) -> ClientError {
    ClientError::TlsConfig {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, ClientError> {
    let bytes = std::fs::read(path).map_err(|e| bad(path, format!("cannot read it: {e}")))?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(path, format!("not PEM certificates: {e}")))?;
    if certs.is_empty() {
        return Err(bad(path, "no certificate in the file"));
    }
    Ok(certs)
}

/// A rustls client configuration trusting `ca` (else the system's roots), presenting
/// `identity` (certificate chain, key; both PEM) when given.
pub fn client_config(
    ca: Option<&Path>,
    identity: Option<(&Path, &Path)>,
) -> Result<ClientConfig, ClientError> {
    let mut roots = RootCertStore::empty();
    match ca {
        Some(path) => {
            for c in certs(path)? {
                roots
                    .add(c)
                    .map_err(|e| bad(path, format!("not a usable CA certificate: {e}")))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            for c in found.certs {
                let _ = roots.add(c);
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(Path::new("-"), format!("TLS protocol versions: {e}")))?
        .with_root_certificates(roots);
    let mut cfg = match identity {
        Some((cert, key)) => {
            let chain = certs(cert)?;
            let key_bytes =
                std::fs::read(key).map_err(|e| bad(key, format!("cannot read it: {e}")))?;
            let key_der = PrivateKeyDer::from_pem_slice(&key_bytes)
                .map_err(|e| bad(key, format!("no usable private key: {e}")))?;
            builder
                .with_client_auth_cert(chain, key_der)
                .map_err(|e| bad(key, format!("does not fit {}: {e}", cert.display())))?
        }
        None => builder.with_no_client_auth(),
    };
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

/// The TLS settings a builder collected.
#[derive(Debug, Clone, Default)]
pub(crate) struct TlsSettings {
    pub(crate) ca: Option<PathBuf>,
    pub(crate) identity: Option<(PathBuf, PathBuf)>,
}

impl TlsSettings {
    pub(crate) fn connector(&self) -> Result<tokio_rustls::TlsConnector, ClientError> {
        let ca = self.ca.clone().or_else(|| {
            std::env::var_os(CA_ENV)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        });
        let identity = self
            .identity
            .as_ref()
            .map(|(c, k)| (c.as_path(), k.as_path()));
        let cfg = client_config(ca.as_deref(), identity)?;
        Ok(tokio_rustls::TlsConnector::from(Arc::new(cfg)))
    }
}

/// What a failed handshake means, in words that say what to do.
pub(crate) fn explain(e: &io::Error) -> String {
    let Some(inner) = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) else {
        return e.to_string();
    };
    match inner {
        rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer) => {
            "the daemon's certificate is not signed by a trusted CA (set WARREN_CA or --ca to the PEM file of the CA that signed it)".into()
        }
        rustls::Error::InvalidCertificate(CertificateError::NotValidForName)
        | rustls::Error::InvalidCertificate(CertificateError::NotValidForNameContext { .. }) => {
            "the daemon's certificate does not name this host (connect with a name or address the certificate lists)".into()
        }
        rustls::Error::InvalidCertificate(CertificateError::Expired)
        | rustls::Error::InvalidCertificate(CertificateError::ExpiredContext { .. }) => {
            "the daemon's certificate has expired".into()
        }
        rustls::Error::AlertReceived(a) => format!(
            "the daemon refused the handshake ({a:?}); it may require a client certificate signed by its --tls-client-ca"
        ),
        other => format!("{other}"),
    }
}
