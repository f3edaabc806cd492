//! Importing images: a `docker save` archive, an OCI image layout (directory or tar) or an
//! OCI registry (see `registry`, which writes a layout and imports it).
//!
//! Each OCI layer is converted once into an EROFS layer: its tar stream is digest-checked
//! (stored bytes against the manifest's digest, uncompressed bytes against the config's diff
//! id) while it is unpacked into a scratch directory with whiteouts and opaque markers turned
//! into what overlayfs understands ([`unpack`]), then packed by `mkfs.erofs`. The conversion
//! is remembered by OCI digest and diff id, so a layer shared by many images is converted
//! once. Nothing is tagged until every layer is in; on any error the layers this import
//! added are collected again, so no half-imported image is left.

mod oci;
pub mod registry;
mod source;
pub mod unpack;

use sha2::{Digest, Sha256};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::time::Instant;
use warren_types::ImageInfo;

use crate::files::now_ms;
use crate::lease::Lease;
use crate::store::{split_ref, ImageManifest, ImageStore};
use crate::ImageError;
use oci::PlannedLayer;
use source::Source;

/// What to import.
#[derive(Debug, Clone)]
pub enum ImportSource {
    /// A `docker save` tar, an OCI archive tar, or an OCI image layout directory.
    Archive(PathBuf),
}

/// What an import did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ImportReport {
    pub image: ImageInfo,
    /// Layers converted by this import.
    pub converted: usize,
    /// Layers found already converted.
    pub reused: usize,
    /// Bytes of layer data read (as stored: compressed if compressed).
    pub bytes_read: u64,
    pub seconds: f64,
}

/// Counts bytes and hashes them as they are read.
struct Hashing<R> {
    inner: R,
    hash: Sha256,
    bytes: u64,
}

impl<R: Read> Hashing<R> {
    fn new(inner: R) -> Self {
        Hashing {
            inner,
            hash: Sha256::new(),
            bytes: 0,
        }
    }

    fn finish(self) -> (String, u64) {
        (
            format!("sha256:{}", hex::encode(self.hash.finalize())),
            self.bytes,
        )
    }
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
}

type Stored = BufReader<Hashing<Box<dyn Read + Send>>>;

/// A layer's stream, decompressed as its first bytes say.
enum Decoded {
    Plain(Stored),
    Gzip(Box<flate2::bufread::MultiGzDecoder<Stored>>),
    Zstd(Box<zstd::stream::read::Decoder<'static, Stored>>),
}

impl Decoded {
    fn new(mut r: Stored) -> std::io::Result<Decoded> {
        let head = r.fill_buf()?;
        Ok(if head.starts_with(&[0x1f, 0x8b]) {
            Decoded::Gzip(Box::new(flate2::bufread::MultiGzDecoder::new(r)))
        } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            Decoded::Zstd(Box::new(zstd::stream::read::Decoder::with_buffer(r)?))
        } else {
            Decoded::Plain(r)
        })
    }

    fn into_inner(self) -> Stored {
        match self {
            Decoded::Plain(r) => r,
            Decoded::Gzip(d) => d.into_inner(),
            Decoded::Zstd(d) => d.finish(),
        }
    }
}

impl Read for Decoded {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Decoded::Plain(r) => r.read(buf),
            Decoded::Gzip(d) => d.read(buf),
            Decoded::Zstd(d) => d.read(buf),
        }
    }
}

impl ImageStore {
    /// Imports an image and tags it `tag` (default: the archive's own name for it, if it is a
    /// valid image ref), replacing an image of that tag.
    pub fn import(
        &self,
        src: &ImportSource,
        tag: Option<&str>,
    ) -> Result<ImportReport, ImageError> {
        self.import_owned(src, tag, None, true)
    }

