//! The on-disk store (see the crate docs for the layout).

use serde::{Deserialize, Serialize};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use warren_types::{ImageInfo, LayerInfo};

use crate::files::{hex_of, now_ms, seq, sha256_file};
use crate::ImageError;

/// An image: an ordered stack of layers, lowest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImageManifest {
    pub name: String,
    pub tag: String,
    /// `sha256:<hex>` digests, lowest first (resolved when the image was made, so an image
    /// version never changes under its users).
    pub layers: Vec<String>,
    pub created_ms: u64,
    /// Where the layer came from (a directory, an archive, ...).
    pub source: String,
    pub size_bytes: u64,
    /// The refs the image was made of (other images, layer digests), lowest first; empty for
    /// images made from one directory or archive (and for images stored before stacks).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stack: Vec<String>,
    /// The tenant that imported the image, who alone (with admins) may see and use it;
    /// `None` for the node's own images, which every tenant may use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// How its sandboxes run (environment, working directory, user, command, ...): from the
    /// imported image's config or the Dockerfile it was built from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<warren_types::ImageConfig>,
}

/// A layer store rooted at a directory.
#[derive(Debug)]
pub struct ImageStore {
    root: PathBuf,
    mount_lock: Mutex<()>,
    /// Held while a tenant's tag is checked and written, so two imports cannot both claim it.
    claim_lock: Mutex<()>,
    /// Counts the tags this process wrote or removed (see [`ImageStore::changes`]).
    changes: std::sync::atomic::AtomicU64,
    pub(crate) source: std::sync::OnceLock<std::sync::Arc<dyn crate::LayerSource>>,
}

pub(crate) fn split_ref(r: &str) -> Result<(String, String), ImageError> {
    if r.starts_with("sha256:") {
        return Err(ImageError::BadRef(format!(
            "{r} is a layer digest, not an image name"
        )));
    }
    warren_types::validate::image_ref(r).map_err(|e| ImageError::BadRef(e.message))?;
    let (n, t) = r.split_once(':').unwrap_or((r, "latest"));
    Ok((n.to_string(), t.to_string()))
}

