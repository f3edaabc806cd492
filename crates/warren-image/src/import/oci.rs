//! Reading what an archive holds: `docker save` archives (`manifest.json`) and OCI image
//! layouts (`index.json` + `blobs/`), as a directory or a tar file.

use oci_spec::image::{
    Descriptor, ImageConfiguration, ImageIndex, ImageManifest, MediaType, Os, Platform,
    ANNOTATION_REF_NAME,
};
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::source::Source;
use crate::ImageError;

/// Docker's layer media types (oci-spec's `MediaType` holds them as `Other`).
const DOCKER_LAYER_TYPES: &[&str] = &[
    "application/vnd.docker.image.rootfs.diff.tar",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
    "application/vnd.docker.image.rootfs.diff.tar.zstd",
];
const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
const DOCKER_INDEX: &str = "application/vnd.docker.distribution.manifest.list.v2+json";

/// A layer media type we convert: OCI or docker tar, plain, gzip or zstd (compression is
/// detected from the bytes).
fn is_layer(t: &MediaType) -> bool {
    match t {
        MediaType::ImageLayer | MediaType::ImageLayerGzip | MediaType::ImageLayerZstd => true,
        MediaType::Other(t) => DOCKER_LAYER_TYPES.contains(&t.as_str()),
        _ => false,
    }
}

/// An OCI image manifest or a docker v2 (schema 2) one.
fn is_manifest(t: &MediaType) -> bool {
    match t {
        MediaType::ImageManifest => true,
        MediaType::Other(t) => t == DOCKER_MANIFEST,
        _ => false,
    }
}

/// An OCI image index or a docker manifest list.
fn is_index(t: &MediaType) -> bool {
    match t {
        MediaType::ImageIndex => true,
        MediaType::Other(t) => t == DOCKER_INDEX,
        _ => false,
    }
}

/// The host's architecture as image platforms name it.
pub(super) fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        a => a,
    }
}

/// Whether `p` is linux on the host's architecture.
pub(super) fn is_host(p: &Platform) -> bool {
    *p.os() == Os::Linux && p.architecture().to_string() == host_arch()
}

/// One layer to convert.
#[derive(Debug, Clone)]
pub(crate) struct PlannedLayer {
    pub member: String,
    /// Digest of the member's bytes as stored, when the archive names it.
    pub digest: Option<String>,
    /// Digest of the uncompressed tar (from the image config).
    pub diff_id: Option<String>,
    pub size: Option<u64>,
}

/// What to import: the layers, lowest first, and the archive's own name for the image.
#[derive(Debug)]
pub(crate) struct Plan {
    pub layers: Vec<PlannedLayer>,
    pub suggested_tag: Option<String>,
    /// The image's run configuration (`config` of the OCI image config), when it has one.
    pub config: Option<warren_types::ImageConfig>,
}

/// The run configuration of an OCI or docker image config (`config`: `Env`, `WorkingDir`,
/// `User`, `Cmd`, `Entrypoint`, `Labels`, `ExposedPorts`, `StopSignal`, `Healthcheck`,
/// `Shell`). Read leniently: a field of the wrong shape is left out, never an error (the
/// layers are what an import must get right).
pub(crate) fn run_config(config: &[u8]) -> Option<warren_types::ImageConfig> {
    let v: Value = serde_json::from_slice(config).ok()?;
    let c = v.get("config").or_else(|| v.get("Config"))?;
    let strings = |k: &str| -> Option<Vec<String>> {
        c.get(k)?
            .as_array()?
            .iter()
            .map(|x| x.as_str().map(str::to_string))
            .collect()
    };
    let text = |k: &str| {
        c.get(k)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    let mut out = warren_types::ImageConfig {
        env: strings("Env").unwrap_or_default(),
        working_dir: text("WorkingDir"),
        user: text("User"),
        cmd: strings("Cmd"),
        entrypoint: strings("Entrypoint"),
        stop_signal: text("StopSignal"),
        shell: strings("Shell"),
        ..Default::default()
    };
    if let Some(l) = c.get("Labels").and_then(Value::as_object) {
        for (k, v) in l {
            if let Some(v) = v.as_str() {
                out.labels.insert(k.clone(), v.to_string());
            }
        }
    }
    if let Some(p) = c.get("ExposedPorts").and_then(Value::as_object) {
        out.exposed_ports = p.keys().cloned().collect();
    }
    if let Some(h) = c.get("Healthcheck").and_then(Value::as_object) {
        let ms = |k: &str| h.get(k).and_then(Value::as_u64).map(|ns| ns / 1_000_000);
        out.healthcheck = Some(warren_types::Healthcheck {
            test: h
                .get("Test")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|x| x.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default(),
            interval_ms: ms("Interval"),
            timeout_ms: ms("Timeout"),
            start_period_ms: ms("StartPeriod"),
            retries: h.get("Retries").and_then(Value::as_u64).map(|r| r as u32),
        });
    }
    (out != warren_types::ImageConfig::default()).then_some(out)
}

/// One image of `docker save`'s `manifest.json`, a format oci-spec does not model.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct DockerEntry {
    config: String,
    #[serde(default)]
    repo_tags: Option<Vec<String>>,
    layers: Vec<String>,
}

