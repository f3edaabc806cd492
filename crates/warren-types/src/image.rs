//! Images and layers as the API shows them (`GET /v1/images`, `GET /v1/images/{ref}`, GC).

use serde::{Deserialize, Serialize};

/// The media type of every layer of the store: a read-only EROFS filesystem image whose
/// whiteouts are overlayfs character devices 0/0 and whose opaque directories carry
/// `user.overlay.opaque=y`.
pub const LAYER_MEDIA_TYPE: &str = "application/vnd.warren.layer.v1.erofs";

/// One immutable layer of the store, named by the sha256 of its EROFS image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerInfo {
    /// `sha256:<hex>` of the EROFS image.
    pub digest: String,
    pub size_bytes: u64,
    /// Milliseconds since the Unix epoch; 0 when unknown (layers stored before metadata).
    #[serde(default)]
    pub created_ms: u64,
    /// Where it came from: a directory, `oci:<digest>` of an imported layer, a fork snapshot.
    #[serde(default)]
    pub source: String,
    #[serde(default = "default_media_type")]
    pub media_type: String,
    /// For imported layers: the digest of the uncompressed tar (the OCI diff id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diff_id: Option<String>,
}

fn default_media_type() -> String {
    LAYER_MEDIA_TYPE.to_string()
}

/// A named, versioned image: an ordered stack of layers, lowest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageInfo {
    /// `name:tag`.
    pub reference: String,
    pub name: String,
    pub tag: String,
    /// The refs the image was made of, as given (other images or layer digests), lowest first.
    #[serde(default)]
    pub stack: Vec<String>,
    /// Its layers, lowest first.
    pub layers: Vec<LayerInfo>,
    pub size_bytes: u64,
    pub created_ms: u64,
    pub source: String,
    /// The tenant the image belongs to (only it and admins see it); absent for the node's
    /// own images, which every tenant may use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// How its sandboxes run: environment, working directory, user, command, ... (absent
    /// for images made of bare layers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<ImageConfig>,
}

/// The configuration an image carries for its sandboxes, from its Dockerfile or its OCI
/// config. `env`, `working_dir` and `user` are the defaults of every command a sandbox of
/// the image runs (a create or a call may override each); the rest is kept and shown.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageConfig {
    /// `KEY=value`, in order (a later entry of the same key wins).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    /// `user[:group]`, by name or number, as the sandbox resolves it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmd: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entrypoint: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub labels: std::collections::BTreeMap<String, String>,
    /// `port/proto` (e.g. `8080/tcp`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exposed_ports: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_signal: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthcheck: Option<Healthcheck>,
    /// The shell of shell-form commands (`SHELL`); `["/bin/sh", "-c"]` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shell: Option<Vec<String>>,
}

impl ImageConfig {
    /// The environment as pairs, later entries of a key replacing earlier ones, in order of
    /// first appearance.
    pub fn env_pairs(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::new();
        for e in &self.env {
            let (k, v) = e.split_once('=').unwrap_or((e.as_str(), ""));
            match out.iter_mut().find(|(ok, _)| ok == k) {
                Some(slot) => slot.1 = v.to_string(),
                None => out.push((k.to_string(), v.to_string())),
            }
        }
        out
    }

    /// Sets `key` (replacing an earlier value in place).
    pub fn set_env(&mut self, key: &str, value: &str) {
        let entry = format!("{key}={value}");
        match self
            .env
            .iter_mut()
            .find(|e| e.split_once('=').map_or(e.as_str(), |(k, _)| k) == key)
        {
            Some(slot) => *slot = entry,
            None => self.env.push(entry),
        }
    }

    /// `upper` stacked over `self`: environments merge (upper wins per key), every other
    /// field is upper's when upper sets it.
    pub fn overlay(&self, upper: &ImageConfig) -> ImageConfig {
        let mut out = self.clone();
        for (k, v) in upper.env_pairs() {
            out.set_env(&k, &v);
        }
        macro_rules! take {
            ($($f:ident),*) => {$(if upper.$f.is_some() { out.$f = upper.$f.clone(); })*};
        }
        take!(
            working_dir,
            user,
            cmd,
            entrypoint,
            stop_signal,
            healthcheck,
            shell
        );
        out.labels.extend(upper.labels.clone());
        for p in &upper.exposed_ports {
            if !out.exposed_ports.contains(p) {
                out.exposed_ports.push(p.clone());
            }
        }
        out
    }
}