impl ImageStore {
    /// Opens (creating if needed) a store at `root`.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, ImageError> {
        let root = root.into();
        for d in [
            "blobs/sha256",
            "images",
            "layers",
            "leases",
            "index",
            "mnt",
            "tmp",
        ] {
            std::fs::create_dir_all(root.join(d))
                .map_err(|e| ImageError::io(format!("create {}", root.join(d).display()), e))?;
        }
        Ok(ImageStore {
            root,
            mount_lock: Mutex::new(()),
            claim_lock: Mutex::new(()),
            changes: std::sync::atomic::AtomicU64::new(0),
            source: std::sync::OnceLock::new(),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// A fresh path under the store's `tmp/` (same filesystem as the blobs).
    pub fn tmp_path(&self, what: &str) -> PathBuf {
        self.root.join("tmp").join(format!(
            "{what}-{}-{}-{}",
            std::process::id(),
            now_ms(),
            seq()
        ))
    }

    /// Path of a layer's blob.
    pub fn blob_path(&self, digest: &str) -> Result<PathBuf, ImageError> {
        Ok(self.root.join("blobs/sha256").join(hex_of(digest)?))
    }

    fn manifest_path(&self, name: &str, tag: &str) -> PathBuf {
        self.root
            .join("images")
            .join(name)
            .join(format!("{tag}.json"))
    }

    /// Builds an EROFS layer from a directory with `mkfs.erofs`, stores it by digest and tags
    /// it as image `tag` (a one-layer image).
    pub fn build_layer(&self, dir: &Path, tag: &str) -> Result<ImageManifest, ImageError> {
        let (name, t) = split_ref(tag)?;
        if !dir.is_dir() {
            return Err(ImageError::Build {
                dir: dir.display().to_string(),
                message: "not a directory".into(),
            });
        }
        let tmp = self.tmp_path("layer");
        crate::files::mkfs(dir, &tmp)?;
        let source = format!("dir:{}", dir.display());
        let lease = self.temp_lease("build")?;
        let digest = self.add_layer(&tmp, &source, None, Some(&lease))?;
        let size = self.layer_info(&digest)?.size_bytes;
        let m = ImageManifest {
            name,
            tag: t,
            layers: vec![digest],
            created_ms: now_ms(),
            source,
            size_bytes: size,
            stack: Vec::new(),
            owner: None,
            config: None,
        };
        self.put_manifest(&m)?;
        Ok(m)
    }

    /// Packs a directory into a layer of the store (`mkfs.erofs`; owners, modes, times and
    /// xattrs as they are in `dir`), held by `lease`; returns its digest. Nothing is tagged.
    pub fn add_dir_layer(
        &self,
        dir: &Path,
        source: &str,
        lease: &crate::Lease,
    ) -> Result<String, ImageError> {
        let tmp = self.tmp_path("layer");
        crate::files::mkfs(dir, &tmp)?;
        self.add_layer(&tmp, source, None, Some(lease))
    }

    /// Refuses to let `owner` (a tenant, or `None` for the node's administrator) write tag
    /// `name:tag` when another owns it: a tenant may replace only its own images; the
    /// administrator may replace any. Unless `replace`, a tag that exists is refused too
    /// ([`ImageError::Exists`]): replacing an image (the node's `default`, say) changes
    /// every later sandbox made of it, so it is asked for, never done by accident.
    pub fn check_claim(
        &self,
        name: &str,
        tag: &str,
        owner: Option<&str>,
        replace: bool,
    ) -> Result<(), ImageError> {
        let r = format!("{name}:{tag}");
        if !replace && self.manifest_path(name, tag).exists() {
            // Another tenant's image is not named to this one: it is only "taken".
            return Err(match (owner, self.manifest(&r)) {
                (Some(o), Ok(m)) if m.owner.as_deref() != Some(o) => {
                    ImageError::Taken(format!("{r} is taken; import under another name"))
                }
                _ => ImageError::Exists(r),
            });
        }
        let Some(owner) = owner else {
            return Ok(());
        };
        match self.manifest(&r) {
            Ok(m) if m.owner.as_deref() == Some(owner) => Ok(()),
            Ok(m) if m.owner.is_none() => Err(ImageError::Taken(format!(
                "{r} is one of the node's own images; only an administrator may replace it"
            ))),
            Ok(_) => Err(ImageError::Taken(format!(
                "{r} is taken; import under another name"
            ))),
            Err(_) => Ok(()),
        }
    }

    /// Whether tag `name:tag` already holds the image `layers` and `config` make for `owner`
    /// (made of one archive or directory, not a stack). Tagging it again replaces nothing: an
    /// import of the same archive twice, or by two daemons sharing this store (a gateway's
    /// import reaches every node), is not refused as a replacement.
    pub fn holds_same(
        &self,
        name: &str,
        tag: &str,
        owner: Option<&str>,
        layers: &[String],
        config: Option<&warren_types::ImageConfig>,
    ) -> bool {
        self.manifest(&format!("{name}:{tag}")).is_ok_and(|m| {
            m.name == name
                && m.tag == tag
                && m.owner.as_deref() == owner
                && m.layers == layers
                && m.stack.is_empty()
                && m.config.as_ref() == config
        })
    }

    /// Tags `m` for `m.owner` after [`ImageStore::check_claim`], atomically with the check.
    /// A tag that holds this same image already ([`ImageStore::holds_same`]) is left as it
    /// is, whether or not `replace`.
    pub fn put_claimed_manifest(&self, m: &ImageManifest, replace: bool) -> Result<(), ImageError> {
        let _claim = self.claim_lock.lock().unwrap_or_else(|p| p.into_inner());
        let same = || {
            m.stack.is_empty()
                && self.holds_same(
                    &m.name,
                    &m.tag,
                    m.owner.as_deref(),
                    &m.layers,
                    m.config.as_ref(),
                )
        };
        if same() {
            return Ok(());
        }
        match self.check_claim(&m.name, &m.tag, m.owner.as_deref(), replace) {
            // Another daemon of this store may have tagged the same image between the two
            // looks (the claim lock is this process's): the same image is still no change.
            Err(ImageError::Exists(_)) if same() => Ok(()),
            Err(e) => Err(e),
            Ok(()) => self.put_manifest(m),
        }
    }

    /// Moves a finished EROFS file into the store under its digest; returns the digest.
    /// Prefer [`ImageStore::add_layer`] with a lease: a layer no image or lease references
    /// may be collected at any time.
    pub fn add_blob(&self, file: &Path) -> Result<String, ImageError> {
        self.add_layer(file, "unknown", None, None)
    }

    /// Tags an image (replacing the tag if it exists). Every layer must be in the store.
    pub fn put_manifest(&self, m: &ImageManifest) -> Result<(), ImageError> {
        split_ref(&format!("{}:{}", m.name, m.tag))?;
        let _shared = self.gc_lock(false)?;
        for l in &m.layers {
            if !self.blob_path(l)?.exists() {
                return Err(ImageError::NotFound(l.clone()));
            }
        }
        let p = self.manifest_path(&m.name, &m.tag);
        std::fs::create_dir_all(p.parent().expect("has parent"))
            .map_err(|e| ImageError::io("create image dir", e))?;
        let tmp = p.with_extension(format!("json.tmp{}", seq()));
        std::fs::write(&tmp, serde_json::to_vec_pretty(m).expect("serializes"))
            .map_err(|e| ImageError::io("write manifest", e))?;
        std::fs::rename(&tmp, &p).map_err(|e| ImageError::io("write manifest", e))?;
        self.changed();
        Ok(())
    }

    /// How many times this process wrote or removed a tag: a reader that caches the list
    /// (the node's cluster record) reads it again when this moved. Other processes sharing
    /// the directory are not counted.
    pub fn changes(&self) -> u64 {
        self.changes.load(std::sync::atomic::Ordering::Acquire)
    }

    fn changed(&self) {
        self.changes
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// Makes image `tag` out of `refs` (images or layer digests, lowest first): a new version
    /// of a stack, resolved now. No layer is built or copied.
    pub fn tag_stack(
        &self,
        tag: &str,
        refs: &[String],
        source: Option<&str>,
    ) -> Result<ImageManifest, ImageError> {
        let (name, t) = split_ref(tag)?;
        if refs.is_empty() {
            return Err(ImageError::BadRef("a stack needs at least one ref".into()));
        }
        let layers = self.resolve(refs)?;
        let mut size = 0;
        for l in &layers {
            size += self.layer_info(l)?.size_bytes;
        }
        let single_image = refs.len() == 1 && !refs[0].starts_with("sha256:");
        let m = ImageManifest {
            name,
            tag: t,
            layers,
            created_ms: now_ms(),
            source: match (source, single_image) {
                (Some(s), _) => s.to_string(),
                (None, true) => self.manifest(&refs[0])?.source,
                (None, false) => format!("stack of {}", refs.join(" ")),
            },
            size_bytes: size,
            stack: if single_image {
                self.manifest(&refs[0])?.stack
            } else {
                refs.to_vec()
            },
            owner: None,
            config: self.stack_config(refs)?,
        };
        self.put_manifest(&m)?;
        Ok(m)
    }

    /// The run configuration of a stack of refs: each image's over the ones below it (layer
    /// digests carry none); `None` when no image of the stack has one.
    pub fn stack_config(
        &self,
        refs: &[String],
    ) -> Result<Option<warren_types::ImageConfig>, ImageError> {
        let mut out: Option<warren_types::ImageConfig> = None;
        for r in refs.iter().filter(|r| !r.starts_with("sha256:")) {
            if let Some(c) = self.manifest(r)?.config {
                out = Some(match out {
                    Some(below) => below.overlay(&c),
                    None => c,
                });
            }
        }
        Ok(out)
    }

    /// Reads an image by `name[:tag]`.
    pub fn manifest(&self, r: &str) -> Result<ImageManifest, ImageError> {
        let (n, t) = split_ref(r)?;
        let data = std::fs::read(self.manifest_path(&n, &t))
            .map_err(|_| ImageError::NotFound(r.to_string()))?;
        serde_json::from_slice(&data)
            .map_err(|e| ImageError::io(format!("manifest of {r}"), std::io::Error::other(e)))
    }

    /// An image with its layers' metadata, as the API shows it.
    pub fn info(&self, r: &str) -> Result<ImageInfo, ImageError> {
        let m = self.manifest(r)?;
        self.info_of(m)
    }

    pub(crate) fn info_of(&self, m: ImageManifest) -> Result<ImageInfo, ImageError> {
        let layers = m
            .layers
            .iter()
            .map(|d| self.layer_info(d))
            .collect::<Result<Vec<LayerInfo>, _>>()?;
        Ok(ImageInfo {
            reference: format!("{}:{}", m.name, m.tag),
            owner: m.owner,
            size_bytes: layers.iter().map(|l| l.size_bytes).sum(),
            name: m.name,
            tag: m.tag,
            stack: m.stack,
            layers,
            created_ms: m.created_ms,
            source: m.source,
            config: m.config,
        })
    }

    /// Every image in the store (unreadable manifests are skipped).
    pub fn list(&self) -> Vec<ImageManifest> {
        self.list_checked(false).unwrap_or_default()
    }

    /// Every image with its layers' metadata.
    pub fn list_info(&self) -> Vec<ImageInfo> {
        self.list()
            .into_iter()
            .filter_map(|m| self.info_of(m).ok())
            .collect()
    }

    /// Every image; with `strict`, an unreadable manifest is an error (the collector must not
    /// guess what it references).
    pub(crate) fn list_checked(&self, strict: bool) -> Result<Vec<ImageManifest>, ImageError> {
        let mut out = Vec::new();
        let names = match std::fs::read_dir(self.root.join("images")) {
            Ok(n) => n,
            Err(_) if !strict => return Ok(out),
            Err(e) => return Err(ImageError::io("list images", e)),
        };
        for n in names.flatten() {
            let Ok(tags) = std::fs::read_dir(n.path()) else {
                continue;
            };
            for t in tags.flatten() {
                if t.path().extension().is_some_and(|e| e == "json") {
                    let parsed = std::fs::read(t.path())
                        .map_err(|e| e.to_string())
                        .and_then(|d| {
                            serde_json::from_slice::<ImageManifest>(&d).map_err(|e| e.to_string())
                        });
                    match parsed {
                        Ok(m) => out.push(m),
                        Err(e) if strict => {
                            return Err(ImageError::io(
                                format!("read {}", t.path().display()),
                                std::io::Error::other(e),
                            ))
                        }
                        Err(_) => {}
                    }
                }
            }
        }
        out.sort_by(|a, b| (&a.name, &a.tag).cmp(&(&b.name, &b.tag)));
        Ok(out)
    }

    /// Removes an image tag (layers stay until garbage-collected; see
    /// [`ImageStore::remove_and_collect`]).
    pub fn remove(&self, r: &str) -> Result<(), ImageError> {
        let (n, t) = split_ref(r)?;
        std::fs::remove_file(self.manifest_path(&n, &t))
            .map_err(|_| ImageError::NotFound(r.to_string()))?;
        self.changed();
        let _ = std::fs::remove_dir(self.root.join("images").join(&n));
        Ok(())
    }

    /// Resolves a stack of refs (image names or `sha256:` layer digests), lowest first, to
    /// layer digests, lowest first. Fails with `NotFound` before anything is mounted.
    pub fn resolve(&self, refs: &[String]) -> Result<Vec<String>, ImageError> {
        let mut out = Vec::new();
        for r in refs {
            if r.starts_with("sha256:") {
                self.ensure_layer(r)?;
                out.push(r.clone());
            } else {
                let layers = self.manifest(r)?.layers;
                for l in &layers {
                    self.ensure_layer(l)?;
                }
                out.extend(layers);
            }
        }
        Ok(out)
    }

    /// Path where the layer is mounted idmapped for id base `base`.
    pub fn idmapped_path(&self, digest: &str, base: u32) -> Result<PathBuf, ImageError> {
        Ok(self
            .root
            .join("mnt")
            .join(format!("{}.idmap-{base}", hex_of(digest)?)))
    }

    /// Makes sure `digest` is mounted read-only and idmapped through `userns` (whose maps put
    /// root at host uid `base`). Idempotent and safe across daemons sharing the store.
    pub fn ensure_idmapped(
        &self,
        digest: &str,
        base: u32,
        userns: &OwnedFd,
    ) -> Result<PathBuf, ImageError> {
        let target = self.idmapped_path(digest, base)?;
        if warren_sys::mount::is_mount_point(&target) {
            return Ok(target);
        }
        let plain = self.ensure_mounted(digest)?;
        let _g = self.mount_lock.lock().unwrap_or_else(|p| p.into_inner());
        let _flock = self.mount_flock()?;
        if warren_sys::mount::is_mount_point(&target) {
            return Ok(target);
        }
        std::fs::create_dir_all(&target).map_err(|e| ImageError::io("create mount point", e))?;
        warren_sys::mount::idmapped_clone(&plain, userns, &target).map_err(|source| {
            ImageError::Mount {
                digest: digest.to_string(),
                source,
            }
        })?;
        Ok(target)
    }

    /// Makes sure `digest` is mounted read-only (once per host, at `mnt/<hex>`, shared by
    /// every sandbox and every daemon of the store) and returns where. Idempotent.
    pub fn ensure_mounted(&self, digest: &str) -> Result<PathBuf, ImageError> {
        let hex = hex_of(digest)?;
        let plain = self.root.join("mnt").join(hex);
        if warren_sys::mount::is_mount_point(&plain) {
            return Ok(plain);
        }
        let _g = self.mount_lock.lock().unwrap_or_else(|p| p.into_inner());
        let _flock = self.mount_flock()?;
        if !warren_sys::mount::is_mount_point(&plain) {
            std::fs::create_dir_all(&plain).map_err(|e| ImageError::io("create mount point", e))?;
            let local = self.blob_path(digest)?;
            let blob = if local.exists() {
                // Once per host boot and layer: a corrupt or truncated blob is never mounted.
                self.verify(digest)?;
                local
            } else {
                // A remote layer: its source verifies every chunk it serves.
                self.layer_file(digest)?
            };
            warren_sys::mount::mount_erofs_file(&blob, &plain).map_err(|source| {
                ImageError::Mount {
                    digest: digest.to_string(),
                    source,
                }
            })?;
        }
        Ok(plain)
    }

    /// The store's cross-process mount lock (held while mounting).
    pub(crate) fn mount_flock(&self) -> Result<nix::fcntl::Flock<std::fs::File>, ImageError> {
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.root.join("mnt/.lock"))
            .map_err(|e| ImageError::io("mount lock", e))?;
        nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| ImageError::io("mount lock", e.into()))
    }

    /// Checks a blob against its digest.
    pub fn verify(&self, digest: &str) -> Result<(), ImageError> {
        let found = sha256_file(&self.blob_path(digest)?)?;
        if format!("sha256:{found}") != digest {
            return Err(ImageError::Corrupt {
                digest: digest.to_string(),
                found,
            });
        }
        Ok(())
    }

    /// Unmounts every layer mount of the store (for tests and `warren image unmount`).
    pub fn unmount_all(&self) -> Vec<String> {
        let mut failed = Vec::new();
        for m in warren_sys::mount::mounts_under(&self.root.join("mnt")) {
            if warren_sys::mount::umount(Path::new(&m), true).is_err() {
                failed.push(m);
            }
        }
        failed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tag_that_exists_is_replaced_only_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::open(dir.path()).unwrap();
        let layer = |text: &str| {
            let blob = dir.path().join("x");
            std::fs::write(&blob, text).unwrap();
            store.add_blob(&blob).unwrap()
        };
        let (one, two) = (layer("a layer"), layer("another layer"));
        let m = |source: &str, owner: Option<&str>, layer: &str| ImageManifest {
            name: "default".into(),
            tag: "latest".into(),
            layers: vec![layer.to_string()],
            created_ms: 1,
            source: source.into(),
            size_bytes: 7,
            stack: vec![],
            owner: owner.map(str::to_string),
            config: None,
        };
        store
            .put_claimed_manifest(&m("first", None, &one), false)
            .unwrap();
        let e = store
            .put_claimed_manifest(&m("second", None, &two), false)
            .unwrap_err();
        assert!(
            matches!(e, ImageError::Exists(ref r) if r == "default:latest"),
            "{e}"
        );
        assert_eq!(e.code(), warren_types::ErrorCode::Conflict);
        assert!(e.to_string().contains("--force"), "{e}");
        assert_eq!(store.manifest("default").unwrap().source, "first");
        // The same image again (the same layers and configuration) replaces nothing: it is
        // not refused, and the tag keeps what it had.
        let mut again = m("again", None, &one);
        again.created_ms = 2;
        store.put_claimed_manifest(&again, false).unwrap();
        assert_eq!(store.manifest("default").unwrap().source, "first");
        let mut other_config = m("other config", None, &one);
        other_config.config = Some(warren_types::ImageConfig {
            user: Some("nobody".into()),
            ..Default::default()
        });
        let e = store
            .put_claimed_manifest(&other_config, false)
            .unwrap_err();
        assert!(matches!(e, ImageError::Exists(_)), "{e}");
        // A tenant is told the node's image is taken, forced or not, even the same image.
        for replace in [false, true] {
            for layer in [&one, &two] {
                let e = store
                    .put_claimed_manifest(&m("t", Some("alice"), layer), replace)
                    .unwrap_err();
                assert!(matches!(e, ImageError::Taken(_)), "{e}");
            }
        }
        store
            .put_claimed_manifest(&m("second", None, &two), true)
            .unwrap();
        assert_eq!(store.manifest("default").unwrap().source, "second");
    }

    #[test]
    fn manifests_round_trip_and_resolve() {
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::open(dir.path()).unwrap();
        let blob = dir.path().join("x");
        std::fs::write(&blob, b"not really erofs").unwrap();
        let digest = store.add_blob(&blob).unwrap();
        store.verify(&digest).unwrap();
        let m = ImageManifest {
            name: "base".into(),
            tag: "1".into(),
            layers: vec![digest.clone()],
            created_ms: 1,
            source: "t".into(),
            size_bytes: 16,
            stack: vec![],
            owner: None,
            config: None,
        };
        let before = store.changes();
        store.put_manifest(&m).unwrap();
        assert_eq!(store.changes(), before + 1, "a tag written is a change");
        assert_eq!(store.manifest("base:1").unwrap(), m);
        assert_eq!(
            store.resolve(&["base:1".into(), digest.clone()]).unwrap(),
            vec![digest.clone(), digest.clone()]
        );
        assert!(matches!(
            store.resolve(&["nope".into()]),
            Err(ImageError::NotFound(_))
        ));
        assert!(matches!(
            store.manifest("../etc"),
            Err(ImageError::BadRef(_))
        ));
        std::fs::write(store.blob_path(&digest).unwrap(), b"tampered").unwrap();
        assert!(matches!(
            store.verify(&digest),
            Err(ImageError::Corrupt { .. })
        ));
        assert_eq!(store.list().len(), 1);
        store.remove("base:1").unwrap();
        assert!(store.list().is_empty());
    }
}