fn bad(src: &Source, msg: impl Into<String>) -> ImageError {
    ImageError::archive(src.name(), msg)
}

/// `sha256:<hex>` → `blobs/sha256/<hex>`; other algorithms are refused.
fn blob_member(src: &Source, digest: &str) -> Result<String, ImageError> {
    match digest.split_once(':') {
        Some(("sha256", hex)) if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) => {
            Ok(format!("blobs/sha256/{hex}"))
        }
        _ => Err(bad(
            src,
            format!("unsupported digest {digest:?} (sha256 only)"),
        )),
    }
}

/// Reads a small blob and checks it against its digest.
fn verified(src: &Source, member: &str, digest: &str) -> Result<Vec<u8>, ImageError> {
    let data = src.read_small(member)?;
    let found = format!("sha256:{}", hex::encode(Sha256::digest(&data)));
    if found != digest {
        return Err(ImageError::DigestMismatch {
            what: format!("{member} in {}", src.name()),
            expected: digest.to_string(),
            found,
        });
    }
    Ok(data)
}

/// The digest a member's name states, if it states one (`blobs/sha256/<hex>`,
/// `<hex>.json`, `<hex>/layer.tar` is not one: that hex is a layer id).
fn named_digest(member: &str) -> Option<String> {
    let m = member.trim_start_matches("./");
    let hex = m
        .strip_prefix("blobs/sha256/")
        .or_else(|| m.strip_suffix(".json").filter(|h| !h.contains('/')))?;
    (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())).then(|| format!("sha256:{hex}"))
}

fn parse<T: serde::de::DeserializeOwned>(
    src: &Source,
    what: &str,
    data: &[u8],
) -> Result<T, ImageError> {
    serde_json::from_slice(data).map_err(|e| bad(src, format!("{what}: {e}")))
}

/// The config's diff ids, read through oci-spec's `ImageConfiguration`. That type requires
/// `architecture`, `os`, `rootfs.type` and `rootfs.diff_ids`, which docker may leave out (moby
/// writes `architecture`, `os` and `diff_ids` with `omitempty`) and the import does not use:
/// absent ones are filled in empty first, so such configs import as before. A config without
/// a `rootfs` is refused.
fn diff_ids(src: &Source, config: &[u8]) -> Result<Vec<String>, ImageError> {
    let mut v: Value = parse(src, "image config", config)?;
    if let Some(c) = v.as_object_mut() {
        for key in ["architecture", "os"] {
            c.entry(key).or_insert_with(|| "".into());
        }
        if let Some(r) = c.get_mut("rootfs").and_then(Value::as_object_mut) {
            r.entry("type").or_insert_with(|| "".into());
            r.entry("diff_ids")
                .or_insert_with(|| Value::Array(Vec::new()));
        }
    }
    let c =
        ImageConfiguration::deserialize(v).map_err(|e| bad(src, format!("image config: {e}")))?;
    let kind = c.rootfs().typ();
    if !kind.is_empty() && kind != "layers" {
        return Err(bad(src, format!("image config rootfs type {kind:?}")));
    }
    Ok(c.rootfs().diff_ids().clone())
}

/// Reads what `src` holds.
pub(crate) fn plan(src: &Source) -> Result<Plan, ImageError> {
    if src.exists("manifest.json") {
        return plan_docker(src);
    }
    if src.exists("index.json") {
        return plan_oci(src);
    }
    Err(bad(
        src,
        "neither a docker archive (manifest.json) nor an OCI image layout (index.json)",
    ))
}