/// `HEALTHCHECK`: kept in the configuration (Warren does not run it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Healthcheck {
    /// `["NONE"]`, `["CMD", args...]` or `["CMD-SHELL", command]`.
    pub test: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_period_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries: Option<u32>,
}

/// What a garbage collection did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GcReport {
    /// Layers unmounted and deleted.
    pub removed: Vec<String>,
    pub freed_bytes: u64,
    /// Layers no image references that live sandboxes (or imports in progress) still use:
    /// kept until they are released.
    pub in_use: Vec<String>,
}

/// `DELETE /v1/images/{ref}`: the tag is gone; `gc` is the collection that followed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageDeleted {
    pub reference: String,
    pub gc: GcReport,
}

/// `POST /v1/images/import` and `POST /v1/images/pull`: the image made and what it took.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImageImported {
    pub image: ImageInfo,
    /// Layers converted by this import.
    pub converted: usize,
    /// Layers found already converted.
    pub reused: usize,
    /// Bytes of layer data read (as stored: compressed if compressed).
    pub bytes_read: u64,
    pub seconds: f64,
}

/// `POST /v1/images/pull`: an image of an OCI registry, converted and tagged on the node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PullRequest {
    /// `host[:port]/repo[:tag|@digest]`.
    pub reference: String,
    /// `name[:tag]` of the new image.
    pub tag: String,
    /// Plain HTTP instead of HTTPS.
    #[serde(default)]
    pub insecure: bool,
    /// Registry credentials; anonymous when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// Replace an image of the same tag; without it such a tag is refused (409 `conflict`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub force: bool,
}

impl std::fmt::Display for PullRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} as {}", self.reference, self.tag)
    }
}

/// `POST /v1/images/build`: the build's options (query parameters; the body is the build
/// context as a tar).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BuildOptions {
    /// `name[:tag]` of the image made.
    pub tag: String,
    /// The Dockerfile's path inside the context (default `Dockerfile`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dockerfile: Option<String>,
    /// `--build-arg` values.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub build_args: std::collections::BTreeMap<String, String>,
    /// The stage to build (default: the last).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Runs every step even when the cache holds its result.
    #[serde(default)]
    pub no_cache: bool,
    /// `FROM` images of registries are pulled over plain HTTP (a registry on loopback, a
    /// lab's own), as `POST /v1/images/pull` with `insecure`.
    #[serde(default)]
    pub insecure: bool,
    /// `none` forbids the network to `RUN`; absent or `default`: the node's configured
    /// services.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    /// Limits of each `RUN`'s sandbox (node defaults when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_mb: Option<u64>,
    /// Longest a `RUN` may take (default 1800 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_timeout_secs: Option<f64>,
}

/// One line of a build's NDJSON log (`POST /v1/images/build`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum BuildEvent {
    /// Step `step` of `total` starts (`instruction` after argument substitution).
    Step {
        step: usize,
        total: usize,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stage: Option<String>,
        instruction: String,
    },
    /// The step's result came from the cache: nothing ran.
    Cached {
        step: usize,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        layer: Option<String>,
    },
    /// Output of a `RUN`, line by line (`stream`: `stdout` or `stderr`).
    Output {
        step: usize,
        stream: String,
        line: String,
    },
    /// The step ended (`layer`: what it added, if anything).
    StepDone {
        step: usize,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        layer: Option<String>,
        seconds: f64,
    },
    /// The build failed; nothing of it was kept. The last line of a failed build.
    Error {
        code: crate::ErrorCode,
        message: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        step: Option<usize>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        instruction: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exit_code: Option<i32>,
        /// The last lines of the failing command's output.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        output_tail: Vec<String>,
    },
    /// The image was made and tagged. The last line of a build that succeeded.
    Result {
        image: Box<ImageInfo>,
        steps_run: usize,
        steps_cached: usize,
        seconds: f64,
    },
}
