//! The layer store against real archives, real `mkfs.erofs` and real EROFS mounts (root).
//!
//! Import round trips (docker archive, OCI layout; tar, gzip, zstd), whiteouts and opaque
//! directories, digest checks of corrupt and truncated blobs, clear errors with nothing left
//! behind, stacks, leases and garbage collection.

mod common;

use common::*;
use std::path::Path;
use warren_image::{ImageError, ImageStore, ImportSource};

fn store(dir: &Path) -> ImageStore {
    ImageStore::open(dir.join("store")).unwrap()
}

fn archive(p: &Path) -> ImportSource {
    ImportSource::Archive(p.to_path_buf())
}

/// The tree of the single layer of `image`, through a real EROFS mount.
fn layer_tree(
    s: &ImageStore,
    image: &str,
    index: usize,
) -> std::collections::BTreeMap<String, String> {
    let m = s.manifest(image).unwrap();
    let mounted = Mounted::new(&s.blob_path(&m.layers[index]).unwrap());
    describe(mounted.path())
}

#[test]
fn docker_archive_round_trip_keeps_every_kind_of_file() {
    if should_skip() {
        return;
    }
    let t = scratch("rt");
    let src = t.path().join("src");
    rich_tree(&src);
    let layer = t.path().join("layer.tar");
    tar_dir(&src, &layer);
    let arch = t.path().join("img.tar");
    docker_archive(&[std::fs::read(&layer).unwrap()], "rich:1", &arch);
    let s = store(t.path());
    let r = s.import(&archive(&arch), None).unwrap();
    assert_eq!(r.image.reference, "rich:1");
    assert_eq!((r.converted, r.reused), (1, 0));
    let want = describe(&src);
    let got = layer_tree(&s, "rich:1", 0);
    assert_eq!(got, want, "the imported layer differs from its source");
    // Hard links, set-id bits, devices and xattrs really are there.
    assert!(want["rt/linked"].contains("links=rt/linked,rt/sub/also-linked"));
    assert!(want["rt/suid"].contains("mode=4755"));
    assert!(want["rt/null-dev"].contains("rdev=103"));
    assert!(
        want["rt/plain.txt"].contains("user.origin=test-suite"),
        "{}",
        want["rt/plain.txt"]
    );
    let info = s.info("rich:1").unwrap();
    assert_eq!(
        info.layers[0].media_type,
        "application/vnd.warren.layer.v1.erofs"
    );
    assert!(info.layers[0].source.starts_with("oci:sha256:"));
    assert!(info.layers[0].diff_id.is_some());

    // The same archive again: nothing is converted twice.
    let again = s.import(&archive(&arch), Some("rich:2")).unwrap();
    assert_eq!((again.converted, again.reused), (0, 1));
    assert_eq!(
        s.manifest("rich:2").unwrap().layers,
        s.manifest("rich:1").unwrap().layers
    );
}

#[test]
fn oci_layouts_with_tar_gzip_and_zstd_layers_import_alike() {
    if should_skip() {
        return;
    }
    let t = scratch("oci");
    let src = t.path().join("src");
    rich_tree(&src);
    let layer = t.path().join("layer.tar");
    tar_dir(&src, &layer);
    let raw = std::fs::read(&layer).unwrap();
    let want = describe(&src);
    let s = store(t.path());
    for (i, l) in [
        OciLayer::tar(raw.clone()),
        OciLayer::gzip(raw.clone()),
        OciLayer::zstd(raw),
    ]
    .into_iter()
    .enumerate()
    {
        let dir = t.path().join(format!("layout{i}"));
        oci_layout(&oci_image(&[l]), &format!("v{i}"), &dir);
        let tag = format!("rich-oci:{i}");
        s.import(&archive(&dir), Some(&tag)).unwrap();
        assert_eq!(layer_tree(&s, &tag, 0), want, "layout {i}");
    }
    // All three have the same diff id: converted once, then found by it.
    let layers: Vec<_> = (0..3)
        .map(|i| s.manifest(&format!("rich-oci:{i}")).unwrap().layers)
        .collect();
    assert_eq!(layers[0], layers[1]);
    assert_eq!(layers[1], layers[2]);
    // An OCI layout packed as a tar (an "OCI archive") imports too, named by its ref.
    let dir = t.path().join("layout0");
    let packed = t.path().join("layout0.tar");
    assert!(std::process::Command::new("tar")
        .arg("-C")
        .arg(&dir)
        .arg("-cf")
        .arg(&packed)
        .arg(".")
        .status()
        .unwrap()
        .success());
    let r = s.import(&archive(&packed), None).unwrap();
    assert_eq!(r.image.reference, "v0:latest");
}