fn plan_docker(src: &Source) -> Result<Plan, ImageError> {
    let entries: Vec<DockerEntry> = parse(src, "manifest.json", &src.read_small("manifest.json")?)?;
    let e = match entries.len() {
        1 => &entries[0],
        0 => return Err(bad(src, "manifest.json lists no image")),
        n => {
            return Err(bad(
                src,
                format!("manifest.json lists {n} images; save one image per archive"),
            ))
        }
    };
    let config = match named_digest(&e.config) {
        Some(d) => verified(src, &e.config, &d)?,
        None => src.read_small(&e.config)?,
    };
    let ids = diff_ids(src, &config)?;
    if ids.len() != e.layers.len() {
        return Err(bad(
            src,
            format!(
                "{} layers but the config lists {} diff ids",
                e.layers.len(),
                ids.len()
            ),
        ));
    }
    let layers = e
        .layers
        .iter()
        .zip(ids)
        .map(|(m, id)| PlannedLayer {
            member: m.clone(),
            digest: named_digest(m),
            diff_id: Some(id),
            size: None,
        })
        .collect();
    Ok(Plan {
        layers,
        suggested_tag: e.repo_tags.as_ref().and_then(|t| t.first().cloned()),
        config: run_config(&config),
    })
}

fn plan_oci(src: &Source) -> Result<Plan, ImageError> {
    let index: ImageIndex = parse(src, "index.json", &src.read_small("index.json")?)?;
    if let Some(t) = index.media_type() {
        if !is_index(t) {
            return Err(ImageError::UnsupportedMedia {
                media_type: t.to_string(),
                what: "index.json".into(),
            });
        }
    }
    let mut desc = pick(src, index.manifests())?;
    let mut suggested = ref_name(&desc);
    // A nested index (multi-platform image): pick from it.
    for _ in 0..4 {
        if !is_index(desc.media_type()) {
            break;
        }
        let digest = desc.digest().as_ref();
        let data = verified(src, &blob_member(src, digest)?, digest)?;
        let inner: ImageIndex = parse(src, "image index", &data)?;
        desc = pick(src, inner.manifests())?;
        suggested = suggested.or_else(|| ref_name(&desc));
    }
    // An empty media type is read as a manifest (the manifest's own media type is checked).
    let kind = desc.media_type();
    if !kind.as_ref().is_empty() && !is_manifest(kind) {
        return Err(ImageError::UnsupportedMedia {
            media_type: kind.to_string(),
            what: format!("manifest {}", desc.digest()),
        });
    }
    let digest = desc.digest().as_ref();
    let data = verified(src, &blob_member(src, digest)?, digest)?;
    let m: ImageManifest = parse(src, "image manifest", &data)?;
    if let Some(t) = m.media_type() {
        if !is_manifest(t) {
            return Err(ImageError::UnsupportedMedia {
                media_type: t.to_string(),
                what: format!("manifest {digest}"),
            });
        }
    }
    let config_digest = m.config().digest().as_ref();
    let config = verified(src, &blob_member(src, config_digest)?, config_digest)?;
    let ids = diff_ids(src, &config)?;
    if ids.len() != m.layers().len() {
        return Err(bad(
            src,
            format!(
                "{} layers but the config lists {} diff ids",
                m.layers().len(),
                ids.len()
            ),
        ));
    }
    let mut layers = Vec::new();
    for (l, id) in m.layers().iter().zip(ids) {
        if !is_layer(l.media_type()) {
            return Err(ImageError::UnsupportedMedia {
                media_type: l.media_type().to_string(),
                what: format!("layer {}", l.digest()),
            });
        }
        let digest = l.digest().as_ref();
        layers.push(PlannedLayer {
            member: blob_member(src, digest)?,
            digest: Some(digest.to_string()),
            diff_id: Some(id),
            size: Some(l.size()),
        });
    }
    Ok(Plan {
        layers,
        suggested_tag: suggested,
        config: run_config(&config),
    })
}

fn ref_name(d: &Descriptor) -> Option<String> {
    d.annotations()
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_REF_NAME).cloned())
}

