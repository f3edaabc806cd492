//! Images as sandboxes see them, against a real `warrend` (run as root): stacks of imported
//! layers with overrides and deletions, an import round trip seen from inside a sandbox,
//! corrupt layers never mounted, the image routes, and garbage collection that spares live
//! sandboxes (fork snapshots included) and collects what they leave.

#[path = "../common/mod.rs"]
mod common;
#[path = "../../../warren-image/tests/common/mod.rs"]
mod layers;

use common::{bin_dir, image_store, Daemon};
use std::path::Path;
use std::process::Command;
use warren_client::{
    ClientError, CreateSandboxRequest, ErrorCode, ExecRequest, ForkRequest, ImageRef,
};

/// A name unique to this test process.
fn unique(what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{what}-{}-{}", std::process::id(), nanos % 100_000)
}

/// `warren image ...` on the daemons' store; panics with its output on failure.
fn warren_image(args: &[&str]) -> String {
    let out = Command::new(bin_dir().join("warren"))
        .arg("image")
        .args(args)
        .arg("--store")
        .arg(image_store())
        .output()
        .expect("running warren image");
    assert!(
        out.status.success(),
        "warren image {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn import(archive: &Path, tag: &str) {
    warren_image(&["import", archive.to_str().unwrap(), "--tag", tag]);
}

fn stack(refs: &[&str]) -> CreateSandboxRequest {
    CreateSandboxRequest {
        image: ImageRef::Stack(refs.iter().map(|s| s.to_string()).collect()),
        ..Default::default()
    }
}

fn api_code(e: &ClientError) -> Option<ErrorCode> {
    match e {
        ClientError::Api { error, .. } => Some(error.code),
        _ => None,
    }
}

/// A stack of three layers (the default image, a task layer, a tools layer) composed at
/// create: overrides, a file deleted by a whiteout (also one of the base image), and a
/// directory made opaque, as a sandbox sees them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_layer_stack_overrides_and_deletes_across_layers() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let t = layers::scratch("stack");
    let task = unique("stk-task");
    let tools = unique("stk-tools");
    let l2 = layers::tar_entries(&[
        ("work/", ""),
        ("work/a", "a from task"),
        ("work/b", "b from task"),
        ("work/gone", "g"),
        ("work/d/", ""),
        ("work/d/x", "x"),
        ("work/d/y", "y"),
    ]);
    let l3 = layers::tar_entries(&[
        ("work/", ""),
        ("work/a", "a from tools"),
        ("work/.wh.gone", ""),
        ("work/d/", ""),
        ("work/d/.wh..wh..opq", ""),
        ("work/d/z", "z"),
        ("etc/", ""),
        ("etc/.wh.debian_version", ""),
        ("work/new", "n"),
    ]);
    let a2 = t.path().join("task.tar");
    let a3 = t.path().join("tools.tar");
    layers::docker_archive(&[l2], "x:1", &a2);
    layers::docker_archive(&[l3], "x:1", &a3);
    import(&a2, &format!("{task}:1"));
    import(&a3, &format!("{tools}:1"));

    let id = d
        .create(&stack(&[
            "default",
            &format!("{task}:1"),
            &format!("{tools}:1"),
        ]))
        .await
        .id;
    let out = d
        .sh_ok(
            &id,
            "cat /work/a; echo; cat /work/b; echo; ls /work/d; ls /work; \
             test -e /work/gone && echo gone-exists; test -e /etc/debian_version && echo base-exists; \
             test -e /etc/os-release && echo base-kept",
        )
        .await;
    assert_eq!(
        out, "a from tools\nb from task\nz\na\nb\nd\nnew\nbase-kept\n",
        "the composed view"
    );
    // The writable layer on top still works over whiteouts and opaque dirs.
    assert_eq!(
        d.sh_ok(
            &id,
            "echo back > /work/gone && cat /work/gone && touch /work/d/w && ls /work/d"
        )
        .await,
        "back\nw\nz\n"
    );
    // The same layers in another order give another view; no layer is built for either:
    // every layer the second sandbox holds was in the store before it was created. (Other
    // tests import, fork and collect in the same store meanwhile, so the store's size says
    // nothing.)
    let before = blob_names();
    let id2 = d
        .create(&stack(&[
            "default",
            &format!("{tools}:1"),
            &format!("{task}:1"),
        ]))
        .await
        .id;
    assert_eq!(
        d.sh_ok(&id2, "cat /work/a; echo; ls /work/d | tr '\\n' ' '")
            .await,
        "a from task\nx y z "
    );
    let held = lease_layers(&id2);
    assert!(held.len() >= 3, "{held:?}");
    for l in &held {
        let hex = l.strip_prefix("sha256:").unwrap_or(l);
        assert!(before.contains(hex), "{l} was made for the stack");
    }
    d.client().delete(&id).await.unwrap();
    d.client().delete(&id2).await.unwrap();
    for img in [&task, &tools] {
        let r = d.client().delete_image(&format!("{img}:1")).await.unwrap();
        assert_eq!(r.gc.removed.len(), 1, "{r:?}");
    }
}

