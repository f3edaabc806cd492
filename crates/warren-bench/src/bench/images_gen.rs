//! Generated images for `warren-bench images`: deterministic trees of many small files and a
//! few large ones, stored as EROFS layers (with chunk tables) and as tar archives in the
//! directory the blob server serves.

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};
use warren_blob::{blob_key, chunks_key, hex_of, ChunkTable, DEFAULT_CHUNK_SIZE};

/// One generated image.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GenImage {
    pub digest: String,
    pub erofs_bytes: u64,
    pub tar_key: String,
    pub tar_bytes: u64,
    pub file_bytes: u64,
    pub files: usize,
    /// Paths under `/data` a sandbox reads (about `read_pct` of the bytes).
    pub read: Vec<String>,
    pub read_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenParams {
    /// Layout version of the generated images (bumped when the generator changes).
    pub layout: u32,
    pub images: usize,
    pub mb: u64,
    pub read_pct: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct GenState {
    params: GenParams,
    images: Vec<GenImage>,
}

/// Fills `buf` with bytes of a xorshift stream.
fn fill(buf: &mut [u8], state: &mut u64) {
    for c in buf.chunks_mut(8) {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        let b = state.to_le_bytes();
        c.copy_from_slice(&b[..c.len()]);
    }
}

/// Writes the tree of image `i` (about `bytes` of file data) under `root/data`.
fn write_tree(root: &Path, i: usize, bytes: u64) -> Result<Vec<(String, u64)>> {
    let mut st = 0x9e37_79b9_7f4a_7c15u64 ^ ((i as u64 + 1) << 32);
    let mut files = Vec::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut written = 0u64;
    // 40% of the bytes in small files (2-48 KiB, 100 per directory), 60% in 8-32 MiB ones.
    let small_target = bytes * 4 / 10;
    let mut k = 0usize;
    while written < small_target {
        fill(&mut buf[..8], &mut st);
        let size = 2048 + (u64::from_le_bytes(buf[..8].try_into().expect("8 bytes")) % (46 * 1024));
        let rel = format!("src/m{:03}/f{:05}.dat", k / 100, k);
        let p = root.join("data").join(&rel);
        if k.is_multiple_of(100) {
            std::fs::create_dir_all(p.parent().expect("has parent"))?;
        }
        fill(&mut buf[..size as usize], &mut st);
        std::fs::write(&p, &buf[..size as usize])?;
        files.push((rel, size));
        written += size;
        k += 1;
    }
    std::fs::create_dir_all(root.join("data/big"))?;
    let mut j = 0;
    while written < bytes {
        fill(&mut buf[..8], &mut st);
        let size = ((8 << 20)
            + u64::from_le_bytes(buf[..8].try_into().expect("8 bytes")) % (24 << 20))
            .min(bytes - written)
            .max(4096);
        let rel = format!("big/b{j:03}.bin");
        let mut f = std::io::BufWriter::new(std::fs::File::create(root.join("data").join(&rel))?);
        let mut left = size;
        while left > 0 {
            let n = left.min(buf.len() as u64) as usize;
            fill(&mut buf[..n], &mut st);
            f.write_all(&buf[..n])?;
            left -= n as u64;
        }
        f.flush()?;
        files.push((rel, size));
        written += size;
        j += 1;
    }
    Ok(files)
}

/// Picks what a sandbox reads (deterministically) until `pct` percent of the bytes are
/// covered: whole directories of small files (as an interpreter importing packages does) and
/// whole large files, in a shuffled order.
fn pick(files: &[(String, u64)], total: u64, pct: u64, seed: u64) -> (Vec<String>, u64) {
    let mut groups: Vec<(String, Vec<usize>, u64)> = Vec::new();
    for (i, (rel, size)) in files.iter().enumerate() {
        let key = if rel.starts_with("big/") {
            rel.clone()
        } else {
            rel.rsplit_once('/')
                .map(|(d, _)| d.to_string())
                .unwrap_or_default()
        };
        match groups.last_mut() {
            Some(g) if g.0 == key => {
                g.1.push(i);
                g.2 += size;
            }
            _ => groups.push((key, vec![i], *size)),
        }
    }
    let mut st = seed | 1;
    for i in (1..groups.len()).rev() {
        st ^= st << 13;
        st ^= st >> 7;
        st ^= st << 17;
        groups.swap(i, (st % (i as u64 + 1)) as usize);
    }
    let target = total * pct / 100;
    let (mut out, mut sum) = (Vec::new(), 0u64);
    for (_, idx, size) in groups {
        if sum >= target {
            break;
        }
        // Groups only while they fit, so the share stays near the target.
        if sum + size > target + (2 << 20) {
            continue;
        }
        out.extend(idx.iter().map(|&i| files[i].0.clone()));
        sum += size;
    }
    (out, sum)
}

fn run(cmd: &mut std::process::Command, what: &str) -> Result<()> {
    let out = cmd.output().with_context(|| format!("running {what}"))?;
    if !out.status.success() {
        bail!("{what} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// Generates (or reuses) the images in `served`, building trees under `scratch`.
pub fn generate(served: &Path, scratch: &Path, params: &GenParams) -> Result<Vec<GenImage>> {
    let state_path = served.join("bench-images.json");
    if let Ok(d) = std::fs::read(&state_path) {
        if let Ok(s) = serde_json::from_slice::<GenState>(&d) {
            if s.params == *params
                && s.images.iter().all(|i| {
                    served
                        .join(blob_key(hex_of(&i.digest).unwrap_or("")))
                        .exists()
                })
            {
                eprintln!(
                    "bench images: reusing {} generated images in {}",
                    s.images.len(),
                    served.display()
                );
                return Ok(s.images);
            }
        }
    }
    std::fs::create_dir_all(served.join("sha256"))?;
    std::fs::create_dir_all(served.join("tar"))?;
    let mut images = Vec::new();
    for i in 0..params.images {
        let t = std::time::Instant::now();
        let tree: PathBuf = scratch.join(format!("tree-{i}"));
        let _ = std::fs::remove_dir_all(&tree);
        std::fs::create_dir_all(&tree)?;
        let files = write_tree(&tree, i, params.mb << 20)?;
        let total: u64 = files.iter().map(|f| f.1).sum();
        let erofs = scratch.join(format!("img-{i}.erofs"));
        run(
            std::process::Command::new("mkfs.erofs")
                .arg("--quiet")
                .arg("-T0")
                .arg("--all-root")
                // One extent per file: with tail packing the last block of every small file
                // sits beside its inode, scattered over the image, and a lazy reader fetches
                // chunks for both places.
                .arg("-Enoinline_data")
                .arg(&erofs)
                .arg(&tree),
            "mkfs.erofs (install erofs-utils)",
        )?;
        let tar_key = format!("tar/img-{i}.tar");
        run(
            std::process::Command::new("tar")
                .arg("-C")
                .arg(&tree)
                .args(["--owner=0", "--group=0", "-cf"])
                .arg(served.join(&tar_key))
                .arg("."),
            "tar",
        )?;
        std::fs::remove_dir_all(&tree)?;
        let table = ChunkTable::compute(&erofs, DEFAULT_CHUNK_SIZE)?;
        let hex = hex_of(&table.digest)?.to_string();
        std::fs::write(served.join(chunks_key(&hex)), serde_json::to_vec(&table)?)?;
        // The scratch directory may be on another file system than the served one.
        if std::fs::rename(&erofs, served.join(blob_key(&hex))).is_err() {
            std::fs::copy(&erofs, served.join(blob_key(&hex)))?;
            std::fs::remove_file(&erofs)?;
        }
        let (read, read_bytes) = pick(&files, total, params.read_pct, i as u64 * 7919 + 1);
        let img = GenImage {
            digest: table.digest.clone(),
            erofs_bytes: table.size,
            tar_key: tar_key.clone(),
            tar_bytes: std::fs::metadata(served.join(&tar_key))?.len(),
            file_bytes: total,
            files: files.len(),
            read,
            read_bytes,
        };
        eprintln!(
            "bench images: image {i}: {} files, {} MiB, EROFS {} MiB, reads {} files / {} MiB ({:.1} s)",
            img.files,
            total >> 20,
            img.erofs_bytes >> 20,
            img.read.len(),
            img.read_bytes >> 20,
            t.elapsed().as_secs_f64()
        );
        images.push(img);
    }
    std::fs::write(
        &state_path,
        serde_json::to_vec(&GenState {
            params: params.clone(),
            images: images.clone(),
        })?,
    )?;
    Ok(images)
}
