//! The auth file (`--auth FILE`, TOML): tenants, the SHA-256 hashes of their tokens, their
//! role and quotas. Tokens themselves are never stored; a presented token is hashed and the
//! hash compared with every known hash in constant time.
//!
//! ```toml
//! [[tenant]]
//! name = "team-a"
//! role = "user"                 # or "admin"
//! token_sha256 = ["<hex of sha256(token)>"]
//! max_sandboxes = 100           # quotas are optional
//! creates_per_second = 10.0
//! create_burst = 20
//! max_memory_mb = 65536
//! max_cpus = 32.0
//! max_concurrent_calls = 64
//! ```

use std::collections::HashSet;
use std::path::Path;

use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use warren_types::{Caller, Quotas, Role};

use crate::error::{AuthFileError, EdgeError};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileToml {
    #[serde(default)]
    tenant: Vec<TenantToml>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantToml {
    name: String,
    role: Role,
    #[serde(default)]
    token_sha256: Vec<String>,
    #[serde(default)]
    max_sandboxes: Option<u64>,
    #[serde(default)]
    creates_per_second: Option<f64>,
    #[serde(default)]
    create_burst: Option<u32>,
    #[serde(default)]
    max_memory_mb: Option<u64>,
    #[serde(default)]
    max_cpus: Option<f64>,
    #[serde(default)]
    max_concurrent_calls: Option<u64>,
}

/// One tenant of the auth file.
#[derive(Debug, Clone, PartialEq)]
pub struct Tenant {
    pub name: String,
    pub role: Role,
    pub quotas: Quotas,
}

/// A parsed, checked auth file.
#[derive(Debug, Clone, Default)]
pub struct AuthFile {
    tenants: Vec<Tenant>,
    /// (sha256 of a token, index into `tenants`).
    hashes: Vec<([u8; 32], usize)>,
}

/// The hex SHA-256 of a token, as written into `token_sha256`.
pub fn token_sha256(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

impl AuthFile {
    /// Reads and checks `path`.
    pub fn load(path: &Path) -> Result<AuthFile, EdgeError> {
        let text = std::fs::read_to_string(path).map_err(|source| EdgeError::Read {
            path: path.into(),
            source,
        })?;
        AuthFile::parse(&text).map_err(|source| EdgeError::AuthFile {
            path: path.into(),
            source,
        })
    }

    /// Parses and checks the TOML text; the error says what is wrong and where.
    pub fn parse(text: &str) -> Result<AuthFile, AuthFileError> {
        let file: FileToml = toml::from_str(text)?;
        let mut out = AuthFile::default();
        let mut names = HashSet::new();
        let mut seen = HashSet::new();
        for t in file.tenant {
            warren_types::auth::tenant_name(&t.name).map_err(|e| AuthFileError::TenantName {
                name: t.name.clone(),
                message: e.message,
            })?;
            if !names.insert(t.name.clone()) {
                return Err(AuthFileError::Twice { name: t.name });
            }
            let quotas = Quotas {
                max_sandboxes: t.max_sandboxes,
                creates_per_second: t.creates_per_second,
                create_burst: t.create_burst,
                max_memory_mb: t.max_memory_mb,
                max_cpus: t.max_cpus,
                max_concurrent_calls: t.max_concurrent_calls,
            };
            check_quotas(&t.name, &quotas)?;
            let index = out.tenants.len();
            for h in &t.token_sha256 {
                let bytes = hex::decode(h.trim()).ok().filter(|b| b.len() == 32);
                let Some(bytes) = bytes else {
                    return Err(AuthFileError::Hash {
                        tenant: t.name,
                        hash: h.clone(),
                    });
                };
                let mut hash = [0u8; 32];
                hash.copy_from_slice(&bytes);
                if !seen.insert(hash) {
                    return Err(AuthFileError::SharedHash {
                        tenant: t.name,
                        hash: h.clone(),
                    });
                }
                out.hashes.push((hash, index));
            }
            out.tenants.push(Tenant {
                name: t.name,
                role: t.role,
                quotas,
            });
        }
        Ok(out)
    }

    pub fn tenants(&self) -> &[Tenant] {
        &self.tenants
    }

    /// The caller a bearer token stands for, if any. Every known hash is compared, in
    /// constant time, whatever matches: the time taken says nothing about which prefix of
    /// which hash was close.
    pub fn authenticate(&self, token: &str) -> Option<Caller> {
        let presented: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found: Option<usize> = None;
        for (hash, index) in &self.hashes {
            if bool::from(hash.ct_eq(&presented)) {
                found = Some(*index);
            }
        }
        found.map(|i| {
            let t = &self.tenants[i];
            Caller::tenant(t.name.clone(), t.role, t.quotas.clone())
        })
    }
}

fn check_quotas(name: &str, q: &Quotas) -> Result<(), AuthFileError> {
    let bad = |what: &'static str| {
        Err(AuthFileError::Quota {
            tenant: name.to_string(),
            what,
        })
    };
    if let Some(r) = q.creates_per_second {
        if !r.is_finite() || r <= 0.0 {
            return bad("creates_per_second must be a positive number");
        }
    }
    if q.create_burst == Some(0) {
        return bad("create_burst must be at least 1");
    }
    if q.create_burst.is_some() && q.creates_per_second.is_none() {
        return bad("create_burst needs creates_per_second");
    }
    if let Some(c) = q.max_cpus {
        if !c.is_finite() || c < 0.0 {
            return bad("max_cpus must be a number >= 0");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(tokens: &[(&str, &str, &str)]) -> String {
        let mut s = String::new();
        for (name, role, token) in tokens {
            s.push_str(&format!(
                "[[tenant]]\nname = \"{name}\"\nrole = \"{role}\"\ntoken_sha256 = [\"{}\"]\n",
                token_sha256(token)
            ));
        }
        s
    }

    #[test]
    fn the_documented_form_parses() {
        let text = format!(
            "[[tenant]]\nname = \"team-a\"\nrole = \"user\"   # or \"admin\"\ntoken_sha256 = [\"{}\"]\nmax_sandboxes = 100\n\
             \n[[tenant]]\nname = \"ops\"\nrole = \"admin\"\ntoken_sha256 = [\"{}\", \"{}\"]\ncreates_per_second = 2.5\ncreate_burst = 5\nmax_memory_mb = 1024\nmax_cpus = 4\nmax_concurrent_calls = 8\n",
            token_sha256("a-token"),
            token_sha256("ops-1"),
            token_sha256("ops-2").to_uppercase(),
        );
        let f = AuthFile::parse(&text).unwrap();
        assert_eq!(f.tenants().len(), 2);
        assert_eq!(f.tenants()[0].quotas.max_sandboxes, Some(100));
        let q = &f.tenants()[1].quotas;
        assert_eq!(
            (
                q.creates_per_second,
                q.create_burst,
                q.max_memory_mb,
                q.max_cpus,
                q.max_concurrent_calls
            ),
            (Some(2.5), Some(5), Some(1024), Some(4.0), Some(8))
        );
        let a = f.authenticate("a-token").unwrap();
        assert_eq!((a.tenant.as_deref(), a.role), (Some("team-a"), Role::User));
        assert_eq!(a.quotas.max_sandboxes, Some(100));
        assert_eq!(f.authenticate("ops-2").unwrap().role, Role::Admin);
        assert_eq!(
            f.authenticate("ops-1").unwrap().tenant.as_deref(),
            Some("ops")
        );
        assert!(f.authenticate("a-token ").is_none());
        assert!(f.authenticate("").is_none());
        assert!(
            f.authenticate(&token_sha256("a-token")).is_none(),
            "the hash is not a token"
        );
    }

    #[test]
    fn an_empty_file_knows_no_token() {
        let f = AuthFile::parse("").unwrap();
        assert!(f.tenants().is_empty());
        assert!(f.authenticate("x").is_none());
    }

    #[test]
    fn bad_files_are_refused_with_a_reason() {
        let h = token_sha256("t");
        let cases = [
            (format!("[[tenant]]\nname = \"a\"\nrole = \"root\"\ntoken_sha256 = [\"{h}\"]\n"), "root"),
            (format!("[[tenant]]\nname = \"a\"\nrole = \"user\"\ntoken = [\"{h}\"]\n"), "token"),
            ("[[tenant]]\nname = \"a\"\nrole = \"user\"\ntoken_sha256 = [\"abc\"]\n".to_string(), "64 hex"),
            (format!("[[tenant]]\nname = \"A B\"\nrole = \"user\"\ntoken_sha256 = [\"{h}\"]\n"), "tenant name"),
            (file(&[("a", "user", "t"), ("a", "user", "u")]), "twice"),
            (file(&[("a", "user", "t"), ("b", "user", "t")]), "more than once"),
            (format!("[[tenant]]\nname = \"a\"\nrole = \"user\"\ntoken_sha256 = [\"{h}\"]\ncreates_per_second = 0\n"), "positive"),
            (format!("[[tenant]]\nname = \"a\"\nrole = \"user\"\ntoken_sha256 = [\"{h}\"]\ncreate_burst = 3\n"), "needs"),
            (format!("[[tenant]]\nname = \"a\"\nrole = \"user\"\ntoken_sha256 = [\"{h}\"]\nmax_sandboxes = -1\n"), ""),
            ("not toml [".to_string(), ""),
        ];
        for (text, want) in cases {
            let err = AuthFile::parse(&text).expect_err(&text).to_string();
            assert!(err.contains(want), "{err:?} should mention {want:?}");
        }
    }

    #[test]
    fn load_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("auth.toml");
        std::fs::write(&p, "[[tenant]]\nname = 1\n").unwrap();
        let e = AuthFile::load(&p).unwrap_err().to_string();
        assert!(e.contains("auth.toml"), "{e}");
        let e = AuthFile::load(&dir.path().join("missing"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing"), "{e}");
    }
}