/// Lists a tree the same way on the host and inside a sandbox (Python is in both).
const DESCRIBE_PY: &str = r#"
import os, stat, sys, hashlib
root = sys.argv[1]
inodes = {}
lines = {}
for dirpath, dirs, files in os.walk(root):
    dirs.sort()
    for name in sorted(dirs + files):
        p = os.path.join(dirpath, name)
        st = os.lstat(p)
        rel = os.path.relpath(p, root)
        kind = {stat.S_IFDIR: "dir", stat.S_IFLNK: "symlink", stat.S_IFCHR: "char", stat.S_IFBLK: "block", stat.S_IFIFO: "fifo"}.get(stat.S_IFMT(st.st_mode), "file")
        line = "%s mode=%o owner=%d:%d" % (kind, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)
        if kind == "file":
            line += " size=%d sha256=%s" % (st.st_size, hashlib.sha256(open(p, "rb").read()).hexdigest()[:16])
            if st.st_nlink > 1:
                inodes.setdefault(st.st_ino, []).append(rel)
        elif kind == "symlink":
            line += " -> " + os.readlink(p)
        elif kind in ("char", "block"):
            line += " rdev=%x" % st.st_rdev
        if kind != "dir":
            line += " mtime=%d" % int(st.st_mtime)
        if kind in ("file", "dir"):
            attrs = sorted(a for a in os.listxattr(p, follow_symlinks=False) if a.startswith("user."))
            if attrs:
                line += " xattrs=" + ",".join("%s=%s" % (a, os.getxattr(p, a).decode()) for a in attrs)
        lines[rel] = line
for names in inodes.values():
    if len(names) > 1:
        for n in names:
            lines[n] += " links=" + ",".join(sorted(names))
for k in sorted(lines):
    print(k, lines[k])
"#;

/// Every kind of file imported from a `docker save` archive, as seen inside a sandbox, is
/// what it was in the source tree: contents, modes (set-id bits included), owners (idmapped
/// to the sandbox's own ids), symlinks, hard links, devices, FIFOs, times, xattrs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_round_trip_seen_inside_a_sandbox() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let t = layers::scratch("rtsb");
    let src = t.path().join("src");
    layers::rich_tree(&src);
    let layer = t.path().join("layer.tar");
    layers::tar_dir(&src, &layer);
    let arch = t.path().join("rich.tar");
    layers::docker_archive(&[std::fs::read(&layer).unwrap()], "x:1", &arch);
    let img = unique("rich");
    import(&arch, &format!("{img}:1"));
    let script = t.path().join("describe.py");
    std::fs::write(&script, DESCRIBE_PY).unwrap();
    let host = Command::new("python3")
        .arg(&script)
        .arg(src.join("rt"))
        .output()
        .unwrap();
    assert!(
        host.status.success(),
        "{}",
        String::from_utf8_lossy(&host.stderr)
    );
    let want = String::from_utf8(host.stdout).unwrap();
    assert!(want.contains("links=linked,sub/also-linked"), "{want}");

    let id = d.create(&stack(&["default", &format!("{img}:1")])).await.id;
    d.client()
        .write_file_bytes(
            &id,
            "/tmp/describe.py",
            None,
            DESCRIBE_PY.as_bytes().to_vec(),
        )
        .await
        .unwrap();
    let got = d.sh_ok(&id, "python3 /tmp/describe.py /rt").await;
    assert_eq!(
        got, want,
        "inside the sandbox the tree differs from its source"
    );
    d.client().delete(&id).await.unwrap();
    d.client().delete_image(&format!("{img}:1")).await.unwrap();
}

