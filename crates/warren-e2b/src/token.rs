//! envd access tokens: per sandbox, never the tenant's API key. A token is the HMAC-SHA256 of
//! the sandbox id under a secret the node keeps in its state directory (`e2b-secret`, mode
//! 0600, made at the first start), so the node that holds the sandbox can check it without
//! storing anything per sandbox, and a token names exactly one sandbox. A gateway keeps no
//! secret: it forwards data-plane requests to the owning node, which checks them.

use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Bytes of the secret.
const SECRET_LEN: usize = 32;

/// What a token grants, mixed into the MAC so one kind is never accepted as another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// `X-Access-Token` of envd requests.
    Envd,
    /// `e2b-traffic-access-token` of requests to a sandbox's other ports.
    Traffic,
}

impl Purpose {
    fn tag(self) -> &'static [u8] {
        match self {
            Purpose::Envd => b"warren-e2b envd\0",
            Purpose::Traffic => b"warren-e2b traffic\0",
        }
    }
}

/// Makes and checks access tokens with one node secret.
#[derive(Clone)]
pub struct Tokens {
    secret: [u8; SECRET_LEN],
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tokens { .. }")
    }
}

impl Tokens {
    pub fn from_secret(secret: [u8; SECRET_LEN]) -> Tokens {
        Tokens { secret }
    }

    /// Reads the secret at `path`, or makes one there (0600) when the file does not exist.
    /// A file of the wrong size is an error (never silently replaced: every token handed out
    /// would stop working); a file readable by others is made 0600 again.
    pub fn load_or_create(path: &Path) -> std::io::Result<Tokens> {
        match std::fs::File::open(path) {
            Ok(mut f) => {
                let meta = f.metadata()?;
                if meta.permissions().mode() & 0o077 != 0 {
                    tracing::warn!(path = %path.display(), "the E2B token secret was readable by others; made 0600");
                    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
                }
                let mut buf = Vec::with_capacity(SECRET_LEN);
                f.read_to_end(&mut buf)?;
                let secret: [u8; SECRET_LEN] = buf.as_slice().try_into().map_err(|_| {
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!(
                            "{} holds {} bytes, not {SECRET_LEN}: remove it to make a new secret \
                             (tokens handed out before stop working)",
                            path.display(),
                            buf.len()
                        ),
                    )
                })?;
                Ok(Tokens { secret })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut secret = [0u8; SECRET_LEN];
                std::fs::File::open("/dev/urandom")?.read_exact(&mut secret)?;
                if let Some(dir) = path.parent() {
                    std::fs::create_dir_all(dir)?;
                }
                let tmp = path.with_extension("tmp");
                let _ = std::fs::remove_file(&tmp);
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&tmp)?;
                f.write_all(&secret)?;
                f.sync_all()?;
                std::fs::rename(&tmp, path)?;
                Ok(Tokens { secret })
            }
            Err(e) => Err(e),
        }
    }

    fn mac(&self, purpose: Purpose, sandbox: &str) -> Hmac<Sha256> {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.secret).expect("any key size");
        m.update(purpose.tag());
        m.update(sandbox.as_bytes());
        m
    }

    /// The token of `sandbox` for `purpose` (64 hex digits).
    pub fn token(&self, purpose: Purpose, sandbox: &str) -> String {
        hex::encode(self.mac(purpose, sandbox).finalize().into_bytes())
    }

    /// Whether `token` is the one of `sandbox` for `purpose` (compared in constant time).
    pub fn verify(&self, purpose: Purpose, sandbox: &str, token: &str) -> bool {
        let Ok(raw) = hex::decode(token.trim()) else {
            return false;
        };
        self.mac(purpose, sandbox).verify_slice(&raw).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_name_one_sandbox_and_one_purpose() {
        let t = Tokens::from_secret([7; SECRET_LEN]);
        let a = t.token(Purpose::Envd, "n1-a");
        assert_eq!(a.len(), 64);
        assert!(t.verify(Purpose::Envd, "n1-a", &a));
        assert!(!t.verify(Purpose::Envd, "n1-b", &a));
        assert!(!t.verify(Purpose::Traffic, "n1-a", &a));
        assert!(!t.verify(Purpose::Envd, "n1-a", "zz"));
        assert!(!t.verify(Purpose::Envd, "n1-a", ""));
        let other = Tokens::from_secret([8; SECRET_LEN]);
        assert!(!other.verify(Purpose::Envd, "n1-a", &a));
    }

    #[test]
    fn the_secret_is_made_once_private_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("state/e2b-secret");
        let a = Tokens::load_or_create(&p).unwrap();
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let b = Tokens::load_or_create(&p).unwrap();
        assert_eq!(a.token(Purpose::Envd, "x"), b.token(Purpose::Envd, "x"));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        Tokens::load_or_create(&p).unwrap();
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        std::fs::write(&p, b"short").unwrap();
        let e = Tokens::load_or_create(&p).unwrap_err();
        assert!(e.to_string().contains("5 bytes"), "{e}");
    }
}