    /// [`ImageStore::import`] for `owner` (a tenant, or `None` for the node's own images):
    /// the image is visible to that tenant alone, and a tag another owns is refused
    /// ([`ImageStore::check_claim`]) before anything is converted; so is a tag that exists
    /// unless `replace`.
    pub fn import_owned(
        &self,
        src: &ImportSource,
        tag: Option<&str>,
        owner: Option<&str>,
        replace: bool,
    ) -> Result<ImportReport, ImageError> {
        let ImportSource::Archive(path) = src;
        self.import_archive(
            path,
            tag,
            &format!("archive:{}", path.display()),
            owner,
            replace,
        )
    }

    /// [`ImageStore::import_owned`] of an archive that came over the API: its source says
    /// so, not where the node kept it while converting.
    pub fn import_upload(
        &self,
        path: &Path,
        tag: Option<&str>,
        owner: Option<&str>,
        replace: bool,
    ) -> Result<ImportReport, ImageError> {
        self.import_archive(path, tag, "upload", owner, replace)
    }

    pub(crate) fn import_archive(
        &self,
        path: &Path,
        tag: Option<&str>,
        source_desc: &str,
        owner: Option<&str>,
        replace: bool,
    ) -> Result<ImportReport, ImageError> {
        let t0 = Instant::now();
        let src = Source::open(path)?;
        let plan = oci::plan(&src)?;
        let tag = match tag {
            Some(t) => t.to_string(),
            None => plan
                .suggested_tag
                .clone()
                .filter(|t| split_ref(t).is_ok())
                .ok_or_else(|| {
                    ImageError::BadRef(format!(
                        "{} names no usable image ref ({:?}); give one with a tag",
                        src.name(),
                        plan.suggested_tag
                    ))
                })?,
        };
        let (name, t) = split_ref(&tag)?;
        // Another tenant's tag is refused before anything is converted. A tag that exists
        // is decided when the image is tagged (`put_claimed_manifest`), against what the
        // image really is: the same image again (the same archive imported twice, or by
        // another daemon of this store at once: a gateway's import reaches every node)
        // replaces nothing.
        match self.check_claim(&name, &t, owner, replace) {
            Err(ImageError::Exists(_)) => {}
            r => r?,
        }
        if plan.layers.is_empty() {
            return Err(ImageError::archive(src.name(), "the image has no layers"));
        }
        let lease = self.temp_lease("import")?;
        let result = (|| {
            let mut report = (0usize, 0usize, 0u64);
            let mut digests = Vec::new();
            for (i, l) in plan.layers.iter().enumerate() {
                let (d, reused, bytes) = self.convert_layer(&src, i, l, &lease)?;
                if reused {
                    report.1 += 1;
                } else {
                    report.0 += 1;
                }
                report.2 += bytes;
                digests.push(d);
            }
            let mut size = 0;
            for d in &digests {
                size += self.layer_info(d)?.size_bytes;
            }
            let m = ImageManifest {
                name,
                tag: t,
                layers: digests,
                created_ms: now_ms(),
                source: source_desc.to_string(),
                size_bytes: size,
                stack: Vec::new(),
                owner: owner.map(str::to_string),
                config: plan.config.clone(),
            };
            self.put_claimed_manifest(&m, replace)?;
            Ok::<_, ImageError>((m, report))
        })();
        match result {
            Ok((m, (converted, reused, bytes_read))) => {
                drop(lease);
                Ok(ImportReport {
                    image: self.info_of(m)?,
                    converted,
                    reused,
                    bytes_read,
                    seconds: t0.elapsed().as_secs_f64(),
                })
            }
            Err(e) => {
                let added = lease.layers();
                drop(lease);
                if let Err(ce) = self.collect(&added) {
                    return Err(ImageError::archive(
                        src.name(),
                        format!("{e} (and cleaning up after it failed: {ce})"),
                    ));
                }
                Err(e)
            }
        }
    }

