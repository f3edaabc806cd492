//! Which user a command runs as. The SDK names one (Basic auth's user name, E2B's default
//! is `user`); Warren's images need not have it. A named user runs as itself when the
//! sandbox's /etc/passwd has it, as root otherwise; no name runs as the image's default user.
//! What a sandbox's /etc/passwd holds is read once per (sandbox, name) and remembered.

use std::collections::HashMap;
use std::sync::Mutex;

use axum::body::Body;
use axum::http::Method;

use crate::connect::ConnectError;
use crate::v1::{read_limited, Sandbox};

/// Remembered answers before the memory is cleared (sandboxes come and go).
const MAX_REMEMBERED: usize = 100_000;

#[derive(Default)]
pub struct Users {
    known: Mutex<HashMap<(String, String), bool>>,
}

impl Users {
    /// The `user` of the exec request for the SDK's `user`.
    pub async fn resolve(
        &self,
        sb: &Sandbox,
        user: Option<&str>,
    ) -> Result<Option<String>, ConnectError> {
        let Some(name) = user.filter(|u| !u.is_empty()) else {
            return Ok(None);
        };
        if name == "root" || name.bytes().all(|b| b.is_ascii_digit()) {
            return Ok(Some(name.to_string()));
        }
        let key = (sb.id.clone(), name.to_string());
        let known = self
            .known
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .copied();
        let has = match known {
            Some(h) => h,
            None => {
                let h = has_user(sb, name).await?;
                let mut m = self.known.lock().unwrap_or_else(|e| e.into_inner());
                if m.len() >= MAX_REMEMBERED {
                    m.clear();
                }
                m.insert(key, h);
                h
            }
        };
        Ok(Some(if has {
            name.to_string()
        } else {
            "0".to_string()
        }))
    }

    /// Forgets a sandbox (it was killed).
    pub fn forget(&self, sandbox: &str) {
        self.known
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(s, _), _| s != sandbox);
    }
}

async fn has_user(sb: &Sandbox, name: &str) -> Result<bool, ConnectError> {
    let r = sb
        .send(Method::GET, "/files?path=/etc/passwd", None, Body::empty())
        .await?;
    if r.status() == axum::http::StatusCode::NOT_FOUND {
        // No passwd file, or no sandbox: the exec that follows tells which.
        return Ok(false);
    }
    if !r.status().is_success() {
        return Err(crate::v1::error_of(r).await);
    }
    let passwd = read_limited(r.into_body(), 4 << 20).await?;
    Ok(passwd_has(&passwd, name))
}

fn passwd_has(passwd: &[u8], name: &str) -> bool {
    passwd
        .split(|b| *b == b'\n')
        .any(|line| line.split(|b| *b == b':').next() == Some(name.as_bytes()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn passwd_lines_are_matched_by_name() {
        let p = b"root:x:0:0::/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/bash\n";
        assert!(super::passwd_has(p, "user"));
        assert!(super::passwd_has(p, "root"));
        assert!(!super::passwd_has(p, "use"));
        assert!(!super::passwd_has(b"", "user"));
    }
}
