//! Pulling an image from an OCI registry (the distribution protocol through `oci-client`):
//! the manifest, config and the layers not converted before are written as an OCI image
//! layout in the store's `tmp/`, which is then imported like any layout (every blob
//! digest-checked again) and removed.

use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::manifest::OciDescriptor;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use serde_json::json;
use std::path::Path;
use std::sync::Arc;

use super::ImportReport;
use crate::store::ImageStore;
use crate::ImageError;

const ACCEPT: &[&str] = &[
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];

/// How to reach the registry.
#[derive(Debug, Clone, Default)]
pub struct RegistryOptions {
    /// Plain HTTP instead of HTTPS (a registry on loopback, a lab registry).
    pub insecure: bool,
    /// `user:password` for basic/token authentication; anonymous when unset.
    pub credentials: Option<(String, String)>,
    /// The tenant the image is for (see [`crate::ImageStore::import_owned`]); `None` for the
    /// node's own images.
    pub owner: Option<String>,
}

fn err(e: impl std::fmt::Display) -> ImageError {
    ImageError::Registry(e.to_string())
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Manifest {
    #[serde(default)]
    media_type: Option<String>,
    #[serde(default)]
    manifests: Option<Vec<serde_json::Value>>,
    #[serde(default)]
    config: Option<OciDescriptor>,
    #[serde(default)]
    layers: Vec<OciDescriptor>,
}

fn hex(digest: &str) -> Result<&str, ImageError> {
    crate::files::hex_of(digest).map_err(|_| err(format!("unsupported digest {digest:?}")))
}

async fn pull_to(
    client: &Client,
    r: &Reference,
    d: &OciDescriptor,
    blobs: &Path,
) -> Result<(), ImageError> {
    let path = blobs.join(hex(&d.digest)?);
    let f = tokio::fs::File::create(&path)
        .await
        .map_err(|e| ImageError::io(format!("create {}", path.display()), e))?;
    client
        .pull_blob(r, d, f)
        .await
        .map_err(|e| err(format!("pulling {}: {e}", d.digest)))
}

/// Imports `reference` (`host[:port]/repo[:tag|@digest]`) and tags it `tag`.
pub async fn import_registry(
    store: Arc<ImageStore>,
    reference: &str,
    tag: &str,
    opts: &RegistryOptions,
) -> Result<ImportReport, ImageError> {
    let (name, t) = crate::store::split_ref(tag)?;
    store.check_claim(&name, &t, opts.owner.as_deref())?;
    let r: Reference = reference
        .parse()
        .map_err(|e| ImageError::BadRef(format!("{reference}: {e}")))?;
    let client = Client::new(ClientConfig {
        protocol: if opts.insecure {
            ClientProtocol::Http
        } else {
            ClientProtocol::Https
        },
        ..Default::default()
    });
    let auth = match &opts.credentials {
        Some((u, p)) => RegistryAuth::Basic(u.clone(), p.clone()),
        None => RegistryAuth::Anonymous,
    };
    let (mut body, mut digest) = client
        .pull_manifest_raw(&r, &auth, ACCEPT)
        .await
        .map_err(|e| err(format!("{reference}: {e}")))?;
    let mut m: Manifest =
        serde_json::from_slice(&body).map_err(|e| err(format!("manifest: {e}")))?;
    let mut media_type = m.media_type.clone().unwrap_or_default();
    if let Some(list) = m.manifests.take() {
        // An index: the manifest for this host.
        let arch = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            a => a,
        };
        let pick = list
            .iter()
            .find(|d| d["platform"]["os"] == "linux" && d["platform"]["architecture"] == arch)
            .or(if list.len() == 1 { list.first() } else { None })
            .and_then(|d| d["digest"].as_str().map(str::to_string))
            .ok_or_else(|| err(format!("{reference}: no image for linux/{arch}")))?;
        let by_digest = r.clone_with_digest(pick);
        (body, digest) = client
            .pull_manifest_raw(&by_digest, &auth, ACCEPT)
            .await
            .map_err(|e| err(format!("{reference}: {e}")))?;
        m = serde_json::from_slice(&body).map_err(|e| err(format!("manifest: {e}")))?;
        media_type = m.media_type.clone().unwrap_or_default();
    }
    let config = m
        .config
        .clone()
        .ok_or_else(|| err(format!("{reference}: the manifest has no config")))?;
    if media_type.is_empty() {
        media_type = "application/vnd.oci.image.manifest.v1+json".into();
    }
    let dir = store.tmp_path("registry");
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).map_err(|e| ImageError::io("create layout", e))?;
    let result = async {
        std::fs::write(blobs.join(hex(&digest)?), &body)
            .map_err(|e| ImageError::io("write manifest", e))?;
        pull_to(&client, &r, &config, &blobs).await?;
        for l in &m.layers {
            // A layer converted before is not fetched again.
            if store.converted(&l.digest).is_none() {
                pull_to(&client, &r, l, &blobs).await?;
            }
        }
        let index = json!({
            "schemaVersion": 2,
            "manifests": [{
                "mediaType": media_type,
                "digest": digest,
                "size": body.len(),
            }],
        });
        std::fs::write(dir.join("index.json"), index.to_string())
            .map_err(|e| ImageError::io("write index.json", e))?;
        std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#)
            .map_err(|e| ImageError::io("write oci-layout", e))?;
        let (s, d, t, src, owner) = (
            store.clone(),
            dir.clone(),
            tag.to_string(),
            format!("registry:{reference}"),
            opts.owner.clone(),
        );
        tokio::task::spawn_blocking(move || s.import_archive(&d, Some(&t), &src, owner.as_deref()))
            .await
            .map_err(err)?
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}