    /// Converts one layer (or finds it converted); returns (layer, reused, bytes read).
    /// The store-wide lock on converting the OCI layer `digest` (none for a layer without one).
    fn conversion_lock(
        &self,
        digest: Option<&str>,
    ) -> Result<Option<nix::fcntl::Flock<std::fs::File>>, ImageError> {
        let Some(hex) = digest.and_then(|d| crate::files::hex_of(d).ok()) else {
            return Ok(None);
        };
        let dir = self.root().join("locks");
        std::fs::create_dir_all(&dir).map_err(|e| ImageError::io("layer conversion lock", e))?;
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(format!("convert-{hex}")))
            .map_err(|e| ImageError::io("layer conversion lock", e))?;
        nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive)
            .map(Some)
            .map_err(|(_, e)| ImageError::io("layer conversion lock", e.into()))
    }

    fn convert_layer(
        &self,
        src: &Source,
        index: usize,
        l: &PlannedLayer,
        lease: &Lease,
    ) -> Result<(String, bool, u64), ImageError> {
        // One conversion of a layer at a time among the daemons of this store: a second
        // waits, then reuses the first's. Two conversions of one layer give two different
        // EROFS files, so two daemons importing one archive at once (a gateway's import
        // reaches every node) would make two different images of it under one tag.
        let _converting = self.conversion_lock(l.digest.as_deref().or(l.diff_id.as_deref()))?;
        for known in [&l.digest, &l.diff_id].into_iter().flatten() {
            if let Some(d) = self.converted(known) {
                let _shared = self.gc_lock(false)?;
                // Still there under the lock?
                if self.blob_path(&d)?.exists() {
                    lease.add(self, &d)?;
                    return Ok((d, true, 0));
                }
            }
        }
        let what = format!(
            "layer {} ({})",
            index + 1,
            l.digest.as_deref().unwrap_or(&l.member)
        );
        let (reader, size) = src.read(&l.member)?;
        if let Some(want) = l.size.filter(|s| *s > 0) {
            if want != size {
                return Err(ImageError::DigestMismatch {
                    what: format!("{what} size"),
                    expected: want.to_string(),
                    found: size.to_string(),
                });
            }
        }
        let dir = self.tmp_path("unpack");
        std::fs::create_dir(&dir)
            .map_err(|e| ImageError::io(format!("create {}", dir.display()), e))?;
        let result = (|| {
            let stored = BufReader::with_capacity(1 << 20, Hashing::new(reader));
            let decoded = Decoded::new(stored)
                .map_err(|e| ImageError::archive(src.name(), format!("{what}: {e}")))?;
            let (_, plain) = unpack::unpack(Hashing::new(decoded), &dir).map_err(|e| match e {
                unpack::UnpackError::Bad(m) => {
                    ImageError::archive(src.name(), format!("{what}: {m}"))
                }
                unpack::UnpackError::Io(e) => {
                    ImageError::archive(src.name(), format!("{what} is truncated or corrupt: {e}"))
                }
            })?;
            let Hashing { inner, hash, .. } = plain;
            let diff_id = format!("sha256:{}", hex::encode(hash.finalize()));
            let mut stored = inner.into_inner();
            std::io::copy(&mut stored, &mut std::io::sink())
                .map_err(|e| ImageError::archive(src.name(), format!("{what}: {e}")))?;
            let (digest, bytes) = stored.into_inner().finish();
            if let Some(want) = &l.digest {
                if *want != digest {
                    return Err(ImageError::DigestMismatch {
                        what,
                        expected: want.clone(),
                        found: digest,
                    });
                }
            }
            if let Some(want) = &l.diff_id {
                if *want != diff_id {
                    return Err(ImageError::DigestMismatch {
                        what: format!("{what} (uncompressed)"),
                        expected: want.clone(),
                        found: diff_id,
                    });
                }
            }
            let out = self.tmp_path("layer");
            crate::files::mkfs(&dir, &out)?;
            let source = format!("oci:{}", l.digest.as_deref().unwrap_or(&diff_id));
            let layer = self.add_layer(&out, &source, Some(&diff_id), Some(lease))?;
            if let Some(d) = &l.digest {
                self.record_conversion(d, &layer)?;
            }
            self.record_conversion(&diff_id, &layer)?;
            Ok((layer, false, bytes))
        })();
        let _ = std::fs::remove_dir_all(&dir);
        result
    }
}
