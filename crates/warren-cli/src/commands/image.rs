//! `warren image`: the node's layer store, used directly (no daemon needed; root on the node).

use anyhow::Context as _;
use std::path::PathBuf;
use warren_image::ImageStore;

use super::Ctx;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The layer store directory.
    #[arg(
        long,
        global = true,
        env = "WARREN_IMAGE_STORE",
        default_value = "/var/lib/warren/images"
    )]
    store: PathBuf,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, clap::Subcommand)]
enum Cmd {
    /// Build a read-only EROFS layer from a directory and tag it as a one-layer image.
    BuildLayer {
        dir: PathBuf,
        /// name[:tag]
        #[arg(long)]
        tag: String,
    },
    /// Tag a stack of existing images/layers (lowest first) as a new image.
    Stack {
        /// name[:tag] of the new image
        #[arg(long)]
        tag: String,
        /// Image refs or sha256 digests, lowest first.
        #[arg(required = true)]
        refs: Vec<String>,
    },
    /// List images.
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Show one image; exit 1 if it does not exist.
    Inspect { image: String },
    /// Remove an image tag.
    Rm { image: String },
    /// Check every layer of an image against its digest.
    Verify { image: String },
}

pub async fn run(_ctx: &Ctx, args: Args) -> anyhow::Result<i32> {
    let store = ImageStore::open(&args.store)
        .with_context(|| format!("open image store {}", args.store.display()))?;
    match args.cmd {
        Cmd::BuildLayer { dir, tag } => {
            let started = std::time::Instant::now();
            let m = tokio::task::spawn_blocking(move || store.build_layer(&dir, &tag)).await??;
            eprintln!(
                "built {}:{} ({} bytes) in {:.1} s",
                m.name,
                m.tag,
                m.size_bytes,
                started.elapsed().as_secs_f64()
            );
            println!("{}", m.layers[0]);
        }
        Cmd::Stack { tag, refs } => {
            let layers = store.resolve(&refs)?;
            let (name, t) = tag.split_once(':').unwrap_or((&tag, "latest"));
            warren_types::validate::image_ref(&tag).map_err(|e| anyhow::anyhow!(e.message))?;
            let mut size = 0;
            for l in &layers {
                size += std::fs::metadata(store.blob_path(l)?)
                    .map(|m| m.len())
                    .unwrap_or(0);
            }
            let m = warren_image::ImageManifest {
                name: name.to_string(),
                tag: t.to_string(),
                layers,
                created_ms: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)?
                    .as_millis() as u64,
                source: format!("stack of {}", refs.join(" ")),
                size_bytes: size,
            };
            store.put_manifest(&m)?;
            println!("{}:{}", m.name, m.tag);
        }
        Cmd::Ls { json } => {
            let list = store.list();
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                println!(
                    "{:<32} {:<12} {:>8} {:>10}",
                    "IMAGE", "TAG", "LAYERS", "SIZE"
                );
                for m in list {
                    println!(
                        "{:<32} {:<12} {:>8} {:>9}M",
                        m.name,
                        m.tag,
                        m.layers.len(),
                        m.size_bytes / (1 << 20)
                    );
                }
            }
        }
        Cmd::Inspect { image } => match store.manifest(&image) {
            Ok(m) => println!("{}", serde_json::to_string_pretty(&m)?),
            Err(e) => {
                eprintln!("warren: {e}");
                return Ok(1);
            }
        },
        Cmd::Rm { image } => store.remove(&image)?,
        Cmd::Verify { image } => {
            for l in store.manifest(&image)?.layers {
                store.verify(&l)?;
                println!("{l} ok");
            }
        }
    }
    Ok(0)
}