#[test]
fn whiteouts_and_opaque_dirs_become_overlay_markers() {
    if should_skip() {
        return;
    }
    let t = scratch("wh");
    let l1 = tar_entries(&[("a", "1"), ("d/", ""), ("d/x", "x"), ("keep", "k")]);
    let l2 = tar_entries(&[
        (".wh.a", ""),
        ("d/", ""),
        ("d/.wh..wh..opq", ""),
        ("d/z", "z"),
    ]);
    let arch = t.path().join("wh.tar");
    docker_archive(&[l1, l2], "wh:1", &arch);
    let s = store(t.path());
    s.import(&archive(&arch), None).unwrap();
    let m = s.manifest("wh:1").unwrap();
    assert_eq!(m.layers.len(), 2);
    let top = Mounted::new(&s.blob_path(&m.layers[1]).unwrap());
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let a = std::fs::symlink_metadata(top.path().join("a")).unwrap();
    assert!(
        a.file_type().is_char_device() && a.rdev() == 0,
        "a is a whiteout"
    );
    assert!(!top.path().join(".wh.a").exists());
    assert!(!top.path().join("d/.wh..wh..opq").exists());
    assert_eq!(
        xattr::get(top.path().join("d"), "user.overlay.opaque")
            .unwrap()
            .as_deref(),
        Some(&b"y"[..])
    );
    assert_eq!(
        std::fs::read_to_string(top.path().join("d/z")).unwrap(),
        "z"
    );
}

#[test]
fn corrupt_and_truncated_blobs_are_refused_and_nothing_stays() {
    if should_skip() {
        return;
    }
    let t = scratch("bad");
    let s = store(t.path());
    let good = tar_entries(&[("ok", "fine")]);
    let other = tar_entries(&[("big", &"b".repeat(100_000))]);
    let blobs = s.root().join("blobs/sha256");

    // A layer whose bytes do not match the config's diff id (first layer is fine: it must
    // be collected again, not left behind).
    let arch = t.path().join("tampered.tar");
    docker_archive(&[good.clone(), other.clone()], "tampered:1", &arch);
    let mut bytes = std::fs::read(&arch).unwrap();
    let pos = bytes.windows(5).position(|w| w == b"bbbbb").unwrap();
    bytes[pos] = b'X';
    std::fs::write(&arch, &bytes).unwrap();
    let before = count(&blobs);
    let e = s.import(&archive(&arch), None).unwrap_err();
    assert!(matches!(e, ImageError::DigestMismatch { .. }), "{e}");
    assert!(e.to_string().contains("layer 2"), "{e}");
    assert_eq!(count(&blobs), before, "no blob of a failed import stays");
    assert!(matches!(
        s.manifest("tampered:1"),
        Err(ImageError::NotFound(_))
    ));

    // A truncated gzip layer in an OCI layout.
    let dir = t.path().join("trunc");
    let img = oci_image(&[OciLayer::gzip(other.clone())]);
    oci_layout(&img, "t", &dir);
    let (d, data) = &img.blobs[1];
    std::fs::write(
        dir.join("blobs/sha256")
            .join(d.strip_prefix("sha256:").unwrap()),
        &data[..data.len() / 2],
    )
    .unwrap();
    let e = s.import(&archive(&dir), Some("trunc:1")).unwrap_err();
    assert!(
        e.to_string().contains("size") || e.to_string().contains("truncated"),
        "{e}"
    );
    assert_eq!(count(&blobs), before);

    // A tampered manifest is caught by its digest before any layer is read.
    let dir = t.path().join("badmanifest");
    let img = oci_image(&[OciLayer::tar(good.clone())]);
    oci_layout(&img, "m", &dir);
    let mp = dir
        .join("blobs/sha256")
        .join(img.manifest_digest.strip_prefix("sha256:").unwrap());
    let mut m = std::fs::read(&mp).unwrap();
    m.push(b' ');
    std::fs::write(&mp, m).unwrap();
    let e = s.import(&archive(&dir), Some("badmanifest:1")).unwrap_err();
    assert!(matches!(e, ImageError::DigestMismatch { .. }), "{e}");

    // A stored layer corrupted on disk fails `verify` (mounting runs it first).
    s.import(
        &archive(&{
            let a = t.path().join("good.tar");
            docker_archive(&[good], "good:1", &a);
            a
        }),
        None,
    )
    .unwrap();
    let l = s.manifest("good:1").unwrap().layers[0].clone();
    s.verify(&l).unwrap();
    let p = s.blob_path(&l).unwrap();
    let mut data = std::fs::read(&p).unwrap();
    let n = data.len();
    data[n - 1] ^= 0xff;
    std::fs::write(&p, &data).unwrap();
    assert!(matches!(s.verify(&l), Err(ImageError::Corrupt { .. })));
    // No scratch directories are left in the store.
    assert_eq!(count(&s.root().join("tmp")), 0);
}

