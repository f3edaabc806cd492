//! `warren image`: the node's layer store, used directly (no daemon needed; root on the node).
//! Import, build and tag here; `ls`/`inspect`/`rm`/`gc` are also served by the daemon's
//! `/v1/images` routes.

use anyhow::Context as _;
use std::path::PathBuf;
use std::sync::Arc;
use warren_image::import::registry::{import_registry, RegistryOptions};
use warren_image::{ImageStore, ImportSource};

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
    /// Import an image: a `docker save` tar, an OCI archive tar, an OCI image layout
    /// directory, or (with --registry) an image of an OCI registry. Each layer is converted
    /// once into an EROFS layer; every blob is checked against its digest.
    Import {
        /// The archive or layout directory (omit with --registry).
        #[arg(required_unless_present = "registry")]
        path: Option<PathBuf>,
        /// Pull `host[:port]/repo[:tag|@digest]` from a registry instead.
        #[arg(long, conflicts_with = "path")]
        registry: Option<String>,
        /// Talk plain HTTP to the registry.
        #[arg(long)]
        insecure: bool,
        /// Registry credentials `user:password` (else anonymous).
        #[arg(long, env = "WARREN_REGISTRY_AUTH", hide_env_values = true)]
        auth: Option<String>,
        /// name[:tag] of the new image (default: the archive's own name, if valid).
        #[arg(long)]
        tag: Option<String>,
    },
    /// Tag a stack of existing images/layers (lowest first) as a new image. No layer is
    /// built or copied.
    Stack {
        /// name[:tag] of the new image
        #[arg(long)]
        tag: String,
        /// Image refs or sha256 digests, lowest first.
        #[arg(required = true)]
        refs: Vec<String>,
    },
    /// Give an existing image another name[:tag].
    Tag { source: String, target: String },
    /// List images.
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Show one image with its layers; exit 1 if it does not exist.
    Inspect { image: String },
    /// Remove an image tag, then collect the layers nothing else references.
    Rm {
        image: String,
        /// Keep the layers (collect later with `warren image gc`).
        #[arg(long)]
        no_gc: bool,
    },
    /// Unmount and delete every layer no image and no live sandbox references.
    Gc,
    /// Check every layer of an image against its digest.
    Verify { image: String },
}

fn print_json(v: &impl serde::Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

pub async fn run(_ctx: &Ctx, args: Args) -> anyhow::Result<i32> {
    let store = Arc::new(
        ImageStore::open(&args.store)
            .with_context(|| format!("open image store {}", args.store.display()))?,
    );
    match args.cmd {
        Cmd::BuildLayer { dir, tag } => {
            let started = std::time::Instant::now();
            let s = store.clone();
            let m = tokio::task::spawn_blocking(move || s.build_layer(&dir, &tag)).await??;
            eprintln!(
                "built {}:{} ({} bytes) in {:.1} s",
                m.name,
                m.tag,
                m.size_bytes,
                started.elapsed().as_secs_f64()
            );
            println!("{}", m.layers[0]);
        }
        Cmd::Import {
            path,
            registry,
            insecure,
            auth,
            tag,
        } => {
            let report = match (path, registry) {
                (_, Some(reference)) => {
                    let tag = tag.context("--tag is needed with --registry")?;
                    let credentials = auth
                        .map(|a| {
                            a.split_once(':')
                                .map(|(u, p)| (u.to_string(), p.to_string()))
                                .context("--auth is user:password")
                        })
                        .transpose()?;
                    let opts = RegistryOptions {
                        insecure,
                        credentials,
                    };
                    import_registry(store.clone(), &reference, &tag, &opts).await?
                }
                (Some(path), None) => {
                    let s = store.clone();
                    tokio::task::spawn_blocking(move || {
                        s.import(&ImportSource::Archive(path), tag.as_deref())
                    })
                    .await??
                }
                (None, None) => anyhow::bail!("give an archive path or --registry"),
            };
            eprintln!(
                "imported {} ({} layers: {} converted, {} already converted; {} MB read) in {:.1} s",
                report.image.reference,
                report.image.layers.len(),
                report.converted,
                report.reused,
                report.bytes_read / 1_000_000,
                report.seconds
            );
            println!("{}", report.image.reference);
        }
        Cmd::Stack { tag, refs } => {
            let s = store.clone();
            let m = tokio::task::spawn_blocking(move || s.tag_stack(&tag, &refs, None)).await??;
            println!("{}:{}", m.name, m.tag);
        }
        Cmd::Tag { source, target } => {
            let s = store.clone();
            let m = tokio::task::spawn_blocking(move || s.tag_stack(&target, &[source], None))
                .await??;
            println!("{}:{}", m.name, m.tag);
        }
        Cmd::Ls { json } => {
            let list = store.list_info();
            if json {
                print_json(&list)?;
            } else {
                println!(
                    "{:<32} {:<12} {:>8} {:>10}  SOURCE",
                    "IMAGE", "TAG", "LAYERS", "SIZE"
                );
                for m in list {
                    println!(
                        "{:<32} {:<12} {:>8} {:>9}M  {}",
                        m.name,
                        m.tag,
                        m.layers.len(),
                        m.size_bytes / (1 << 20),
                        m.source
                    );
                }
            }
        }
        Cmd::Inspect { image } => match store.info(&image) {
            Ok(m) => print_json(&m)?,
            Err(e) => {
                eprintln!("warren: {e}");
                return Ok(1);
            }
        },
        Cmd::Rm { image, no_gc } => {
            if no_gc {
                store.remove(&image)?;
            } else {
                let s = store.clone();
                let r = tokio::task::spawn_blocking(move || s.remove_and_collect(&image)).await??;
                report_gc(&r.gc);
            }
        }
        Cmd::Gc => {
            let s = store.clone();
            let r = tokio::task::spawn_blocking(move || s.gc()).await??;
            report_gc(&r);
        }
        Cmd::Verify { image } => {
            for l in store.manifest(&image)?.layers {
                store.verify(&l)?;
                println!("{l} ok");
            }
        }
    }
    Ok(0)
}

fn report_gc(r: &warren_image::GcReport) {
    for d in &r.removed {
        println!("removed {d}");
    }
    for d in &r.in_use {
        println!("in use  {d}");
    }
    eprintln!(
        "{} layers removed ({} MB freed), {} unreferenced layers still in use",
        r.removed.len(),
        r.freed_bytes / 1_000_000,
        r.in_use.len()
    );
}
