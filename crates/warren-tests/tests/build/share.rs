//! Task images built `FROM` one base share it: each adds only its own layer, the base's
//! layers are one file each in the store (counted on disk: the blobs the 20 images use
//! together weigh the base once plus the tasks' own layers), and sandboxes of different
//! task images mount each base layer once.

use super::{build, result_of, write};
use crate::common::{image_store, Daemon};
use crate::layers;
use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;

const TASKS: usize = 20;

/// Bytes a blob of the store takes on disk.
fn blob_bytes(digest: &str) -> u64 {
    let hex = digest.trim_start_matches("sha256:");
    let m = std::fs::metadata(image_store().join("blobs/sha256").join(hex))
        .unwrap_or_else(|e| panic!("the blob of {digest} is not in the store: {e}"));
    assert_eq!(m.nlink(), 1, "{digest} is stored under one name");
    m.blocks() * 512
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_images_from_one_base_store_the_base_once() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let base = d.client().image("default").await.unwrap().layers;
    let base: Vec<String> = base.into_iter().map(|l| l.digest).collect();
    let t = layers::scratch("build-share");
    let mut tags = Vec::new();
    let mut own = BTreeSet::new();
    let mut used = BTreeSet::new();
    for i in 0..TASKS {
        let ctx = t.path().join(format!("task{i}"));
        write(
            &ctx,
            "Dockerfile",
            "FROM default\nARG N\nENV TASK=$N\nCOPY tests/ /task/tests/\nCMD [\"sh\", \"/task/tests/run.sh\"]\n",
        );
        write(&ctx, "tests/run.sh", &format!("echo task {i}\n"));
        write(
            &ctx,
            "tests/data.txt",
            &format!("{}\n", "x".repeat(i * 100)),
        );
        let tag = format!("{}:1", super::unique(&format!("task{i}")));
        let n = format!("N={i}");
        let (code, out, err) = build(
            &d,
            &[
                ctx.to_str().unwrap(),
                "-t",
                &tag,
                "--build-arg",
                &n,
                "--json",
            ],
        );
        assert_eq!(code, 0, "build {i} failed: {out}{err}");
        let r = result_of(&out);
        let layers: Vec<String> = r["image"]["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["digest"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(layers.len(), base.len() + 1, "{r}");
        assert_eq!(
            layers[..base.len()],
            base[..],
            "task {i} is built on the base's layers"
        );
        own.insert(layers[base.len()].clone());
        used.extend(layers);
        tags.push(tag);
    }
    assert_eq!(own.len(), TASKS, "each task has a layer of its own");
    // On disk: the blobs of the 20 images are the base's (once) and the tasks' own, and no
    // task layer holds a copy of the base (each is a few KiB).
    let base_bytes: u64 = base.iter().map(|l| blob_bytes(l)).sum();
    let own_bytes: Vec<u64> = own.iter().map(|l| blob_bytes(l)).collect();
    let all: u64 = used.iter().map(|l| blob_bytes(l)).sum();
    assert_eq!(all, base_bytes + own_bytes.iter().sum::<u64>());
    assert!(
        own_bytes.iter().all(|&b| b < 256 << 10),
        "task layers hold only the task's files: {own_bytes:?} (base {base_bytes})"
    );

    // Sandboxes of three task images: the base's layers are mounted once, for all of them.
    let mut ids = Vec::new();
    for (i, tag) in tags.iter().enumerate().take(3) {
        let id = d.create(&super::image(tag)).await.id;
        assert_eq!(
            d.sh_ok(&id, "echo $TASK; sh /task/tests/run.sh").await,
            format!("{i}\ntask {i}\n")
        );
        ids.push(id);
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    for l in &base {
        let mnt = image_store()
            .join("mnt")
            .join(l.trim_start_matches("sha256:"));
        let n = mounts
            .lines()
            .filter(|m| m.split(' ').nth(4) == Some(mnt.to_str().unwrap()))
            .count();
        assert_eq!(n, 1, "{l} is mounted once at {}", mnt.display());
    }
    for id in ids {
        d.client().delete(&id).await.unwrap();
    }
    for tag in tags {
        d.client().delete_image(&tag).await.unwrap();
    }
}