#[test]
fn bad_archives_and_unsupported_media_types_say_what_is_wrong() {
    if should_skip() {
        return;
    }
    let t = scratch("errs");
    let s = store(t.path());
    let junk = t.path().join("junk.tar");
    std::fs::write(&junk, vec![7u8; 5000]).unwrap();
    let e = s.import(&archive(&junk), Some("junk:1")).unwrap_err();
    assert!(matches!(e, ImageError::BadArchive { .. }), "{e}");
    assert_eq!(e.code(), warren_types::ErrorCode::InvalidRequest);

    let e = s
        .import(&archive(&t.path().join("missing.tar")), Some("x:1"))
        .unwrap_err();
    assert!(matches!(e, ImageError::BadArchive { .. }), "{e}");

    // A tar that is neither kind of archive.
    let plain = t.path().join("plain.tar");
    std::fs::write(&plain, tar_entries(&[("hello", "world")])).unwrap();
    let e = s.import(&archive(&plain), Some("x:1")).unwrap_err();
    assert!(e.to_string().contains("manifest.json"), "{e}");

    // An encrypted layer.
    let dir = t.path().join("enc");
    let mut l = OciLayer::tar(tar_entries(&[("a", "b")]));
    l.media_type = "application/vnd.oci.image.layer.v1.tar+encrypted".into();
    oci_layout(&oci_image(&[l]), "enc", &dir);
    let e = s.import(&archive(&dir), Some("enc:1")).unwrap_err();
    assert!(matches!(e, ImageError::UnsupportedMedia { .. }), "{e}");
    assert!(e.to_string().contains("+encrypted"), "{e}");

    // A layer that climbs out of its root, and one that writes through a symlink.
    let arch = t.path().join("escape.tar");
    docker_archive(
        &[tar_raw_name("../../etc/warren-evil", "x")],
        "escape:1",
        &arch,
    );
    let e = s.import(&archive(&arch), None).unwrap_err();
    assert!(matches!(e, ImageError::BadArchive { .. }), "{e}");
    assert!(e.to_string().contains("escapes"), "{e}");
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_size(0);
    h.set_mode(0o777);
    b.append_link(&mut h, "etc", "/etc").unwrap();
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_size(1);
    h.set_mode(0o644);
    b.append_data(&mut h, "etc/warren-evil", &b"x"[..]).unwrap();
    let arch = t.path().join("through-link.tar");
    docker_archive(&[b.into_inner().unwrap()], "link:1", &arch);
    let e = s.import(&archive(&arch), None).unwrap_err();
    assert!(e.to_string().contains("not a directory"), "{e}");
    assert!(!Path::new("/etc/warren-evil").exists());

    // No usable name and none given.
    let arch = t.path().join("noname.tar");
    docker_archive(
        &[tar_entries(&[("a", "b")])],
        "Registry.Example/UPPER:1",
        &arch,
    );
    let e = s.import(&archive(&arch), None).unwrap_err();
    assert!(matches!(e, ImageError::BadRef(_)), "{e}");
    assert!(s.list().is_empty());
    assert_eq!(count(&s.root().join("blobs/sha256")), 0);
    assert_eq!(count(&s.root().join("tmp")), 0);
}

