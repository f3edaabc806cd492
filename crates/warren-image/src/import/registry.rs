//! Pulling an image from an OCI registry (the distribution protocol through `oci-client`):
//! the manifest, config and the layers not converted before are written as an OCI image
//! layout in the store's `tmp/`, which is then imported like any layout (every blob
//! digest-checked again) and removed.

use oci_client::client::{ClientConfig, ClientProtocol, LayerDescriptor};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use oci_spec::image::{Descriptor, ImageIndex, ImageManifest, MediaType};
use serde_json::{json, Value};
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
    /// Replace an image of the same tag (else such a tag is refused, [`ImageError::Exists`]).
    pub replace: bool,
}

fn err(e: impl std::fmt::Display) -> ImageError {
    ImageError::Registry(e.to_string())
}

/// A failed registry call about `what`: one that never got an answer (no connection, TLS, a
/// timeout) is [`ImageError::RegistryUnreachable`], naming the registry; any other is the
/// registry's own refusal.
fn call_err(host: &str, what: &str, e: oci_client::errors::OciDistributionError) -> ImageError {
    use oci_client::errors::OciDistributionError as E;
    match e {
        E::RequestError(e) => ImageError::RegistryUnreachable(format!(
            "cannot reach the registry {host} ({what}): {e}{}",
            std::error::Error::source(&e)
                .map(|s| format!(": {s}"))
                .unwrap_or_default()
        )),
        e => err(format!("{what}: {e}")),
    }
}

/// What the registry answered for a reference: an index (or docker manifest list) or a
/// manifest, told apart by a `manifests` list (both may leave out their media type).
enum Answer {
    Index(Box<ImageIndex>),
    Manifest(Box<ImageManifest>),
}

fn answer(reference: &str, body: &[u8]) -> Result<Answer, ImageError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| err(format!("manifest: {e}")))?;
    if v.get("manifests").is_some_and(|m| !m.is_null()) {
        return serde_json::from_value(v)
            .map(|i| Answer::Index(Box::new(i)))
            .map_err(|e| err(format!("manifest: {e}")));
    }
    // Looked for before the whole is read, so a manifest without one says so.
    if v.get("config").is_none_or(Value::is_null) {
        return Err(err(format!("{reference}: the manifest has no config")));
    }
    serde_json::from_value(v)
        .map(|m| Answer::Manifest(Box::new(m)))
        .map_err(|e| err(format!("manifest: {e}")))
}

fn hex(digest: &str) -> Result<&str, ImageError> {
    crate::files::hex_of(digest).map_err(|_| err(format!("unsupported digest {digest:?}")))
}

async fn pull_to(
    client: &Client,
    r: &Reference,
    d: &Descriptor,
    blobs: &Path,
) -> Result<(), ImageError> {
    let digest = d.digest().as_ref();
    let path = blobs.join(hex(digest)?);
    let f = tokio::fs::File::create(&path)
        .await
        .map_err(|e| ImageError::io(format!("create {}", path.display()), e))?;
    let layer = LayerDescriptor {
        digest,
        urls: d.urls(),
    };
    client
        .pull_blob(r, &layer, f)
        .await
        .map_err(|e| call_err(r.registry(), &format!("pulling {digest}"), e))
}

/// Imports `reference` (`host[:port]/repo[:tag|@digest]`) and tags it `tag`.
pub async fn import_registry(
    store: Arc<ImageStore>,
    reference: &str,
    tag: &str,
    opts: &RegistryOptions,
) -> Result<ImportReport, ImageError> {
    let (name, t) = crate::store::split_ref(tag)?;
    // A tag that exists is refused before the registry is asked, unless it was pulled from
    // this same reference: whether the pull would change it is known once its layers are
    // (`import_archive` checks; a pull of an unchanged image replaces nothing).
    let source = format!("registry:{reference}");
    let same_source = store
        .manifest(&format!("{name}:{t}"))
        .is_ok_and(|m| m.source == source);
    store.check_claim(
        &name,
        &t,
        opts.owner.as_deref(),
        opts.replace || same_source,
    )?;
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
        .map_err(|e| call_err(r.registry(), reference, e))?;
    let m = match answer(reference, &body)? {
        Answer::Manifest(m) => *m,
        Answer::Index(index) => {
            // An index: the manifest for this host.
            let list = index.manifests();
            let pick = list
                .iter()
                .find(|d| d.platform().as_ref().is_some_and(super::oci::is_host))
                .or(if list.len() == 1 { list.first() } else { None })
                .map(|d| d.digest().to_string())
                .ok_or_else(|| {
                    err(format!(
                        "{reference}: no image for linux/{}",
                        super::oci::host_arch()
                    ))
                })?;
            let by_digest = r.clone_with_digest(pick);
            (body, digest) = client
                .pull_manifest_raw(&by_digest, &auth, ACCEPT)
                .await
                .map_err(|e| call_err(r.registry(), reference, e))?;
            match answer(reference, &body)? {
                Answer::Manifest(m) => *m,
                Answer::Index(_) => {
                    return Err(err(format!("{reference}: the manifest has no config")))
                }
            }
        }
    };
    // A manifest that leaves out its media type (OCI allows it) is an OCI manifest.
    let media_type = m
        .media_type()
        .as_ref()
        .map(MediaType::to_string)
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| MediaType::ImageManifest.to_string());
    let dir = store.tmp_path("registry");
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).map_err(|e| ImageError::io("create layout", e))?;
    let result = async {
        std::fs::write(blobs.join(hex(&digest)?), &body)
            .map_err(|e| ImageError::io("write manifest", e))?;
        pull_to(&client, &r, m.config(), &blobs).await?;
        for l in m.layers() {
            // A layer converted before is not fetched again.
            if store.converted(l.digest().as_ref()).is_none() {
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
        let (s, d, t, src, owner, replace) = (
            store.clone(),
            dir.clone(),
            tag.to_string(),
            source,
            opts.owner.clone(),
            opts.replace,
        );
        tokio::task::spawn_blocking(move || {
            s.import_archive(&d, Some(&t), &src, owner.as_deref(), replace)
        })
        .await
        .map_err(err)?
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}
