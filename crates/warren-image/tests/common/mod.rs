//! Helpers of the layer-store tests: the skip rule, source trees with every kind of file,
//! tar layers, docker archives and OCI layouts written from scratch, and a tree comparison
//! through a real EROFS mount.
#![allow(dead_code)]

use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Why this host cannot run the tests, if it cannot.
pub fn skip_reason() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("layer-store tests need root (owners, devices, mounts)".into());
    }
    for tool in ["mkfs.erofs", "tar"] {
        if !Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
        {
            return Some(format!(
                "{tool} is not installed (scripts/setup.sh installs it)"
            ));
        }
    }
    None
}

// Test binaries that use both this and another helper module load the rule twice.
#[allow(clippy::duplicate_mod)]
#[path = "../../../../tests/skip.rs"]
mod skip_rule;
pub use skip_rule::skip;

/// Says why the host cannot run the tests (a failure under `CI=true`); true when the test
/// must return.
pub fn should_skip() -> bool {
    match skip_reason() {
        Some(why) => {
            skip(why);
            true
        }
        None => false,
    }
}

/// A scratch directory on the same filesystem as the test stores (xattrs and devices work).
pub fn scratch(name: &str) -> tempfile::TempDir {
    let base = std::env::var_os("WARREN_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp/warren-tests"));
    std::fs::create_dir_all(&base).unwrap();
    tempfile::Builder::new()
        .prefix(name)
        .tempdir_in(base)
        .unwrap()
}

pub fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

fn set_owner(p: &Path, uid: u32, gid: u32) {
    std::os::unix::fs::lchown(p, Some(uid), Some(gid)).unwrap();
}