#[test]
fn stacks_compose_images_and_gc_spares_what_is_referenced_or_leased() {
    if should_skip() {
        return;
    }
    let t = scratch("gc");
    let s = store(t.path());
    let mk = |name: &str, file: &str| {
        let d = t.path().join(name);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(file), name).unwrap();
        s.build_layer(&d, &format!("{name}:1")).unwrap().layers[0].clone()
    };
    let base = mk("base", "b");
    let task = mk("task", "t");
    let tools = mk("tools", "x");
    let info = s.info("task:1").unwrap();
    assert!(info.layers[0].source.starts_with("dir:"));
    // A stack of images, and a stack that names a stack.
    s.tag_stack("env:1", &["base:1".into(), "task:1".into()], None)
        .unwrap();
    let full = s
        .tag_stack("full:1", &["env:1".into(), "tools:1".into()], None)
        .unwrap();
    assert_eq!(full.layers, vec![base.clone(), task.clone(), tools.clone()]);
    assert_eq!(full.stack, vec!["env:1".to_string(), "tools:1".to_string()]);
    assert_eq!(s.resolve(&["full:1".into()]).unwrap(), full.layers);
    // `tag` copies an image under a new name.
    s.tag_stack("full:latest", &["full:1".into()], None)
        .unwrap();
    assert_eq!(s.info("full:latest").unwrap().stack, full.stack);
    assert!(matches!(
        s.resolve(&["nope:1".into()]),
        Err(ImageError::NotFound(_))
    ));

    // Nothing unreferenced yet.
    assert!(s.gc().unwrap().removed.is_empty());
    // A sandbox leases `full:1`; then every image goes.
    let leased = s.acquire("n9-sandbox1", &["full:1".into()]).unwrap();
    assert_eq!(leased, full.layers);
    for img in [
        "base:1",
        "task:1",
        "tools:1",
        "env:1",
        "full:1",
        "full:latest",
    ] {
        let d = s.remove_and_collect(img).unwrap();
        assert!(d.gc.removed.is_empty(), "{img}: {:?}", d.gc);
    }
    let r = s.gc().unwrap();
    assert!(r.removed.is_empty());
    assert_eq!(r.in_use.len(), 3, "{r:?}");
    // Mount the base layer like a sandbox would have; releasing the lease collects and
    // unmounts it.
    let mnt = s
        .root()
        .join("mnt")
        .join(base.strip_prefix("sha256:").unwrap());
    std::fs::create_dir_all(&mnt).unwrap();
    warren_sys::mount::mount_erofs_file(&s.blob_path(&base).unwrap(), &mnt).unwrap();
    let r = s.release_and_collect("n9-sandbox1").unwrap();
    assert_eq!(r.removed.len(), 3, "{r:?}");
    assert!(r.freed_bytes > 0);
    assert!(!warren_sys::mount::is_mount_point(&mnt));
    assert!(!mnt.exists());
    assert!(s.layers().is_empty());
    assert_eq!(count(&s.root().join("layers")), 0);

    // Unreferenced layers (a fork snapshot no sandbox holds any more) go with `gc`.
    let d = t.path().join("snap");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("s"), "s").unwrap();
    let f = s.tmp_path("snap");
    let out = std::process::Command::new("mkfs.erofs")
        .arg("--quiet")
        .arg(&f)
        .arg(&d)
        .output()
        .unwrap();
    assert!(out.status.success());
    let lease = s.temp_lease("fork").unwrap();
    let snap = s
        .add_layer(&f, "fork snapshot", None, Some(&lease))
        .unwrap();
    assert_eq!(s.gc().unwrap().in_use, vec![snap.clone()]);
    drop(lease);
    assert_eq!(s.gc().unwrap().removed, vec![snap]);

    // Stale leases of a node's sandboxes are dropped by `release_stale`.
    let l = mk("kept", "k");
    s.acquire("n9-a", &["kept:1".into()]).unwrap();
    s.acquire("n9-b", &["kept:1".into()]).unwrap();
    s.remove("kept:1").unwrap();
    let (dropped, r) = s.release_stale("n9-", &["n9-a"]).unwrap();
    assert_eq!(dropped, vec!["n9-b".to_string()]);
    assert!(r.removed.is_empty(), "n9-a still holds it");
    let (_, r) = s.release_stale("n9-", &[]).unwrap();
    assert_eq!(r.removed, vec![l]);
}

