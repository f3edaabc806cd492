//! Validation rules applied at every edge. Each function returns a typed [`ApiError`] with a
//! message that tells the caller what to fix.

use crate::error::{ApiError, ErrorCode};

fn path_err(msg: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::InvalidPath, msg)
}

/// A path inside a sandbox: absolute, no NUL, at most 4096 bytes, components at most 255
/// bytes, and no `..` that climbs above `/`. Returns the lexically normalized path.
pub fn sandbox_path(p: &str) -> Result<String, ApiError> {
    if p.is_empty() {
        return Err(path_err("path is empty"));
    }
    if p.len() > 4096 {
        return Err(path_err("path is longer than 4096 bytes"));
    }
    if p.contains('\0') {
        return Err(path_err("path contains a NUL byte"));
    }
    if !p.starts_with('/') {
        return Err(path_err(format!("path must be absolute, got {p:?}")));
    }
    let mut parts: Vec<&str> = Vec::new();
    for comp in p.split('/') {
        match comp {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return Err(path_err(format!("path {p:?} escapes the sandbox root")));
                }
            }
            c => {
                if c.len() > 255 {
                    return Err(path_err("a path component is longer than 255 bytes"));
                }
                parts.push(c);
            }
        }
    }
    Ok(format!("/{}", parts.join("/")))
}

/// An image or layer ref: `name` or `name:tag`, or `sha256:<64 hex>`.
pub fn image_ref(r: &str) -> Result<(), ApiError> {
    let bad = || {
        ApiError::invalid(format!(
            "image ref {r:?} must be name[:tag] of [a-z0-9._-] (1-128 chars) or sha256:<hex>"
        ))
    };
    if let Some(hex) = r.strip_prefix("sha256:") {
        if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Ok(());
        }
        return Err(bad());
    }
    let (name, tag) = r.split_once(':').unwrap_or((r, "latest"));
    let ok_part = |s: &str| {
        !s.is_empty()
            && s.len() <= 128
            && !s.starts_with('.')
            && s.bytes().all(|b| {
                b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'_' || b == b'-'
            })
    };
    if ok_part(name) && ok_part(tag) && !name.contains("..") {
        Ok(())
    } else {
        Err(bad())
    }
}

/// An environment variable: non-empty name without `=` or NUL, value without NUL.
pub fn env_pair(k: &str, v: &str) -> Result<(), ApiError> {
    if k.is_empty() || k.len() > 1024 || k.contains('=') || k.contains('\0') {
        return Err(ApiError::invalid(format!(
            "bad environment variable name {k:?}"
        )));
    }
    if v.contains('\0') || v.len() > 128 * 1024 {
        return Err(ApiError::invalid(format!(
            "bad value for environment variable {k}"
        )));
    }
    Ok(())
}

/// A user: a name (`[a-z_][a-z0-9_-]*`) or `uid[:gid]`.
pub fn user(u: &str) -> Result<(), ApiError> {
    let numeric = |s: &str| !s.is_empty() && s.len() <= 10 && s.bytes().all(|b| b.is_ascii_digit());
    let name = |s: &str| {
        !s.is_empty()
            && s.len() <= 32
            && s.bytes()
                .next()
                .is_some_and(|b| b.is_ascii_lowercase() || b == b'_')
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
    };
    let ok = match u.split_once(':') {
        Some((a, b)) => numeric(a) && numeric(b),
        None => numeric(u) || name(u),
    };
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(format!(
            "user {u:?} must be a name or uid[:gid]"
        )))
    }
}

/// A hostname label: 1-63 chars of `[a-zA-Z0-9-]`.
pub fn hostname(h: &str) -> Result<(), ApiError> {
    let ok = !h.is_empty()
        && h.len() <= 63
        && h.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && !h.starts_with('-');
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(format!(
            "hostname {h:?} must be 1-63 chars of [a-zA-Z0-9-]"
        )))
    }
}

/// A label: key of 1-63 chars of `[a-zA-Z0-9._/-]`, value at most 256 bytes without NUL.
pub fn label(k: &str, v: &str) -> Result<(), ApiError> {
    let ok_key = !k.is_empty()
        && k.len() <= 63
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._/-".contains(&b));
    if !ok_key {
        return Err(ApiError::invalid(format!(
            "label key {k:?} must be 1-63 chars of [a-zA-Z0-9._/-]"
        )));
    }
    if v.len() > 256 || v.contains('\0') {
        return Err(ApiError::invalid(format!(
            "label {k} value must be at most 256 bytes"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_normalize_and_never_escape() {
        assert_eq!(sandbox_path("/a/./b//c/").unwrap(), "/a/b/c");
        assert_eq!(sandbox_path("/a/../b").unwrap(), "/b");
        assert_eq!(sandbox_path("/").unwrap(), "/");
        for bad in [
            "",
            "a/b",
            "/..",
            "/a/../../etc",
            "/a\0b",
            &"/x".repeat(3000),
        ] {
            let e = sandbox_path(bad).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidPath, "{bad:?}");
        }
        assert!(sandbox_path(&format!("/{}", "a".repeat(256))).is_err());
    }

    #[test]
    fn image_refs() {
        for ok in [
            "default",
            "debian-py:3",
            "a.b_c-d:1.2",
            &format!("sha256:{}", "a".repeat(64)),
        ] {
            image_ref(ok).unwrap();
        }
        for bad in ["", "A", "../x", "a:", ":b", "a b", "sha256:xyz", ".hidden"] {
            assert!(image_ref(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn users() {
        for ok in ["root", "1000", "1000:1000", "_apt", "www-data"] {
            user(ok).unwrap();
        }
        for bad in ["", "Root", "1000:", "a:b", "1;rm"] {
            assert!(user(bad).is_err(), "{bad}");
        }
    }
}
