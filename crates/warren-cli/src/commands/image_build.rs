//! `warren image build`: sends a build context to the daemon and prints the build's log as
//! it happens (`Step k/n`, `CACHED`, the output of each `RUN`). Exits non-zero when the build
//! fails, after printing the failing step, its exit status and its last lines of output.

use anyhow::Context as _;
use std::collections::BTreeMap;
use std::path::PathBuf;
use warren_client::{BuildEvent, BuildOptions};

use super::Ctx;

#[derive(Debug, clap::Args)]
pub struct BuildArgs {
    /// The build context directory.
    context: PathBuf,
    /// The Dockerfile (default: CONTEXT/Dockerfile).
    #[arg(short = 'f', long = "file")]
    file: Option<PathBuf>,
    /// name[:tag] of the image.
    #[arg(short = 't', long)]
    tag: String,
    /// A build argument KEY=VALUE (repeatable; KEY alone takes it from the environment).
    #[arg(long = "build-arg")]
    build_args: Vec<String>,
    /// The stage to build (default: the last).
    #[arg(long)]
    target: Option<String>,
    /// Run every step, whatever the cache holds.
    #[arg(long)]
    no_cache: bool,
    /// Pull FROM images of registries over plain HTTP (a registry on loopback).
    #[arg(long)]
    insecure: bool,
    /// `none`: RUN steps have no network (default: the node's configured services).
    #[arg(long)]
    network: Option<String>,
    /// Memory of each RUN's sandbox (MiB).
    #[arg(long)]
    memory: Option<u64>,
    /// CPUs of each RUN's sandbox.
    #[arg(long)]
    cpus: Option<f64>,
    /// Writable layer of each RUN's sandbox (MiB).
    #[arg(long)]
    disk: Option<u64>,
    /// Longest a RUN may take (seconds).
    #[arg(long)]
    step_timeout: Option<f64>,
    /// Print only the image's name (and errors).
    #[arg(short, long)]
    quiet: bool,
}

/// The Dockerfile's name inside the context sent, for one given outside the context.
const OUTSIDE_DOCKERFILE: &str = ".warren-build.Dockerfile";

pub async fn run(ctx: &Ctx, a: &BuildArgs, json: bool) -> anyhow::Result<i32> {
    let mut build_args = BTreeMap::new();
    for b in &a.build_args {
        match b.split_once('=') {
            Some((k, v)) => build_args.insert(k.to_string(), v.to_string()),
            None => build_args.insert(b.clone(), std::env::var(b).unwrap_or_default()),
        };
    }
    anyhow::ensure!(
        a.context.is_dir(),
        "{}: the build context must be a directory",
        a.context.display()
    );
    let context = a.context.canonicalize()?;
    // A Dockerfile inside the context is named by its path there; one outside is sent along.
    let (dockerfile, extra) = match &a.file {
        None => (None, None),
        Some(f) => {
            let f = f
                .canonicalize()
                .with_context(|| format!("reading {}", f.display()))?;
            match f.strip_prefix(&context) {
                Ok(rel) => (Some(rel.display().to_string()), None),
                Err(_) => (
                    Some(OUTSIDE_DOCKERFILE.to_string()),
                    Some(std::fs::read(&f).with_context(|| format!("reading {}", f.display()))?),
                ),
            }
        }
    };
    let opts = BuildOptions {
        tag: a.tag.clone(),
        dockerfile,
        build_args,
        target: a.target.clone(),
        no_cache: a.no_cache,
        insecure: a.insecure,
        network: a.network.clone(),
        memory_mb: a.memory,
        cpus: a.cpus,
        disk_mb: a.disk,
        step_timeout_secs: a.step_timeout,
    };
    let client = ctx.client()?;
    let tar = pack_context(context.clone(), extra);
    let stream = client
        .build_image(tokio_util::io::StreamReader::new(tar), &opts)
        .await
        .context("starting the build")?;
    let quiet = a.quiet || json;
    let mut failed = None;
    let res = stream
        .finish(|ev| {
            if json {
                if let Ok(s) = serde_json::to_string(ev) {
                    println!("{s}");
                }
                return;
            }
            match ev {
                BuildEvent::Step {
                    step,
                    total,
                    instruction,
                    ..
                } if !quiet => eprintln!("Step {step}/{total} : {instruction}"),
                BuildEvent::Cached { .. } if !quiet => eprintln!(" ---> CACHED"),
                BuildEvent::Output { line, .. } if !quiet => eprintln!("{line}"),
                BuildEvent::StepDone {
                    layer: Some(l),
                    seconds,
                    ..
                } if !quiet => eprintln!(" ---> {} ({seconds:.1} s)", short(l)),
                BuildEvent::Error { .. } => failed = Some(ev.clone()),
                BuildEvent::Result {
                    image,
                    steps_run,
                    steps_cached,
                    seconds,
                } if !quiet => eprintln!(
                    "built {} ({}; {} run, {steps_cached} cached) in {seconds:.1} s",
                    image.reference,
                    crate::table::count(image.layers.len() as u64, "layer"),
                    crate::table::count(*steps_run as u64, "step"),
                ),
                _ => {}
            }
        })
        .await;
    match res {
        Ok(image) => {
            if !json {
                println!("{}", image.reference);
            }
            Ok(0)
        }
        Err(e) => {
            if let Some(BuildEvent::Error {
                output_tail,
                exit_code,
                instruction,
                step,
                ..
            }) = &failed
            {
                if !json && !output_tail.is_empty() && quiet {
                    for l in output_tail {
                        eprintln!("{l}");
                    }
                }
                if let (Some(s), Some(i)) = (step, instruction) {
                    eprintln!(
                        "warren: step {s} failed: {i}{}",
                        exit_code.map_or(String::new(), |c| format!(" (exit status {c})"))
                    );
                }
            }
            eprintln!("warren: build failed: {e}");
            Ok(1)
        }
    }
}

fn short(layer: &str) -> &str {
    let h = layer.strip_prefix("sha256:").unwrap_or(layer);
    &h[..h.len().min(12)]
}

/// The context as a tar stream (made on a blocking thread), with `extra` added as the
/// Dockerfile named [`OUTSIDE_DOCKERFILE`].
fn pack_context(
    dir: PathBuf,
    extra: Option<Vec<u8>>,
) -> impl futures::Stream<Item = std::io::Result<bytes::Bytes>> + Send + Unpin + 'static {
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<bytes::Bytes>>(4);
    tokio::task::spawn_blocking(move || {
        struct W(tokio::sync::mpsc::Sender<std::io::Result<bytes::Bytes>>);
        impl std::io::Write for W {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0
                    .blocking_send(Ok(bytes::Bytes::copy_from_slice(b)))
                    .map_err(|_| std::io::Error::other("the upload stopped"))?;
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let errors = tx.clone();
        let w = std::io::BufWriter::with_capacity(256 << 10, W(tx));
        let mut b = tar::Builder::new(w);
        b.follow_symlinks(false);
        let r = (|| {
            b.append_dir_all(".", &dir)?;
            if let Some(data) = &extra {
                let mut h = tar::Header::new_gnu();
                h.set_size(data.len() as u64);
                h.set_mode(0o644);
                h.set_cksum();
                b.append_data(&mut h, OUTSIDE_DOCKERFILE, data.as_slice())?;
            }
            std::io::Write::flush(&mut b.into_inner()?)?;
            Ok::<_, std::io::Error>(())
        })();
        if let Err(e) = r {
            let _ = errors.blocking_send(Err(e));
        }
    });
    Box::pin(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|c| (c, rx))
    }))
}