#[test]
fn stores_written_before_layer_metadata_still_read() {
    if should_skip() {
        return;
    }
    let t = scratch("old");
    let root = t.path().join("store");
    // The older layout: a blob and a manifest without `stack`, no layers/ metadata.
    std::fs::create_dir_all(root.join("blobs/sha256")).unwrap();
    std::fs::create_dir_all(root.join("images/default")).unwrap();
    let blob = b"pretend erofs";
    let hex = sha256_hex(blob);
    std::fs::write(root.join("blobs/sha256").join(&hex), blob).unwrap();
    std::fs::write(
        root.join("images/default/latest.json"),
        format!(r#"{{"name":"default","tag":"latest","layers":["sha256:{hex}"],"created_ms":5,"source":"/x","size_bytes":13}}"#),
    )
    .unwrap();
    let s = ImageStore::open(&root).unwrap();
    let info = s.info("default").unwrap();
    assert_eq!(info.layers[0].size_bytes, 13);
    assert!(info.stack.is_empty());
    assert_eq!(s.list_info().len(), 1);
    // Reading wrote nothing.
    assert_eq!(count(&root.join("layers")), 0);
}

/// A layer built from a directory keeps each file's modification time (Python's bytecode
/// caches and `make` compare them with their sources) and still packs to one digest whenever
/// it is built: the image's own build time, the only thing that differed, is pinned. The
/// layer mounts, so its superblock checksum is right.
#[test]
fn built_layers_keep_file_times_and_pack_to_one_digest() {
    if should_skip() {
        return;
    }
    let t = scratch("times");
    let d = t.path().join("tree");
    std::fs::create_dir_all(d.join("pkg/__pycache__")).unwrap();
    std::fs::write(d.join("pkg/mod.py"), "x = 1\n").unwrap();
    std::fs::write(d.join("pkg/__pycache__/mod.cpython-311.pyc"), "cache").unwrap();
    let source_time = filetime::FileTime::from_unix_time(1_577_934_245, 0);
    filetime::set_file_mtime(d.join("pkg/mod.py"), source_time).unwrap();
    let s = store(t.path());
    let second = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    };
    let started = second();
    let first = s.build_layer(&d, "times:1").unwrap().layers[0].clone();
    // The second packing happens in a later second of the builder's clock.
    while second() == started {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let again = s.build_layer(&d, "times:2").unwrap().layers[0].clone();
    assert_eq!(first, again, "the same tree packed to two digests");
    let got = layer_tree(&s, "times:1", 0);
    assert_eq!(got, describe(&d), "the layer's files differ from the tree");
    assert!(
        got["pkg/mod.py"].contains("mtime=1577934245"),
        "{}",
        got["pkg/mod.py"]
    );
}