fn set_mode(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn set_mtime(p: &Path, secs: i64) {
    let t = filetime::FileTime::from_unix_time(secs, 0);
    filetime::set_symlink_file_times(p, t, t).unwrap();
}

/// Writes a tree with every kind of entry a layer can hold under `root/rt`.
pub fn rich_tree(root: &Path) {
    let d = root.join("rt");
    std::fs::create_dir_all(d.join("sub/deeper")).unwrap();
    std::fs::create_dir_all(d.join("private")).unwrap();
    std::fs::write(d.join("plain.txt"), "hello\n").unwrap();
    std::fs::write(d.join("empty"), "").unwrap();
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(d.join("sub/big.bin"), &big).unwrap();
    std::fs::write(d.join("sub/deeper/script.sh"), "#!/bin/sh\necho hi\n").unwrap();
    set_mode(&d.join("sub/deeper/script.sh"), 0o755);
    std::fs::write(d.join("suid"), "x").unwrap();
    set_owner(&d.join("suid"), 0, 0);
    set_mode(&d.join("suid"), 0o4755);
    std::fs::write(d.join("secret"), "s").unwrap();
    set_mode(&d.join("secret"), 0o600);
    std::fs::write(d.join("owned"), "o").unwrap();
    set_owner(&d.join("owned"), 1000, 1001);
    set_owner(&d.join("private"), 1000, 1000);
    set_mode(&d.join("private"), 0o700);
    std::fs::write(d.join("private/note"), "n").unwrap();
    set_owner(&d.join("private/note"), 1000, 1000);
    std::fs::write(d.join("linked"), "one inode, two names\n").unwrap();
    std::fs::hard_link(d.join("linked"), d.join("sub/also-linked")).unwrap();
    std::os::unix::fs::symlink("plain.txt", d.join("rel-link")).unwrap();
    std::os::unix::fs::symlink("/does/not/exist", d.join("dangling")).unwrap();
    set_owner(&d.join("rel-link"), 1000, 1000);
    xattr::set(d.join("plain.txt"), "user.origin", b"test-suite").unwrap();
    xattr::set(d.join("sub"), "user.dir-note", b"d").unwrap();
    nix::unistd::mkfifo(
        &d.join("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    nix::sys::stat::mknod(
        &d.join("null-dev"),
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        nix::sys::stat::makedev(1, 3),
    )
    .unwrap();
    for (i, p) in [
        "plain.txt",
        "empty",
        "sub/big.bin",
        "sub/deeper/script.sh",
        "suid",
        "secret",
        "owned",
        "private/note",
        "linked",
        "fifo",
        "null-dev",
        "rel-link",
        "dangling",
        "sub/deeper",
        "sub",
        "private",
        "",
    ]
    .iter()
    .enumerate()
    {
        set_mtime(&d.join(p), 1_600_000_000 + i as i64 * 1000);
    }
}

/// One line per entry under `root`: type, mode, owner, size, content digest, link target,
/// device, mtime (seconds), user xattrs and hard-link group. Two trees with the same lines
/// are the same to anything that reads them.
pub fn describe(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut inodes: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    walk(root, root, &mut out, &mut inodes);
    for names in inodes.values() {
        if names.len() > 1 {
            for n in names {
                let line = out.get_mut(n).unwrap();
                line.push_str(&format!(" links={}", names.join(",")));
            }
        }
    }
    out
}

fn walk(
    root: &Path,
    dir: &Path,
    out: &mut BTreeMap<String, String>,
    inodes: &mut BTreeMap<u64, Vec<String>>,
) {
    let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().flatten().collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let p = e.path();
        let rel = p.strip_prefix(root).unwrap().display().to_string();
        let m = std::fs::symlink_metadata(&p).unwrap();
        let ft = m.file_type();
        use std::os::unix::fs::FileTypeExt;
        let kind = if ft.is_dir() {
            "dir"
        } else if ft.is_symlink() {
            "symlink"
        } else if ft.is_char_device() {
            "char"
        } else if ft.is_block_device() {
            "block"
        } else if ft.is_fifo() {
            "fifo"
        } else {
            "file"
        };
        let mut line = format!(
            "{kind} mode={:o} owner={}:{}",
            m.mode() & 0o7777,
            m.uid(),
            m.gid()
        );
        match kind {
            "file" => {
                let data = std::fs::read(&p).unwrap();
                line.push_str(&format!(
                    " size={} sha256={}",
                    data.len(),
                    &sha256_hex(&data)[..16]
                ));
                if m.nlink() > 1 {
                    inodes.entry(m.ino()).or_default().push(rel.clone());
                }
            }
            "symlink" => line.push_str(&format!(
                " -> {}",
                std::fs::read_link(&p).unwrap().display()
            )),
            "char" | "block" => line.push_str(&format!(" rdev={:x}", m.rdev())),
            _ => {}
        }
        if kind != "dir" {
            line.push_str(&format!(" mtime={}", m.mtime()));
        }
        if kind == "file" || kind == "dir" {
            let mut attrs: Vec<String> = xattr::list(&p)
                .unwrap()
                .filter_map(|n| n.to_str().map(str::to_string))
                .filter(|n| n.starts_with("user."))
                .map(|n| {
                    let v = xattr::get(&p, &n).unwrap().unwrap_or_default();
                    format!("{n}={}", String::from_utf8_lossy(&v))
                })
                .collect();
            attrs.sort();
            if !attrs.is_empty() {
                line.push_str(&format!(" xattrs={}", attrs.join(",")));
            }
        }
        out.insert(rel, line);
        if ft.is_dir() {
            walk(root, &p, out, inodes);
        }
    }
}

/// GNU tar of `dir`'s contents in the pax format with xattrs, numeric owners, hard links,
/// devices (what `docker save` layers hold).
pub fn tar_dir(dir: &Path, out: &Path) {
    let st = Command::new("tar")
        .args([
            "--format=pax",
            "--xattrs",
            "--xattrs-include=user.*",
            "--numeric-owner",
            "--sort=name",
            "-C",
        ])
        .arg(dir)
        .arg("-cf")
        .arg(out)
        .arg(".")
        .status()
        .unwrap();
    assert!(st.success(), "tar failed");
}

/// A layer tar built entry by entry: `(path, content)` files (mode 0644, root) and
/// directories (`path/`), plus raw names like `.wh.x` and `d/.wh..wh..opq`.
pub fn tar_entries(entries: &[(&str, &str)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, content) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_700_000_000);
        if let Some(dir) = path.strip_suffix('/') {
            h.set_entry_type(tar::EntryType::Directory);
            h.set_mode(0o755);
            h.set_size(0);
            b.append_data(&mut h, dir, std::io::empty()).unwrap();
        } else {
            h.set_entry_type(tar::EntryType::Regular);
            h.set_mode(0o644);
            h.set_size(content.len() as u64);
            b.append_data(&mut h, path, content.as_bytes()).unwrap();
        }
    }
    b.into_inner().unwrap()
}

/// A one-file layer tar whose entry name is written as is (the tar crate refuses `..`).
pub fn tar_raw_name(name: &str, content: &str) -> Vec<u8> {
    let mut h = tar::Header::new_old();
    h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
    h.set_mode(0o644);
    h.set_size(content.len() as u64);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_cksum();
    let mut b = tar::Builder::new(Vec::new());
    b.append(&h, content.as_bytes()).unwrap();
    b.into_inner().unwrap()
}

pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

pub fn zstd(data: &[u8]) -> Vec<u8> {
    zstd::encode_all(data, 3).unwrap()
}

fn config_json(diff_ids: &[String], run: serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": run,
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }))
    .unwrap()
}

/// A `docker save` archive (classic layout: `<id>/layer.tar`, `<config-hex>.json`,
/// `manifest.json`) of uncompressed layer tars, lowest first.
pub fn docker_archive(layers: &[Vec<u8>], repo_tag: &str, out: &Path) {
    docker_archive_with_config(layers, repo_tag, out, serde_json::json!({}));
}

