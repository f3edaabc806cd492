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
    if v.contains('\0') || k.len() + v.len() + 1 >= MAX_ARG_BYTES {
        return Err(ApiError::invalid(format!(
            "bad value for environment variable {k}"
        )));
    }
    Ok(())
}

/// Largest step index or sequence number the API takes: the spec's `int64`, so clients in
/// any language can hold it.
pub const MAX_INDEX: u64 = i64::MAX as u64;

/// Refuses a step index or sequence number beyond [`MAX_INDEX`].
pub fn index(what: &str, v: u64) -> Result<u64, ApiError> {
    if v > MAX_INDEX {
        return Err(ApiError::invalid(format!(
            "{what} must be at most {MAX_INDEX}, got {v}"
        )));
    }
    Ok(v)
}

/// Longest single argument or `NAME=value` string the kernel passes to a program
/// (`MAX_ARG_STRLEN`, with its NUL).
pub const MAX_ARG_BYTES: usize = 128 * 1024;

/// Most bytes a command's arguments and environment may take together, counted as `execve`
/// does (each string with its NUL plus a pointer): `ARG_MAX` under the default 8 MiB stack.
pub const MAX_COMMAND_BYTES: usize = 2 << 20;

/// Most bytes a sandbox's own environment may take (counted like [`MAX_COMMAND_BYTES`]), so
/// that every command still has room for its arguments.
pub const MAX_SANDBOX_ENV_BYTES: usize = 1 << 20;

/// The bytes `execve` counts for `argv` and `env`.
pub fn command_bytes<'a>(
    argv: impl IntoIterator<Item = &'a String>,
    env: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> usize {
    let ptr = std::mem::size_of::<u64>();
    let a: usize = argv.into_iter().map(|s| s.len() + 1 + ptr).sum();
    let e: usize = env
        .into_iter()
        .map(|(k, v)| k.len() + v.len() + 2 + ptr)
        .sum();
    a + e
}

/// A command that the kernel can start: no argument or `NAME=value` longer than
/// [`MAX_ARG_BYTES`], and all of them within `limit` bytes (see [`command_bytes`]). Anything
/// larger can never run (`E2BIG`), so it is refused before it reaches the sandbox.
pub fn command_size<'a>(
    argv: impl IntoIterator<Item = &'a String> + Clone,
    env: impl IntoIterator<Item = (&'a String, &'a String)> + Clone,
    limit: usize,
) -> Result<(), ApiError> {
    if let Some((i, a)) = argv
        .clone()
        .into_iter()
        .enumerate()
        .find(|(_, a)| a.len() >= MAX_ARG_BYTES)
    {
        return Err(ApiError::invalid(format!(
            "argument {i} is {} bytes; the kernel takes at most {} bytes per argument (put \
             large data in stdin or a file)",
            a.len(),
            MAX_ARG_BYTES - 1
        )));
    }
    if let Some((k, v)) = env
        .clone()
        .into_iter()
        .find(|(k, v)| k.len() + v.len() + 1 >= MAX_ARG_BYTES)
    {
        return Err(ApiError::invalid(format!(
            "environment variable {} is {} bytes; the kernel takes at most {} bytes per \
             NAME=value",
            k.chars().take(64).collect::<String>(),
            k.len() + v.len() + 1,
            MAX_ARG_BYTES - 1
        )));
    }
    let total = command_bytes(argv, env);
    if total > limit {
        return Err(ApiError::invalid(format!(
            "arguments and environment take {total} bytes, more than the {limit} bytes a \
             command may have (put large data in stdin or a file)"
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

/// At most 64 labels, each one a [`label`].
pub fn labels(labels: &std::collections::BTreeMap<String, String>) -> Result<(), ApiError> {
    if labels.len() > 64 {
        return Err(ApiError::invalid("at most 64 labels"));
    }
    labels.iter().try_for_each(|(k, v)| label(k, v))
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
    fn commands_the_kernel_cannot_start_are_refused() {
        let none: Vec<(String, String)> = Vec::new();
        let env = || none.iter().map(|(k, v)| (k, v));
        let ok = vec!["x".repeat(MAX_ARG_BYTES - 1)];
        command_size(&ok, env(), MAX_COMMAND_BYTES).unwrap();
        let long = vec!["x".repeat(MAX_ARG_BYTES)];
        assert!(command_size(&long, env(), MAX_COMMAND_BYTES).is_err());
        // 1,100 arguments of 1,000 bytes fit; 2,200 of them do not.
        let many: Vec<String> = (0..1100).map(|_| "a".repeat(1000)).collect();
        command_size(&many, env(), MAX_COMMAND_BYTES).unwrap();
        let more: Vec<String> = (0..2200).map(|_| "a".repeat(1000)).collect();
        assert!(command_size(&more, env(), MAX_COMMAND_BYTES).is_err());
        // Many small variables count their pointers too: 100,000 of them are more than a
        // sandbox's environment may hold.
        let vars: Vec<(String, String)> = (0..100_000)
            .map(|i| (format!("V{i}"), "1".into()))
            .collect();
        let pairs = || vars.iter().map(|(k, v)| (k, v));
        assert!(command_bytes(std::iter::empty(), pairs()) > 1_600_000);
        assert!(command_size(std::iter::empty(), pairs(), MAX_SANDBOX_ENV_BYTES).is_err());
        assert!(env_pair("K", &"v".repeat(MAX_ARG_BYTES)).is_err());
    }

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
    fn indexes_fit_int64() {
        assert_eq!(index("step", MAX_INDEX).unwrap(), MAX_INDEX);
        assert!(index("step", MAX_INDEX + 1).is_err());
        assert!(index("from_seq", u64::MAX)
            .unwrap_err()
            .message
            .contains("from_seq"));
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