/// A layer whose stored bytes no longer match its digest is refused at mount time: the
/// create fails with a message naming the corruption, and the layer is never mounted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_layer_is_reported_and_never_mounted() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let t = layers::scratch("corrupt");
    let img = unique("corrupt");
    let arch = t.path().join("c.tar");
    layers::docker_archive(&[layers::tar_entries(&[("c", &img)])], "x:1", &arch);
    import(&arch, &format!("{img}:1"));
    let info = d.client().image(&format!("{img}:1")).await.unwrap();
    let digest = info.layers[0].digest.clone();
    let hex = digest.strip_prefix("sha256:").unwrap();
    let blob = image_store().join("blobs/sha256").join(hex);
    let mut data = std::fs::read(&blob).unwrap();
    let n = data.len();
    data[n - 100] ^= 0x55;
    std::fs::write(&blob, &data).unwrap();
    let e = d
        .client()
        .create(&stack(&["default", &format!("{img}:1")]))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("corrupt"), "{e}");
    assert!(!warren_sys::mount::is_mount_point(
        &image_store().join("mnt").join(hex)
    ));
    assert!(d
        .client()
        .list(&Default::default(), None)
        .await
        .unwrap()
        .is_empty());
    let r = d.client().delete_image(&format!("{img}:1")).await.unwrap();
    assert_eq!(r.gc.removed, vec![digest]);
}

/// The image routes: list, inspect, delete; clear errors for unknown and malformed refs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_routes_and_their_errors() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let c = d.client();
    let list = c.images().await.unwrap();
    let def = list
        .iter()
        .find(|i| i.reference == "default:latest")
        .expect("default is listed");
    assert!(!def.layers.is_empty() && def.size_bytes > 0);
    assert_eq!(c.image("default").await.unwrap().layers, def.layers);
    let e = c.image("no-such-image:9").await.unwrap_err();
    assert_eq!(api_code(&e), Some(ErrorCode::NotFound), "{e}");
    let e = c.delete_image("no-such-image:9").await.unwrap_err();
    assert_eq!(api_code(&e), Some(ErrorCode::NotFound), "{e}");
    let e = c.image("Bad..Name").await.unwrap_err();
    assert_eq!(api_code(&e), Some(ErrorCode::InvalidRequest), "{e}");
    let e = c
        .create(&stack(&["default", "no-such-image:9"]))
        .await
        .unwrap_err();
    assert_eq!(api_code(&e), Some(ErrorCode::NotFound), "{e}");
    assert!(e.to_string().contains("no-such-image:9"), "{e}");
    assert!(c.list(&Default::default(), None).await.unwrap().is_empty());
}