/// The manifest for this host: linux/amd64 (or no platform), else the only one.
fn pick(src: &Source, list: &[Descriptor]) -> Result<Descriptor, ImageError> {
    list.iter()
        .find(|d| d.platform().as_ref().is_none_or(is_host))
        .or(if list.len() == 1 { list.first() } else { None })
        .cloned()
        .ok_or_else(|| {
            bad(
                src,
                format!("no image for linux/{} in the index", host_arch()),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// An OCI layout directory being written: blobs by digest, then `index.json`.
    struct Layout(tempfile::TempDir);

    impl Layout {
        fn new() -> Layout {
            Layout(tempfile::tempdir().expect("tempdir"))
        }

        /// Stores `data` as a blob; returns its descriptor.
        fn blob(&self, media_type: &str, data: &[u8]) -> Value {
            let hex = hex::encode(Sha256::digest(data));
            let dir = self.0.path().join("blobs/sha256");
            std::fs::create_dir_all(&dir).expect("blobs dir");
            std::fs::write(dir.join(&hex), data).expect("blob");
            json!({"mediaType": media_type, "digest": format!("sha256:{hex}"), "size": data.len()})
        }

        fn json(&self, media_type: &str, v: &Value) -> Value {
            self.blob(media_type, &serde_json::to_vec(v).expect("json"))
        }

        fn plan(&self, index: &Value) -> Result<Plan, ImageError> {
            std::fs::write(self.0.path().join("index.json"), index.to_string()).expect("index");
            plan(&Source::open(self.0.path())?)
        }
    }

    /// The plan of a layout holding one image without layers whose config is `config`.
    fn plan_of_config(config: &Value) -> Result<Plan, ImageError> {
        let l = Layout::new();
        let config = l.json("c", config);
        let m = l.json(
            "application/vnd.oci.image.manifest.v1+json",
            &json!({"schemaVersion": 2, "config": config, "layers": []}),
        );
        l.plan(&json!({"schemaVersion": 2, "manifests": [m]}))
    }

    fn with_platform(mut d: Value, os: &str, arch: &str) -> Value {
        d["platform"] = json!({"os": os, "architecture": arch});
        d
    }

    /// A docker v2 image (as `docker buildx` pushes it) in a layout: the config's own fields
    /// (`null`s, `ExposedPorts`, `container_config`, history) are read, not refused.
    fn docker_image(l: &Layout, layer_types: &[&str]) -> Value {
        let layers: Vec<Value> = layer_types
            .iter()
            .enumerate()
            .map(|(i, t)| l.blob(t, format!("layer {i}").as_bytes()))
            .collect();
        let ids: Vec<String> = (0..layers.len())
            .map(|i| format!("sha256:{:064x}", i + 1))
            .collect();
        let config = l.json(
            "application/vnd.docker.container.image.v1+json",
            &json!({
                "architecture": host_arch(),
                "os": "linux",
                "created": "2024-01-01T00:00:00Z",
                "config": {"Env": null, "Cmd": ["/bin/sh"], "ExposedPorts": {"80/tcp": {}},
                           "Volumes": null, "Labels": null, "OnBuild": null},
                "container_config": {"Hostname": ""},
                "history": [{"created_by": "x", "empty_layer": true}],
                "rootfs": {"type": "layers", "diff_ids": ids},
            }),
        );
        l.json(
            DOCKER_MANIFEST,
            &json!({"schemaVersion": 2, "mediaType": DOCKER_MANIFEST, "config": config,
                    "layers": layers}),
        )
    }

    #[test]
    fn a_docker_manifest_list_picks_this_host_and_takes_docker_layer_types() {
        let l = Layout::new();
        let layer_types = [
            "application/vnd.docker.image.rootfs.diff.tar.gzip",
            "application/vnd.docker.image.rootfs.diff.tar",
            "application/vnd.docker.image.rootfs.diff.tar.zstd",
            "application/vnd.oci.image.layer.v1.tar+zstd",
        ];
        let ours = with_platform(docker_image(&l, &layer_types), "linux", host_arch());
        let other = with_platform(docker_image(&l, &layer_types[..1]), "linux", "s390x");
        let attestation = with_platform(docker_image(&l, &[]), "unknown", "unknown");
        let list = l.json(
            DOCKER_INDEX,
            &json!({"schemaVersion": 2, "mediaType": DOCKER_INDEX,
                    "manifests": [other, ours.clone(), attestation]}),
        );
        let mut outer = list;
        outer["annotations"] = json!({(ANNOTATION_REF_NAME): "example/app:1"});
        let p = l
            .plan(&json!({"schemaVersion": 2, "manifests": [outer]}))
            .expect("plan");
        assert_eq!(p.suggested_tag.as_deref(), Some("example/app:1"));
        assert_eq!(p.layers.len(), 4);
        let digest = |i: usize| {
            format!(
                "sha256:{}",
                hex::encode(Sha256::digest(format!("layer {i}")))
            )
        };
        for (i, pl) in p.layers.iter().enumerate() {
            assert_eq!(pl.digest.as_deref(), Some(digest(i).as_str()));
            assert_eq!(pl.member, format!("blobs/{}", digest(i).replace(':', "/")));
            assert_eq!(pl.diff_id, Some(format!("sha256:{:064x}", i + 1)));
            assert_eq!(pl.size, Some(7));
        }
    }

    #[test]
    fn a_config_without_what_moby_leaves_out_is_read() {
        let l = Layout::new();
        let layer = l.blob("application/vnd.oci.image.layer.v1.tar", b"layer");
        let config = l.json(
            "application/vnd.oci.image.config.v1+json",
            &json!({"rootfs": {"type": "layers", "diff_ids": [format!("sha256:{:064x}", 1)]}}),
        );
        let m = l.json(
            "application/vnd.oci.image.manifest.v1+json",
            &json!({"schemaVersion": 2, "config": config, "layers": [layer]}),
        );
        let p = l
            .plan(&json!({"schemaVersion": 2, "manifests": [m]}))
            .expect("no architecture, os");
        assert_eq!(p.layers.len(), 1);

        // No layers: moby leaves out `diff_ids` too (the import then says it has no layers).
        let p = plan_of_config(&json!({"rootfs": {"type": "layers"}})).expect("no diff ids");
        assert!(p.layers.is_empty());

        // No rootfs at all is refused.
        let e = plan_of_config(&json!({"architecture": "amd64", "os": "linux"}))
            .expect_err("no rootfs");
        assert!(e.to_string().contains("missing field `rootfs`"), "{e}");
    }

    #[test]
    fn what_is_not_an_image_for_this_host_is_refused_as_before() {
        let media = |e: ImageError| match e {
            ImageError::UnsupportedMedia { media_type, .. } => media_type,
            e => panic!("{e}"),
        };
        for t in [
            "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
            "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip",
            "application/vnd.oci.image.layer.v1.tar+encrypted",
        ] {
            let l = Layout::new();
            let m = docker_image(&l, &[t]);
            let e = l.plan(&json!({"schemaVersion": 2, "manifests": [m]}));
            assert_eq!(media(e.expect_err(t)), t);
        }

        // A manifest of another kind, named by the index or by itself.
        let l = Layout::new();
        let mut m = docker_image(&l, &["application/vnd.oci.image.layer.v1.tar"]);
        m["mediaType"] = json!("application/vnd.oci.artifact.manifest.v1+json");
        let e = l.plan(&json!({"schemaVersion": 2, "manifests": [m]}));
        assert_eq!(
            media(e.expect_err("artifact")),
            "application/vnd.oci.artifact.manifest.v1+json"
        );
        let l = Layout::new();
        let m = l.json(
            "application/vnd.oci.image.manifest.v1+json",
            &json!({"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v1+json",
                    "config": l.blob("x/y", b"{}"), "layers": []}),
        );
        let e = l.plan(&json!({"schemaVersion": 2, "manifests": [m]}));
        assert!(media(e.expect_err("schema 1")).ends_with("manifest.v1+json"));

        // Two images, neither for this host.
        let l = Layout::new();
        let a = with_platform(docker_image(&l, &[]), "linux", "s390x");
        let b = with_platform(docker_image(&l, &[]), "windows", host_arch());
        let e = l
            .plan(&json!({"schemaVersion": 2, "manifests": [a, b]}))
            .expect_err("no host image");
        assert!(
            e.to_string()
                .contains(&format!("no image for linux/{}", host_arch())),
            "{e}"
        );

        // A digest of another algorithm; a rootfs that is not layers.
        let l = Layout::new();
        let d = json!({"mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "digest": format!("sha512:{}", "a".repeat(128)), "size": 1});
        let e = l
            .plan(&json!({"schemaVersion": 2, "manifests": [d]}))
            .expect_err("sha512");
        assert!(e.to_string().contains("sha256 only"), "{e}");
        let e = plan_of_config(&json!({"architecture": "amd64", "os": "linux",
                                       "rootfs": {"type": "other", "diff_ids": []}}))
        .expect_err("rootfs type");
        assert!(e.to_string().contains("rootfs type \"other\""), "{e}");
    }
}
