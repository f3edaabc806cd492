//! The routes of the node API, `(method, path)` in axum/OpenAPI path syntax: one list, served
//! by `warrend` and forwarded by the cluster gateway (which adds its own cluster routes). Both
//! routers are checked against it when built, and their tests check it against
//! `api/openapi.yaml`.
//!
//! A path may end in a wildcard, `{*name}`, which matches the rest of the path, slashes
//! included; OpenAPI has no such syntax and spells it `{name}` ([`openapi_path`]).

/// Every route of the node API.
pub const NODE_API: &[(&str, &str)] = &[
    ("GET", "/v1/health"),
    ("GET", "/v1/events"),
    ("GET", "/metrics"),
    ("POST", "/v1/sandboxes"),
    ("GET", "/v1/sandboxes"),
    ("GET", "/v1/sandboxes/{id}"),
    ("DELETE", "/v1/sandboxes/{id}"),
    ("POST", "/v1/sandboxes/{id}/pause"),
    ("POST", "/v1/sandboxes/{id}/resume"),
    ("POST", "/v1/sandboxes/{id}/fork"),
    ("POST", "/v1/sandboxes/{id}/snapshot"),
    ("POST", "/v1/sandboxes/{id}/revive"),
    ("POST", "/v1/sandboxes/{id}/extend"),
    ("GET", "/v1/sandboxes/{id}/stats"),
    ("GET", "/v1/sandboxes/{id}/trajectory"),
    ("GET", "/v1/sandboxes/{id}/network"),
    ("PUT", "/v1/sandboxes/{id}/network"),
    ("POST", "/v1/sandboxes/{id}/exec"),
    ("POST", "/v1/sandboxes/{id}/exec/stream"),
    ("POST", "/v1/sandboxes/{id}/exec/attach"),
    ("POST", "/v1/sandboxes/{id}/processes"),
    ("GET", "/v1/sandboxes/{id}/processes"),
    ("GET", "/v1/sandboxes/{id}/processes/{pid}"),
    ("POST", "/v1/sandboxes/{id}/processes/{pid}/wait"),
    ("POST", "/v1/sandboxes/{id}/processes/{pid}/kill"),
    ("GET", "/v1/sandboxes/{id}/pty"),
    ("POST", "/v1/sandboxes/{id}/pty/attach"),
    ("GET", "/v1/sandboxes/{id}/files"),
    ("PUT", "/v1/sandboxes/{id}/files"),
    ("DELETE", "/v1/sandboxes/{id}/files"),
    ("GET", "/v1/sandboxes/{id}/files/tar"),
    ("PUT", "/v1/sandboxes/{id}/files/tar"),
    ("GET", "/v1/sandboxes/{id}/files/stat"),
    ("GET", "/v1/sandboxes/{id}/files/list"),
    ("POST", "/v1/sandboxes/{id}/files/mkdir"),
    ("POST", "/v1/sandboxes/{id}/files/chmod"),
    ("GET", "/v1/sandboxes/{id}/ports/{*target}"),
    ("HEAD", "/v1/sandboxes/{id}/ports/{*target}"),
    ("POST", "/v1/sandboxes/{id}/ports/{*target}"),
    ("PUT", "/v1/sandboxes/{id}/ports/{*target}"),
    ("PATCH", "/v1/sandboxes/{id}/ports/{*target}"),
    ("DELETE", "/v1/sandboxes/{id}/ports/{*target}"),
    ("OPTIONS", "/v1/sandboxes/{id}/ports/{*target}"),
    ("GET", "/v1/snapshots"),
    ("GET", "/v1/snapshots/{id}"),
    ("DELETE", "/v1/snapshots/{id}"),
    ("GET", "/v1/images"),
    ("GET", "/v1/images/{ref}"),
    ("DELETE", "/v1/images/{ref}"),
    ("POST", "/v1/images/gc"),
    ("POST", "/v1/images/import"),
    ("POST", "/v1/images/pull"),
    ("POST", "/v1/images/build"),
    ("POST", "/v1/functions/call"),
    ("GET", "/v1/functions/pools"),
    ("POST", "/run_code"),
    ("POST", "/run_jupyter"),
];

/// The path of a sandbox's port, `/v1/sandboxes/{id}/ports/{port}`: whatever follows it (a
/// path and a query) is sent to the HTTP server listening on that port inside the sandbox.
/// The route is one wildcard, `/v1/sandboxes/{id}/ports/{*target}` (`target` = `<port>`,
/// `<port>/` or `<port>/<path>`), so the bare port and a trailing slash match it too.
pub fn port_prefix(sandbox: &str, port: u16) -> String {
    format!("/v1/sandboxes/{sandbox}/ports/{port}")
}

/// `path` as OpenAPI spells it: a wildcard `{*name}` becomes `{name}`.
pub fn openapi_path(path: &str) -> String {
    path.replace("{*", "{")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards_in_openapi_syntax() {
        assert_eq!(
            openapi_path("/v1/sandboxes/{id}/ports/{*target}"),
            "/v1/sandboxes/{id}/ports/{target}"
        );
        assert_eq!(openapi_path("/v1/health"), "/v1/health");
        assert_eq!(port_prefix("n1-x", 8000), "/v1/sandboxes/n1-x/ports/8000");
    }
}