fn lease_layers(id: &str) -> Vec<String> {
    let f = std::fs::read(image_store().join("leases").join(format!("{id}.json")))
        .unwrap_or_else(|e| panic!("lease of {id}: {e}"));
    let v: serde_json::Value = serde_json::from_slice(&f).unwrap();
    v["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap().to_string())
        .collect()
}

fn mounted(digest: &str) -> bool {
    let hex = digest.strip_prefix("sha256:").unwrap();
    warren_sys::mount::mounts_under(&image_store().join("mnt"))
        .iter()
        .any(|m| {
            Path::new(m)
                .file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(hex)
        })
}

/// Removing an image a sandbox uses keeps its layers until the sandbox goes; a fork's
/// snapshot layer lives while a child does and is unmounted and deleted with the last one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_spares_live_sandboxes_and_collects_fork_snapshots() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let c = d.client();
    let t = layers::scratch("gcsb");
    let img = unique("gc");
    let arch = t.path().join("g.tar");
    layers::docker_archive(&[layers::tar_entries(&[("g", &img)])], "x:1", &arch);
    import(&arch, &format!("{img}:1"));
    let layer = c.image(&format!("{img}:1")).await.unwrap().layers[0]
        .digest
        .clone();
    let blob = image_store()
        .join("blobs/sha256")
        .join(layer.strip_prefix("sha256:").unwrap());

    let id = d.create(&stack(&["default", &format!("{img}:1")])).await.id;
    assert!(lease_layers(&id).contains(&layer));
    let r = c.delete_image(&format!("{img}:1")).await.unwrap();
    assert!(r.gc.removed.is_empty(), "{r:?}");
    assert_eq!(r.gc.in_use, vec![layer.clone()]);
    let r = c.gc_images().await.unwrap();
    assert!(
        r.in_use.contains(&layer) && !r.removed.contains(&layer),
        "{r:?}"
    );
    assert!(blob.exists() && mounted(&layer));
    assert_eq!(d.sh_ok(&id, "cat /g").await, img);

    // Fork: the children stack the parent's layers and a snapshot of its writable layer.
    d.sh_ok(&id, "echo state > /state").await;
    let kids = c
        .fork(
            &id,
            &ForkRequest {
                n: 2,
                labels: Default::default(),
            },
        )
        .await
        .unwrap();
    let snap = lease_layers(&kids[0].id).last().unwrap().clone();
    assert_eq!(lease_layers(&kids[1].id).last(), Some(&snap));
    assert!(!lease_layers(&id).contains(&snap));
    let snap_blob = image_store()
        .join("blobs/sha256")
        .join(snap.strip_prefix("sha256:").unwrap());
    assert!(snap_blob.exists() && mounted(&snap));
    c.delete(&id).await.unwrap();
    // The parent is gone; the children still hold the imported layer and the snapshot.
    let r = c.gc_images().await.unwrap();
    assert!(
        r.in_use.contains(&snap) && r.in_use.contains(&layer),
        "{r:?}"
    );
    assert_eq!(
        d.sh_ok(&kids[0].id, "cat /state /g").await,
        format!("state\n{img}")
    );
    c.delete(&kids[0].id).await.unwrap();
    assert!(snap_blob.exists(), "one child still uses the snapshot");
    c.delete(&kids[1].id).await.unwrap();
    // The last user is gone: both layers were unmounted and deleted.
    assert!(!snap_blob.exists() && !mounted(&snap));
    assert!(!blob.exists() && !mounted(&layer));
    assert!(!image_store()
        .join("leases")
        .join(format!("{}.json", kids[1].id))
        .exists());
}

/// An image of busybox-style layers without /etc/passwd: commands run as uid 0, gid 0 when no
/// user is named (as docker and podman do), a numeric `uid:gid` needs no file, and a name
/// still has to be found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_without_a_passwd_file_run_as_root() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let t = layers::scratch("nopasswd");
    let root = t.path().join("root");
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::copy("/usr/bin/busybox", root.join("bin/busybox"))
        .expect("busybox-static is installed by scripts/setup.sh");
    std::os::unix::fs::symlink("busybox", root.join("bin/sh")).unwrap();
    let tag = format!("{}:1", unique("nopasswd"));
    warren_image(&["build-layer", root.to_str().unwrap(), "--tag", &tag]);
    let id = d.create(&stack(&[&tag])).await.id;

    let id_of = |user: Option<&str>| {
        let mut req = ExecRequest::argv([
            "/bin/busybox",
            "sh",
            "-c",
            "echo $(/bin/busybox id -u):$(/bin/busybox id -g)",
        ]);
        req.user = user.map(str::to_string);
        req
    };
    let r = d.exec(&id, &id_of(None)).await;
    assert_eq!(
        (r.exit_code, r.stdout.as_str()),
        (Some(0), "0:0\n"),
        "{r:?}"
    );
    let r = d.exec(&id, &id_of(Some("1234:99"))).await;
    assert_eq!(
        (r.exit_code, r.stdout.as_str()),
        (Some(0), "1234:99\n"),
        "{r:?}"
    );
    let e = d
        .client()
        .exec(&id, &id_of(Some("agent")))
        .await
        .unwrap_err();
    assert_eq!(api_code(&e), Some(ErrorCode::InvalidRequest), "{e}");
    d.client().delete(&id).await.unwrap();
    warren_image(&["rm", &tag]);
}

/// `warren image import` against a daemon (`--url`): the archive is sent to it, converted
/// there and usable at once; `--json` prints the report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_through_the_daemon() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let t = layers::scratch("remote-import");
    let tag = format!("{}:1", unique("remote"));
    let l = layers::tar_entries(&[("srv/", ""), ("srv/hello", "sent over the API")]);
    let archive = t.path().join("app.tar");
    layers::docker_archive(&[l], "x:1", &archive);
    let url = format!("unix://{}", d.socket.display());
    let out = common::warren_at(
        &url,
        &[
            "image",
            "import",
            archive.to_str().unwrap(),
            "--tag",
            &tag,
            "--json",
        ],
    );
    assert!(out.status.success(), "{out:?}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    assert_eq!(report["image"]["reference"], tag.as_str(), "{report}");
    let id = d.create(&stack(&["default", &tag])).await.id;
    assert_eq!(d.sh_ok(&id, "cat /srv/hello").await, "sent over the API");
    d.client().delete(&id).await.unwrap();
    d.client().delete_image(&tag).await.unwrap();
    // A broken archive is refused with a clear error and leaves nothing.
    let junk = t.path().join("junk.tar");
    std::fs::write(&junk, b"not a tar").unwrap();
    let out = common::warren_at(
        &url,
        &["image", "import", junk.to_str().unwrap(), "--tag", &tag],
    );
    assert_eq!(out.status.code(), Some(125), "{out:?}");
}