/// [`docker_archive`] whose image config's `config` (Env, WorkingDir, User, Cmd, ...) is `run`.
#[allow(dead_code)]
pub fn docker_archive_with_config(
    layers: &[Vec<u8>],
    repo_tag: &str,
    out: &Path,
    run: serde_json::Value,
) {
    let diff_ids: Vec<String> = layers
        .iter()
        .map(|l| format!("sha256:{}", sha256_hex(l)))
        .collect();
    let config = config_json(&diff_ids, run);
    let config_name = format!("{}.json", sha256_hex(&config));
    let mut b = tar::Builder::new(std::fs::File::create(out).unwrap());
    let mut names = Vec::new();
    for (i, l) in layers.iter().enumerate() {
        let name = format!("{:064x}/layer.tar", i + 1);
        append(&mut b, &name, l);
        names.push(name);
    }
    append(&mut b, &config_name, &config);
    let manifest = serde_json::json!([{
        "Config": config_name,
        "RepoTags": [repo_tag],
        "Layers": names,
    }]);
    append(
        &mut b,
        "manifest.json",
        &serde_json::to_vec(&manifest).unwrap(),
    );
    b.finish().unwrap();
}

fn append<W: Write>(b: &mut tar::Builder<W>, name: &str, data: &[u8]) {
    let mut h = tar::Header::new_gnu();
    h.set_mode(0o644);
    h.set_size(data.len() as u64);
    h.set_entry_type(tar::EntryType::Regular);
    b.append_data(&mut h, name, data).unwrap();
}

/// A layer of an OCI layout: its stored bytes and media type; the diff id is the digest of
/// the uncompressed tar.
pub struct OciLayer {
    pub stored: Vec<u8>,
    pub media_type: String,
    pub diff_id: String,
}

impl OciLayer {
    pub fn tar(t: Vec<u8>) -> Self {
        OciLayer {
            diff_id: format!("sha256:{}", sha256_hex(&t)),
            stored: t,
            media_type: "application/vnd.oci.image.layer.v1.tar".into(),
        }
    }
    pub fn gzip(t: Vec<u8>) -> Self {
        OciLayer {
            diff_id: format!("sha256:{}", sha256_hex(&t)),
            stored: gzip(&t),
            media_type: "application/vnd.oci.image.layer.v1.tar+gzip".into(),
        }
    }
    pub fn zstd(t: Vec<u8>) -> Self {
        OciLayer {
            diff_id: format!("sha256:{}", sha256_hex(&t)),
            stored: zstd(&t),
            media_type: "application/vnd.oci.image.layer.v1.tar+zstd".into(),
        }
    }
}

/// The blobs of an OCI image: (digest → bytes) and the manifest's digest and bytes.
pub struct OciImage {
    pub blobs: Vec<(String, Vec<u8>)>,
    pub manifest: Vec<u8>,
    pub manifest_digest: String,
    pub config: Vec<u8>,
}

pub fn oci_image(layers: &[OciLayer]) -> OciImage {
    let diff_ids: Vec<String> = layers.iter().map(|l| l.diff_id.clone()).collect();
    let config = config_json(&diff_ids, serde_json::json!({}));
    let config_digest = format!("sha256:{}", sha256_hex(&config));
    let mut blobs = vec![(config_digest.clone(), config.clone())];
    let mut descs = Vec::new();
    for l in layers {
        let d = format!("sha256:{}", sha256_hex(&l.stored));
        descs.push(
            serde_json::json!({"mediaType": l.media_type, "digest": d, "size": l.stored.len()}),
        );
        blobs.push((d, l.stored.clone()));
    }
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config.len()},
        "layers": descs,
    }))
    .unwrap();
    let manifest_digest = format!("sha256:{}", sha256_hex(&manifest));
    OciImage {
        blobs,
        manifest,
        manifest_digest,
        config,
    }
}

/// Writes an OCI image layout directory.
pub fn oci_layout(img: &OciImage, ref_name: &str, dir: &Path) {
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    for (d, data) in img.blobs.iter().chain(std::iter::once(&(
        img.manifest_digest.clone(),
        img.manifest.clone(),
    ))) {
        std::fs::write(blobs.join(d.strip_prefix("sha256:").unwrap()), data).unwrap();
    }
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": img.manifest_digest,
            "size": img.manifest.len(),
            "annotations": {"org.opencontainers.image.ref.name": ref_name},
        }],
    });
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
}

/// A layer's EROFS image mounted read-only for inspection; unmounted on drop.
pub struct Mounted {
    pub dir: tempfile::TempDir,
}

impl Mounted {
    pub fn new(blob: &Path) -> Mounted {
        let dir = scratch("mnt");
        warren_sys::mount::mount_erofs_file(blob, dir.path()).unwrap();
        Mounted { dir }
    }
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = warren_sys::mount::umount(self.dir.path(), true);
    }
}

/// Counts files under a store directory (blobs, metadata, tmp leftovers).
pub fn count(dir: &Path) -> usize {
    std::fs::read_dir(dir).map(|r| r.count()).unwrap_or(0)
}
