//! `warren image`: the node's layer store, used directly (no daemon needed; root on the node).
//! With `--url`/`WARREN_URL` naming a daemon, `ls`, `inspect`, `rm`, `gc` and `import` act on
//! that daemon through its `/v1/images` routes instead (`import --remote` too: the archive is
//! sent to it, or it pulls from the registry), and `build` always does. `build-layer`,
//! `stack`, `tag` and `verify` have no route: they refuse `--url` rather than act on this
//! host's store while the user meant another.
//!
//! Registry credentials come from `--auth`, else from the docker config file
//! (`$DOCKER_CONFIG/config.json`, default `~/.docker/config.json`, its `auths` entries).

use anyhow::Context as _;
use base64::Engine as _;
use std::path::PathBuf;
use std::sync::Arc;
use warren_image::import::registry::{import_registry, RegistryOptions};
use warren_image::{ImageStore, ImportSource};

use super::Ctx;
use crate::table::count;

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
    /// Print the result as JSON
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, clap::Subcommand)]
enum Cmd {
    /// Build an image from a Dockerfile on the daemon: every RUN runs in a sandbox, every
    /// step becomes a layer, unchanged steps come from the build cache.
    Build(super::image_build::BuildArgs),
    /// Build a read-only EROFS layer from a directory and tag it as a one-layer image.
    BuildLayer {
        dir: PathBuf,
        /// name[:tag]
        #[arg(long)]
        tag: String,
        /// Replace the image of that tag if there is one.
        #[arg(long)]
        force: bool,
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
        /// Registry credentials `user:password` (else the docker config file's, else
        /// anonymous).
        #[arg(long, env = "WARREN_REGISTRY_AUTH", hide_env_values = true)]
        auth: Option<String>,
        /// name[:tag] of the new image (default: the archive's own name, if valid).
        #[arg(long)]
        tag: Option<String>,
        /// Import through the daemon (also when --url or WARREN_URL names one)
        #[arg(long)]
        remote: bool,
        /// Replace the image of that tag if there is one (every later sandbox of it gets the
        /// new one; running sandboxes keep theirs).
        #[arg(long)]
        force: bool,
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
        /// Replace the image of that tag if there is one.
        #[arg(long)]
        force: bool,
    },
    /// Give an existing image another name[:tag].
    Tag {
        source: String,
        target: String,
        /// Replace the image of that tag if there is one.
        #[arg(long)]
        force: bool,
    },
    /// List images.
    Ls,
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

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<i32> {
    if let Cmd::Build(b) = &args.cmd {
        return super::image_build::run(ctx, b, args.json).await;
    }
    if ctx.url.is_some() {
        if let Some(code) = remote(ctx, &args).await? {
            return Ok(code);
        }
    }
    if let Cmd::Import {
        path,
        registry,
        insecure,
        auth,
        tag,
        remote,
        force,
    } = &args.cmd
    {
        if *remote || ctx.url.is_some() {
            let credentials = credentials(auth.as_deref(), registry.as_deref())?;
            let pull = match registry {
                Some(reference) => Some(warren_client::PullRequest {
                    reference: reference.clone(),
                    tag: tag.clone().context("--tag is needed with --registry")?,
                    insecure: *insecure,
                    username: credentials.as_ref().map(|c| c.0.clone()),
                    password: credentials.map(|c| c.1),
                    force: *force,
                }),
                None => None,
            };
            return import_remote(ctx, path.clone(), pull, tag.clone(), *force, args.json).await;
        }
    }
    let store = Arc::new(
        ImageStore::open(&args.store)
            .with_context(|| format!("open image store {}", args.store.display()))?,
    );
    match args.cmd {
        Cmd::Build(_) => unreachable!("handled above"),
        Cmd::BuildLayer { dir, tag, force } => {
            refuse_existing(&store, &tag, force)?;
            let started = std::time::Instant::now();
            let s = store.clone();
            let spin =
                crate::progress::Spinner::start(format!("building a layer of {}", dir.display()));
            let m = tokio::task::spawn_blocking(move || s.build_layer(&dir, &tag)).await??;
            drop(spin);
            if args.json {
                return print_json(&m).map(|()| 0);
            }
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
            remote: _,
            force,
        } => {
            let credentials = credentials(auth.as_deref(), registry.as_deref())?;
            let spin = crate::progress::Spinner::start(format!(
                "importing {}",
                registry
                    .clone()
                    .or_else(|| path.as_ref().map(|p| p.display().to_string()))
                    .unwrap_or_default()
            ));
            let report = match (path, registry) {
                (_, Some(reference)) => {
                    let tag = tag.context("--tag is needed with --registry")?;
                    let opts = RegistryOptions {
                        insecure,
                        credentials,
                        owner: None,
                        replace: force,
                    };
                    import_registry(store.clone(), &reference, &tag, &opts).await?
                }
                (Some(path), None) => {
                    let s = store.clone();
                    tokio::task::spawn_blocking(move || {
                        s.import_owned(&ImportSource::Archive(path), tag.as_deref(), None, force)
                    })
                    .await??
                }
                (None, None) => anyhow::bail!("give an archive path or --registry"),
            };
            drop(spin);
            if args.json {
                return print_json(&report).map(|()| 0);
            }
            eprintln!(
                "imported {} ({}: {} converted, {} already converted; {} MB read) in {:.1} s",
                report.image.reference,
                count(report.image.layers.len() as u64, "layer"),
                report.converted,
                report.reused,
                report.bytes_read / 1_000_000,
                report.seconds
            );
            println!("{}", report.image.reference);
        }
        Cmd::Stack { tag, refs, force } => {
            refuse_existing(&store, &tag, force)?;
            let s = store.clone();
            let m = tokio::task::spawn_blocking(move || s.tag_stack(&tag, &refs, None)).await??;
            if args.json {
                return print_json(&m).map(|()| 0);
            }
            println!("{}:{}", m.name, m.tag);
        }
        Cmd::Tag {
            source,
            target,
            force,
        } => {
            refuse_existing(&store, &target, force)?;
            let s = store.clone();
            let m = tokio::task::spawn_blocking(move || s.tag_stack(&target, &[source], None))
                .await??;
            if args.json {
                return print_json(&m).map(|()| 0);
            }
            println!("{}:{}", m.name, m.tag);
        }
        Cmd::Ls => {
            let list = store.list_info();
            if args.json {
                print_json(&list)?;
            } else {
                print_list(&list);
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
                if args.json {
                    println!("{}", serde_json::json!({ "reference": image }));
                }
            } else {
                let s = store.clone();
                let r = tokio::task::spawn_blocking(move || s.remove_and_collect(&image)).await??;
                if args.json {
                    return print_json(&r).map(|()| 0);
                }
                report_gc(&r.gc);
            }
        }
        Cmd::Gc => {
            let s = store.clone();
            let r = tokio::task::spawn_blocking(move || s.gc()).await??;
            if args.json {
                return print_json(&r).map(|()| 0);
            }
            report_gc(&r);
        }
        Cmd::Verify { image } => {
            let layers = store.manifest(&image)?.layers;
            for l in &layers {
                store.verify(l)?;
                if !args.json {
                    println!("{l} ok");
                }
            }
            if args.json {
                println!("{}", serde_json::json!({ "verified": layers }));
            }
        }
    }
    Ok(0)
}

/// `ls`, `inspect`, `rm` and `gc` through the daemon `--url` names; `None` for the commands
/// that are not served there (after refusing `--url` for the local-only ones).
async fn remote(ctx: &Ctx, args: &Args) -> anyhow::Result<Option<i32>> {
    let local_only = |what: &str| {
        ctx.local_only(
            &format!("warren image {what}"),
            " (run it on the node; `warren image import --url` sends an archive)",
        )
    };
    let client = || ctx.client();
    match &args.cmd {
        Cmd::Ls => {
            let list = client()?.images().await?;
            if args.json {
                print_json(&list)?;
            } else {
                print_list(&list);
            }
        }
        Cmd::Inspect { image } => match client()?.image(image).await {
            Ok(m) => print_json(&m)?,
            Err(e) => {
                eprintln!("warren: {e}");
                return Ok(Some(1));
            }
        },
        Cmd::Rm { image, no_gc } => {
            anyhow::ensure!(
                !no_gc,
                "--no-gc works on this host's store only: the daemon always collects"
            );
            let r = client()?.delete_image(image).await?;
            if args.json {
                print_json(&r)?;
            } else {
                report_gc(&r.gc);
            }
        }
        Cmd::Gc => {
            let r = client()?.gc_images().await?;
            if args.json {
                print_json(&r)?;
            } else {
                report_gc(&r);
            }
        }
        Cmd::BuildLayer { .. } => return local_only("build-layer").map(|()| None),
        Cmd::Stack { .. } => return local_only("stack").map(|()| None),
        Cmd::Tag { .. } => return local_only("tag").map(|()| None),
        Cmd::Verify { .. } => return local_only("verify").map(|()| None),
        Cmd::Import { .. } | Cmd::Build(_) => return Ok(None),
    }
    Ok(Some(0))
}

fn print_list(list: &[warren_image::ImageInfo]) {
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

/// `warren image import` through the daemon.
async fn import_remote(
    ctx: &Ctx,
    path: Option<PathBuf>,
    pull: Option<warren_client::PullRequest>,
    tag: Option<String>,
    force: bool,
    json: bool,
) -> anyhow::Result<i32> {
    let client = ctx.client()?;
    let what = pull
        .as_ref()
        .map(|p| p.reference.clone())
        .or_else(|| path.as_ref().map(|p| p.display().to_string()))
        .unwrap_or_default();
    let spin = crate::progress::Spinner::start(format!("importing {what} on the daemon"));
    let r = match (path, pull) {
        (_, Some(req)) => client.pull_image(&req).await,
        (Some(path), None) => {
            if path.is_dir() {
                anyhow::bail!(
                    "{}: an OCI layout directory imports locally only; tar it or run on the node",
                    path.display()
                );
            }
            let f = tokio::fs::File::open(&path)
                .await
                .with_context(|| format!("opening {}", path.display()))?;
            client.import_image(f, tag.as_deref(), force).await
        }
        (None, None) => anyhow::bail!("give an archive path or --registry"),
    }
    .with_context(|| format!("importing {what} on the daemon"))?;
    drop(spin);
    if json {
        return print_json(&r).map(|()| 0);
    }
    eprintln!(
        "imported {} on the daemon ({}: {} converted, {} already converted; {} MB read) in {:.1} s",
        r.image.reference,
        count(r.image.layers.len() as u64, "layer"),
        r.converted,
        r.reused,
        r.bytes_read / 1_000_000,
        r.seconds
    );
    println!("{}", r.image.reference);
    Ok(0)
}

/// Refuses to tag over an image that exists unless `--force`: the store replaces tags, so the
/// question is asked here, before anything is built.
fn refuse_existing(store: &ImageStore, tag: &str, force: bool) -> anyhow::Result<()> {
    if force {
        return Ok(());
    }
    if store.manifest(tag).is_ok() {
        return Err(warren_image::ImageError::Exists(tag.to_string()).into());
    }
    Ok(())
}

/// `--auth user:password`, else the docker config's entry for the registry.
fn credentials(
    auth: Option<&str>,
    registry: Option<&str>,
) -> anyhow::Result<Option<(String, String)>> {
    Ok(match (auth, registry) {
        (Some(a), _) => Some(
            a.split_once(':')
                .map(|(u, p)| (u.to_string(), p.to_string()))
                .context("--auth is user:password")?,
        ),
        (None, Some(r)) => docker_config_auth(&docker_config_path(), r),
        (None, None) => None,
    })
}

/// `$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`.
fn docker_config_path() -> PathBuf {
    match std::env::var_os("DOCKER_CONFIG") {
        Some(d) => PathBuf::from(d).join("config.json"),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
            .join(".docker/config.json"),
    }
}

/// The registry host of `host[:port]/repo[:tag]` as docker names it (`docker.io` when the
/// first part is not a host).
fn registry_host(reference: &str) -> &str {
    match reference.split_once('/') {
        Some((h, _)) if h.contains('.') || h.contains(':') || h == "localhost" => h,
        _ => "docker.io",
    }
}

/// The `user:password` of the docker config's `auths` entry for `reference`'s registry.
fn docker_config_auth(config: &std::path::Path, reference: &str) -> Option<(String, String)> {
    let text = std::fs::read_to_string(config).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    let host = registry_host(reference);
    let auths = v.get("auths")?.as_object()?;
    let entry = auths.iter().find_map(|(k, e)| {
        let k = k
            .trim_start_matches("https://")
            .trim_start_matches("http://");
        let k = k.split('/').next().unwrap_or(k);
        let hub = host == "docker.io" && (k == "index.docker.io" || k == "registry-1.docker.io");
        (k == host || hub).then_some(e)
    })?;
    if let (Some(u), Some(p)) = (
        entry.get("username").and_then(|u| u.as_str()),
        entry.get("password").and_then(|p| p.as_str()),
    ) {
        return Some((u.to_string(), p.to_string()));
    }
    let raw = base64::engine::general_purpose::STANDARD
        .decode(entry.get("auth")?.as_str()?)
        .ok()?;
    let (u, p) = std::str::from_utf8(&raw).ok()?.split_once(':')?;
    Some((u.to_string(), p.to_string()))
}

fn report_gc(r: &warren_image::GcReport) {
    for d in &r.removed {
        println!("removed {d}");
    }
    for d in &r.in_use {
        println!("in use  {d}");
    }
    eprintln!(
        "{} removed ({} MB freed), {} still in use",
        count(r.removed.len() as u64, "layer"),
        r.freed_bytes / 1_000_000,
        count(r.in_use.len() as u64, "unreferenced layer")
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_credentials_come_from_the_docker_config() {
        let t = tempfile::tempdir().unwrap();
        let cfg = t.path().join("config.json");
        let auth = base64::engine::general_purpose::STANDARD.encode("ann:s3cret");
        std::fs::write(
            &cfg,
            serde_json::json!({"auths": {
                "localhost:5000": {"auth": auth},
                "https://index.docker.io/v1/": {"username": "hub", "password": "pw"},
            }})
            .to_string(),
        )
        .unwrap();
        assert_eq!(
            docker_config_auth(&cfg, "localhost:5000/app:1"),
            Some(("ann".into(), "s3cret".into()))
        );
        assert_eq!(
            docker_config_auth(&cfg, "library/debian:12"),
            Some(("hub".into(), "pw".into()))
        );
        assert_eq!(docker_config_auth(&cfg, "ghcr.io/x/y:1"), None);
        assert_eq!(
            docker_config_auth(&t.path().join("none.json"), "localhost:5000/a"),
            None
        );
    }
}