/// The names of the store's blobs.
fn blob_names() -> std::collections::BTreeSet<String> {
    std::fs::read_dir(image_store().join("blobs/sha256"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// A tag that exists is replaced only when asked (`--force`, `force=true`), through the
/// daemon and on the node's store alike; a sandbox running on the old image keeps it, in
/// its files, through a collection and in its forks, while new sandboxes get the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_tag_is_replaced_only_with_force_never_under_a_sandbox() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let c = d.client();
    let t = layers::scratch("replace");
    let tag = format!("{}:1", unique("replace"));
    let archive = |name: &str, text: &str| {
        let p = t.path().join(name);
        let l = layers::tar_entries(&[("srv/", ""), ("srv/which", text)]);
        layers::docker_archive(&[l], "x:1", &p);
        p
    };
    let (old, new) = (archive("old.tar", "old"), archive("new.tar", "new"));
    let url = format!("unix://{}", d.socket.display());
    let through_daemon = |p: &Path, force: bool| {
        let mut a = vec!["image", "import", p.to_str().unwrap(), "--tag", &tag];
        if force {
            a.push("--force");
        }
        common::warren_at(&url, &a)
    };
    assert!(through_daemon(&old, false).status.success());
    let id = d.create(&stack(&["default", &tag])).await.id;

    // Refused without --force: warren's own exit status, a message naming the way out, and
    // the image unchanged. The node's store says the same without a daemon in between.
    let out = through_daemon(&new, false);
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("exists") && err.contains("--force"), "{err}");
    let local = Command::new(bin_dir().join("warren"))
        .args(["image", "import", new.to_str().unwrap(), "--tag", &tag])
        .arg("--store")
        .arg(image_store())
        .env_remove("WARREN_URL")
        .output()
        .unwrap();
    assert_eq!(local.status.code(), Some(125), "{local:?}");
    assert!(String::from_utf8_lossy(&local.stderr).contains("--force"));
    for (what, args) in [
        ("stack", vec!["stack", "--tag", tag.as_str(), "default"]),
        ("tag", vec!["tag", "default", tag.as_str()]),
    ] {
        let out = Command::new(bin_dir().join("warren"))
            .arg("image")
            .args(&args)
            .arg("--store")
            .arg(image_store())
            .env_remove("WARREN_URL")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(125), "{what}: {out:?}");
    }
    let e = c
        .pull_image(&warren_client::PullRequest {
            reference: "127.0.0.1:9/never/reached:1".into(),
            tag: tag.clone(),
            insecure: true,
            username: None,
            password: None,
            force: false,
        })
        .await
        .unwrap_err();
    assert_eq!(api_code(&e), Some(ErrorCode::Conflict), "{e}");
    let fresh = d.create(&stack(&["default", &tag])).await.id;
    assert_eq!(d.sh_ok(&fresh, "cat /srv/which").await, "old");

    // With --force: new sandboxes get the new image; the running one keeps the old.
    assert!(through_daemon(&new, true).status.success());
    c.gc_images().await.unwrap();
    assert_eq!(d.sh_ok(&id, "cat /srv/which").await, "old");
    let kids = c
        .fork(
            &id,
            &ForkRequest {
                n: 1,
                labels: Default::default(),
            },
        )
        .await
        .unwrap();
    assert_eq!(d.sh_ok(&kids[0].id, "cat /srv/which").await, "old");
    let later = d.create(&stack(&["default", &tag])).await.id;
    assert_eq!(d.sh_ok(&later, "cat /srv/which").await, "new");
    for s in [&id, &fresh, &kids[0].id, &later] {
        c.delete(s).await.unwrap();
    }
    c.delete_image(&tag).await.unwrap();
}
