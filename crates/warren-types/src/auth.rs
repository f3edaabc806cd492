//! Who is calling: the tenant and role an authenticated request acts as, and the quotas of
//! its tenant. Built by the API edge (`warren-edge`) from a token, handed to the node's
//! manager as a plain value; nothing here knows HTTP.

use serde::{Deserialize, Serialize};

use crate::{ApiError, ErrorCode};

/// What a caller may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Sees and changes every tenant's sandboxes, images and node-wide state.
    #[default]
    Admin,
    /// Sees and changes only its own tenant's sandboxes, processes and function pools.
    User,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::User => "user",
        }
    }
}

/// Per-tenant quotas; `None` is unlimited.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Quotas {
    /// Most live sandboxes (any state) at once.
    #[serde(default)]
    pub max_sandboxes: Option<u64>,
    /// Sustained sandbox creations per second (a token bucket).
    #[serde(default)]
    pub creates_per_second: Option<f64>,
    /// Creations allowed in one burst (the bucket's size; default: one second's worth, at
    /// least 1).
    #[serde(default)]
    pub create_burst: Option<u32>,
    /// Most memory reserved by live sandboxes, in MiB (the sum of their `memory_mb`).
    #[serde(default)]
    pub max_memory_mb: Option<u64>,
    /// Most CPUs reserved by live sandboxes (the sum of their `cpus`).
    #[serde(default)]
    pub max_cpus: Option<f64>,
    /// Most function calls running or waiting at once.
    #[serde(default)]
    pub max_concurrent_calls: Option<u64>,
}

/// Which quota refused a call (named in the `quota_exceeded` error).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quota {
    Sandboxes,
    CreatesPerSecond,
    MemoryMb,
    Cpus,
    ConcurrentCalls,
}

impl Quota {
    /// The quota's key in the auth file.
    pub fn as_str(self) -> &'static str {
        match self {
            Quota::Sandboxes => "max_sandboxes",
            Quota::CreatesPerSecond => "creates_per_second",
            Quota::MemoryMb => "max_memory_mb",
            Quota::Cpus => "max_cpus",
            Quota::ConcurrentCalls => "max_concurrent_calls",
        }
    }

    /// The `quota_exceeded` error (HTTP 429) for this quota.
    pub fn exceeded(self, tenant: &str, detail: String, retry_after: u64) -> ApiError {
        let mut e = ApiError::new(
            ErrorCode::QuotaExceeded,
            format!(
                "quota {} of tenant {tenant} exceeded: {detail}",
                self.as_str()
            ),
        );
        e.retry_after = Some(retry_after.max(1));
        e
    }
}

/// The identity a request acts as.
#[derive(Debug, Clone, PartialEq)]
pub struct Caller {
    /// The tenant, or `None` for the node's own implicit administrator (no `--auth`, or root
    /// on the Unix socket).
    pub tenant: Option<String>,
    pub role: Role,
    pub quotas: Quotas,
}

/// Who the server took the caller for, as `GET /v1/health` tells it (what a dashboard shows
/// and offers by).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallerSummary {
    /// `None` for the node's implicit administrator.
    pub tenant: Option<String>,
    pub role: Role,
}

impl Caller {
    /// Its tenant and role.
    pub fn summary(&self) -> CallerSummary {
        CallerSummary {
            tenant: self.tenant.clone(),
            role: self.role,
        }
    }

    /// The implicit administrator: no tenant, no quotas.
    pub fn admin() -> Caller {
        Caller {
            tenant: None,
            role: Role::Admin,
            quotas: Quotas::default(),
        }
    }

    /// A named tenant's caller.
    pub fn tenant(name: impl Into<String>, role: Role, quotas: Quotas) -> Caller {
        Caller {
            tenant: Some(name.into()),
            role,
            quotas,
        }
    }

    pub fn is_admin(&self) -> bool {
        self.role == Role::Admin
    }

    /// Whether this caller may see and touch something owned by `owner`: admins see
    /// everything, users only what their own tenant owns.
    pub fn sees(&self, owner: Option<&str>) -> bool {
        self.is_admin() || (self.tenant.is_some() && self.tenant.as_deref() == owner)
    }

    /// The tenant whose listings this caller gets: `None` (everything) for admins.
    pub fn scope(&self) -> Option<&str> {
        if self.is_admin() {
            None
        } else {
            // A user always has a tenant; an empty scope would match nothing anyway.
            Some(self.tenant.as_deref().unwrap_or(""))
        }
    }

    /// Refuses non-admins with `forbidden` (node-wide operations).
    pub fn require_admin(&self, what: &str) -> Result<(), ApiError> {
        if self.is_admin() {
            Ok(())
        } else {
            Err(ApiError::new(
                ErrorCode::Forbidden,
                format!("{what} needs the admin role"),
            ))
        }
    }

    /// The tenant's name for messages (`-` for the implicit administrator).
    pub fn name(&self) -> &str {
        self.tenant.as_deref().unwrap_or("-")
    }
}

/// Checks a tenant name: 1-64 characters of `[a-z0-9_-]`, starting with a letter or digit.
pub fn tenant_name(name: &str) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        && name.as_bytes()[0].is_ascii_alphanumeric();
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(format!(
            "tenant name {name:?} must be 1-64 characters of a-z, 0-9, - and _, starting with a letter or digit"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visibility() {
        let admin = Caller::admin();
        let a = Caller::tenant("a", Role::User, Quotas::default());
        let ops = Caller::tenant("ops", Role::Admin, Quotas::default());
        assert!(admin.sees(None) && admin.sees(Some("a")));
        assert!(ops.sees(Some("a")) && ops.sees(None));
        assert!(a.sees(Some("a")));
        assert!(!a.sees(Some("b")) && !a.sees(None));
        assert_eq!(a.scope(), Some("a"));
        assert_eq!(ops.scope(), None);
        assert_eq!(
            a.require_admin("gc").unwrap_err().code,
            ErrorCode::Forbidden
        );
        admin.require_admin("gc").unwrap();
    }

    #[test]
    fn names() {
        for ok in ["a", "team-a", "t_1", "9x"] {
            tenant_name(ok).unwrap();
        }
        for bad in ["", "A", "-a", "a b", "a:b", &"x".repeat(65)] {
            assert!(tenant_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn quota_errors_name_the_quota() {
        let e = Quota::Sandboxes.exceeded("a", "3 of 3 live".into(), 0);
        assert_eq!(e.code, ErrorCode::QuotaExceeded);
        assert_eq!(e.retry_after, Some(1));
        assert!(e.message.contains("max_sandboxes"), "{}", e.message);
    }
}
