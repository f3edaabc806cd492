//! Reading what an archive holds: `docker save` archives (`manifest.json`) and OCI image
//! layouts (`index.json` + `blobs/`), as a directory or a tar file.

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::source::Source;
use crate::ImageError;

/// Layer media types we convert (compression is detected from the bytes).
const LAYER_TYPES: &[&str] = &[
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd",
    "application/vnd.docker.image.rootfs.diff.tar",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
    "application/vnd.docker.image.rootfs.diff.tar.zstd",
];
const MANIFEST_TYPES: &[&str] = &[
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
];
const INDEX_TYPES: &[&str] = &[
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];

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
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct DockerEntry {
    config: String,
    #[serde(default)]
    repo_tags: Option<Vec<String>>,
    layers: Vec<String>,
}

#[derive(Deserialize)]
struct Config {
    rootfs: RootFs,
}

#[derive(Deserialize)]
struct RootFs {
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    diff_ids: Vec<String>,
}

#[derive(Deserialize, Clone)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Descriptor {
    #[serde(default)]
    pub media_type: String,
    pub digest: String,
    #[serde(default)]
    pub size: u64,
    #[serde(default)]
    pub annotations: Option<std::collections::BTreeMap<String, String>>,
    #[serde(default)]
    pub platform: Option<Platform>,
}

#[derive(Deserialize, Clone)]
pub(crate) struct Platform {
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub os: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Index {
    #[serde(default)]
    media_type: Option<String>,
    manifests: Vec<Descriptor>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Manifest {
    #[serde(default)]
    media_type: Option<String>,
    config: Descriptor,
    layers: Vec<Descriptor>,
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

fn diff_ids(src: &Source, config: &[u8]) -> Result<Vec<String>, ImageError> {
    let c: Config = parse(src, "image config", config)?;
    if !c.rootfs.kind.is_empty() && c.rootfs.kind != "layers" {
        return Err(bad(
            src,
            format!("image config rootfs type {:?}", c.rootfs.kind),
        ));
    }
    Ok(c.rootfs.diff_ids)
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
    })
}

fn plan_oci(src: &Source) -> Result<Plan, ImageError> {
    let index: Index = parse(src, "index.json", &src.read_small("index.json")?)?;
    if let Some(t) = &index.media_type {
        if !INDEX_TYPES.contains(&t.as_str()) {
            return Err(ImageError::UnsupportedMedia {
                media_type: t.clone(),
                what: "index.json".into(),
            });
        }
    }
    let mut desc = pick(src, &index.manifests)?;
    let mut suggested = ref_name(&desc);
    // A nested index (multi-platform image): pick from it.
    for _ in 0..4 {
        if !INDEX_TYPES.contains(&desc.media_type.as_str()) {
            break;
        }
        let data = verified(src, &blob_member(src, &desc.digest)?, &desc.digest)?;
        let inner: Index = parse(src, "image index", &data)?;
        desc = pick(src, &inner.manifests)?;
        suggested = suggested.or_else(|| ref_name(&desc));
    }
    if !desc.media_type.is_empty() && !MANIFEST_TYPES.contains(&desc.media_type.as_str()) {
        return Err(ImageError::UnsupportedMedia {
            media_type: desc.media_type.clone(),
            what: format!("manifest {}", desc.digest),
        });
    }
    let data = verified(src, &blob_member(src, &desc.digest)?, &desc.digest)?;
    let m: Manifest = parse(src, "image manifest", &data)?;
    if let Some(t) = &m.media_type {
        if !MANIFEST_TYPES.contains(&t.as_str()) {
            return Err(ImageError::UnsupportedMedia {
                media_type: t.clone(),
                what: format!("manifest {}", desc.digest),
            });
        }
    }
    let config = verified(src, &blob_member(src, &m.config.digest)?, &m.config.digest)?;
    let ids = diff_ids(src, &config)?;
    if ids.len() != m.layers.len() {
        return Err(bad(
            src,
            format!(
                "{} layers but the config lists {} diff ids",
                m.layers.len(),
                ids.len()
            ),
        ));
    }
    let mut layers = Vec::new();
    for (l, id) in m.layers.iter().zip(ids) {
        if !LAYER_TYPES.contains(&l.media_type.as_str()) {
            return Err(ImageError::UnsupportedMedia {
                media_type: l.media_type.clone(),
                what: format!("layer {}", l.digest),
            });
        }
        layers.push(PlannedLayer {
            member: blob_member(src, &l.digest)?,
            digest: Some(l.digest.clone()),
            diff_id: Some(id),
            size: Some(l.size),
        });
    }
    Ok(Plan {
        layers,
        suggested_tag: suggested,
    })
}

fn ref_name(d: &Descriptor) -> Option<String> {
    d.annotations
        .as_ref()
        .and_then(|a| a.get("org.opencontainers.image.ref.name").cloned())
}

/// The manifest for this host: linux/amd64 (or no platform), else the only one.
fn pick(src: &Source, list: &[Descriptor]) -> Result<Descriptor, ImageError> {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        a => a,
    };
    list.iter()
        .find(|d| {
            d.platform
                .as_ref()
                .is_none_or(|p| p.os == "linux" && p.architecture == arch)
        })
        .or(if list.len() == 1 { list.first() } else { None })
        .cloned()
        .ok_or_else(|| bad(src, format!("no image for linux/{arch} in the index")))
}
