//! Image builds on this node (`POST /v1/images/build`): the context is received into the
//! store's scratch space, the build runs in a task of its own (`warren_build::build`) and its
//! log goes out as it happens.
//!
//! This part owns only the glue: every `RUN` is an ordinary sandbox of the node's
//! [`Manager`] (created for the caller, so quotas hold; limits and network of the build),
//! whose command is run with a streamed exec and whose writable layer is captured
//! ([`Files::capture_layer`]) before the sandbox is deleted — whatever happens, the
//! sandbox goes.

use bytes::Bytes;
use futures::{Stream, StreamExt};
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use warren_build::{BuildError, BuildRequest, Host, RunEvent, RunResult, RunSpec};
use warren_image::{ImageManifest, ImageStore};
use warren_types::{
    ApiError, BuildEvent, BuildOptions, Caller, CreateSandboxRequest, ErrorCode, ExecEvent,
    ExecRequest, ImageRef, NetworkMode, NetworkPolicy, SandboxId,
};

use crate::error::NodeError;
use crate::manager::{Files, Manager, Processes};

/// Longest Dockerfile and context the node takes (the context is spooled to disk).
const MAX_CONTEXT_BYTES: u64 = 8 << 30;

/// The build routes' owner. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Builds {
    manager: Manager,
    store: Option<Arc<ImageStore>>,
}

impl Builds {
    pub fn new(manager: Manager, store: Option<Arc<ImageStore>>) -> Builds {
        Builds { manager, store }
    }

    /// Starts a build of the context `body` (a tar) for `caller`; the log comes on the
    /// returned channel, ending with a `result` or an `error` event. Errors before anything
    /// ran (bad options, no store, an unreadable context) are returned here.
    pub async fn build<S, E>(
        &self,
        caller: &Caller,
        opts: BuildOptions,
        mut body: S,
    ) -> Result<mpsc::Receiver<BuildEvent>, NodeError>
    where
        S: Stream<Item = Result<Bytes, E>> + Send + Unpin,
        E: std::fmt::Display,
    {
        warren_types::validate::image_ref(&opts.tag)?;
        let store = self.store.clone().ok_or_else(|| {
            NodeError::Api(ApiError::new(
                ErrorCode::NotFound,
                "this node has no image store",
            ))
        })?;
        if let Some(n) = opts.network.as_deref() {
            if n != "none" && n != "default" {
                return Err(ApiError::invalid(format!(
                    "network {n:?}: use \"none\" or \"default\""
                ))
                .into());
            }
        }
        let owner = if caller.is_admin() {
            None
        } else {
            caller.tenant.clone()
        };
        // Receive the context.
        let spool = store.tmp_path("build-context.tar");
        let dir = store.tmp_path("build-context");
        let received = async {
            let mut f = tokio::fs::File::create(&spool).await?;
            let mut n = 0u64;
            while let Some(chunk) = body.next().await {
                let chunk =
                    chunk.map_err(|e| std::io::Error::other(format!("upload interrupted: {e}")))?;
                n += chunk.len() as u64;
                if n > MAX_CONTEXT_BYTES {
                    return Err(std::io::Error::other(format!(
                        "the context is larger than {MAX_CONTEXT_BYTES} bytes"
                    )));
                }
                f.write_all(&chunk).await?;
            }
            f.flush().await
        }
        .await;
        let unpacked = match received {
            Ok(()) => {
                let (spool, dir) = (spool.clone(), dir.clone());
                tokio::task::spawn_blocking(move || unpack_context(&spool, &dir))
                    .await
                    .map_err(ContextError::Task)
                    .and_then(|r| r)
            }
            Err(e) => Err(ContextError::Receive(e)),
        };
        let _ = tokio::fs::remove_file(&spool).await;
        let dockerfile = unpacked.and_then(|()| {
            let name = opts.dockerfile.as_deref().unwrap_or("Dockerfile");
            let rel = warren_build::stack::clean(std::path::Path::new(name));
            // Inside the context: the tar may hold a Dockerfile that links to a node file.
            warren_build::context::read_text(&dir, &rel).map_err(|source| {
                ContextError::Dockerfile {
                    name: name.to_string(),
                    source,
                }
            })
        });
        let dockerfile = match dockerfile {
            Ok(d) => d,
            Err(e) => {
                let _ = tokio::fs::remove_dir_all(&dir).await;
                return Err(ApiError::invalid(e.to_string()).into());
            }
        };
        let host: Arc<dyn Host> = Arc::new(NodeHost {
            manager: self.manager.clone(),
            store: store.clone(),
            caller: caller.clone(),
            insecure: opts.insecure,
        });
        let req = BuildRequest {
            dockerfile,
            context: dir.clone(),
            options: opts,
            owner,
        };
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(async move {
            // The log passes through here to note the layers this build made or reused.
            let (step_tx, mut step_rx) = mpsc::channel(64);
            let forward = async {
                let mut made = Vec::new();
                while let Some(ev) = step_rx.recv().await {
                    if let BuildEvent::StepDone { layer: Some(l), .. }
                    | BuildEvent::Cached { layer: Some(l), .. } = &ev
                    {
                        made.push(l.clone());
                    }
                    let _ = tx.send(ev).await;
                }
                made
            };
            // A client that went away (the log's receiver dropped) cancels the build: its
            // future is dropped, and with it the running step, whose sandbox is deleted.
            // Before, the build ran every step on (each up to its timeout) for nobody.
            let work = async { tokio::join!(warren_build::build(host, req, step_tx), forward) };
            let (built, made) = tokio::select! {
                done = work => done,
                () = tx.closed() => {
                    tracing::info!("image build cancelled: its client went away");
                    (Err(BuildError::Cancelled), Vec::new())
                }
            };
            if let Ok(b) = &built {
                publish(&store, &made, &b.image).await;
            }
            let last = match built {
                Ok(b) => BuildEvent::Result {
                    image: Box::new(b.image),
                    steps_run: b.steps_run,
                    steps_cached: b.steps_cached,
                    seconds: b.seconds,
                },
                Err(e) => {
                    tracing::info!(error = %e, "image build failed");
                    e.event()
                }
            };
            // The context goes before the last event: a client that sees the end sees no
            // scratch file of the build.
            let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir)).await;
            let _ = tx.send(last).await;
        });
        Ok(rx)
    }
}

/// With a blob store, uploads the image's layers this build made (the base's are the base's
/// to publish) before the result is told, so that other nodes start from them lazily. An
/// upload that fails (a read-only HTTP store, an outage) leaves the image on this node
/// alone, with a warning in the node's log: the image is built and tagged all the same.
async fn publish(store: &Arc<ImageStore>, made: &[String], image: &warren_types::ImageInfo) {
    let own: Vec<String> = image
        .layers
        .iter()
        .map(|l| l.digest.clone())
        .filter(|d| made.contains(d))
        .collect();
    if own.is_empty() {
        return;
    }
    let st = store.clone();
    match tokio::task::spawn_blocking(move || st.publish_layers(&own)).await {
        Ok(Ok(sent)) if !sent.is_empty() => {
            tracing::info!(image = %image.reference, layers = sent.len(), "built layers published to the blob store")
        }
        Ok(Ok(_)) => {}
        Ok(Err(e)) => {
            tracing::warn!(image = %image.reference, error = %e, "the built layers stay on this node")
        }
        Err(e) => tracing::warn!(error = %e, "publishing the built layers"),
    }
}

/// Why a build's context cannot be used (answered `invalid_request`).
#[derive(Debug, thiserror::Error)]
enum ContextError {
    #[error("receiving the context: {0}")]
    Receive(#[source] std::io::Error),
    #[error("create {}: {source}", dir.display())]
    Create {
        dir: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Spool(#[source] std::io::Error),
    #[error("bad context tar: {0}")]
    Tar(#[source] warren_image::import::unpack::UnpackError),
    #[error("{0}")]
    Task(#[source] tokio::task::JoinError),
    #[error("reading {name} from the context: {source}")]
    Dockerfile {
        name: String,
        #[source]
        source: std::io::Error,
    },
}

/// Unpacks the context tar into `dir` (nothing outside it; owners as root's).
fn unpack_context(tar: &std::path::Path, dir: &std::path::Path) -> Result<(), ContextError> {
    std::fs::create_dir_all(dir).map_err(|source| ContextError::Create {
        dir: dir.to_path_buf(),
        source,
    })?;
    let f = std::fs::File::open(tar).map_err(ContextError::Spool)?;
    warren_image::import::unpack::unpack(std::io::BufReader::new(f), dir)
        .map(|_| ())
        .map_err(ContextError::Tar)
}

/// The node as a build sees it.
struct NodeHost {
    manager: Manager,
    store: Arc<ImageStore>,
    caller: Caller,
    /// Registries are pulled from over plain HTTP.
    insecure: bool,
}

impl NodeHost {
    /// The build's network: none, or every service of the node's configuration.
    fn policy(&self, none: bool) -> NetworkPolicy {
        match (none, self.manager.parts().network.get()) {
            (false, Some(n)) => NetworkPolicy {
                mode: NetworkMode::Allow,
                services: n.service_names().into_iter().map(|s| (s, true)).collect(),
                ..Default::default()
            },
            _ => NetworkPolicy::none(),
        }
    }

    async fn run_in(
        &self,
        id: &SandboxId,
        spec: &RunSpec,
        out: &mpsc::Sender<RunEvent>,
    ) -> Result<RunResult, BuildError> {
        let host_err = |e: NodeError| {
            let a = e.to_api();
            BuildError::Host {
                code: a.code,
                message: a.message,
            }
        };
        let req = ExecRequest {
            argv: Some(spec.argv.clone()),
            cwd: Some(spec.cwd.clone()),
            env: spec.env.iter().cloned().collect::<BTreeMap<_, _>>(),
            // Root by number when `USER` names nobody: an image without /etc/passwd (a
            // static busybox) has no "root" to look up, and docker runs it as uid 0 too.
            user: Some(spec.user.clone().unwrap_or_else(|| "0".into())),
            timeout_secs: Some(spec.timeout_secs),
            stdin: spec
                .stdin
                .as_ref()
                .map(|b| String::from_utf8_lossy(b).into_owned()),
            kill_tree: true,
            ..Default::default()
        };
        let mut events = Processes::new(self.manager.clone())
            .exec_stream(id, req)
            .await
            .map_err(host_err)?;
        let mut result = None;
        while let Some(ev) = events.next().await {
            match ev {
                ExecEvent::Stdout { data } => {
                    let _ = out.send(RunEvent::Stdout(data.into_bytes())).await;
                }
                ExecEvent::Stderr { data } => {
                    let _ = out.send(RunEvent::Stderr(data.into_bytes())).await;
                }
                ExecEvent::Exit { result: r } => result = Some(r),
                ExecEvent::Error { error } => {
                    return Err(BuildError::Host {
                        code: error.code,
                        message: error.message,
                    })
                }
            }
        }
        let r = result.ok_or_else(|| BuildError::Host {
            code: ErrorCode::SandboxLost,
            message: "the command's stream ended without an exit".into(),
        })?;
        let mut res = RunResult {
            exit_code: r.exit_code,
            signal: r.signal,
            timed_out: r.timed_out,
            layer: None,
        };
        if r.exit_code == Some(0) && !r.timed_out {
            let exclude: Vec<String> = warren_build::build::NOT_CAPTURED
                .iter()
                .map(|s| s.to_string())
                .collect();
            res.layer = Some(
                Files::new(self.manager.clone())
                    .capture_layer(id, &exclude, &spec.source)
                    .await
                    .map_err(host_err)?,
            );
        }
        Ok(res)
    }
}

#[async_trait::async_trait]
impl Host for NodeHost {
    fn store(&self) -> &Arc<ImageStore> {
        &self.store
    }

    async fn run(
        &self,
        spec: RunSpec,
        out: mpsc::Sender<RunEvent>,
    ) -> Result<RunResult, BuildError> {
        let req = CreateSandboxRequest {
            image: ImageRef::Stack(spec.layers.clone()),
            memory_mb: spec.memory_mb,
            cpus: spec.cpus,
            disk_mb: spec.disk_mb,
            network: self.policy(spec.no_network),
            labels: [("warren.build".to_string(), "step".to_string())].into(),
            ..Default::default()
        };
        // The create runs to its end whatever happens to this future (`create_as`), and
        // what it made comes back inside a guard made on the same task, so a sandbox made
        // for a build that is gone (its client went away: never received, or dropped with
        // the channel) is deleted, not left running.
        let (made_tx, made_rx) = tokio::sync::oneshot::channel();
        let (manager, caller) = (self.manager.clone(), self.caller.clone());
        tokio::spawn(async move {
            let made = match manager.create_as(&caller, req).await {
                Ok(c) => match c.info.id.parse::<SandboxId>() {
                    Ok(id) => Ok((id.clone(), DeleteOnDrop(Some((manager.clone(), id))))),
                    Err(e) => Err(BuildError::Host {
                        code: ErrorCode::Internal,
                        message: format!("{e}"),
                    }),
                },
                Err(e) => {
                    let a = e.to_api();
                    Err(BuildError::Host {
                        code: a.code,
                        message: format!("starting the step's sandbox: {}", a.message),
                    })
                }
            };
            let _ = made_tx.send(made);
        });
        // The sandbox goes whatever happens, even when this future is dropped mid-run.
        let (id, mut guard) = made_rx.await.map_err(|_| BuildError::Host {
            code: ErrorCode::Internal,
            message: "the step's sandbox was never made".into(),
        })??;
        let res = self.run_in(&id, &spec, &out).await;
        guard.0 = None;
        // On a task too: a delete cut short half-way would leave the sandbox behind.
        let manager = self.manager.clone();
        let _ = tokio::spawn(async move {
            if let Err(e) = manager.delete(&id).await {
                tracing::warn!(sandbox = %id, error = %e, "removing a build step's sandbox");
            }
        })
        .await;
        res
    }

    async fn pull(&self, reference: &str) -> Result<Option<ImageManifest>, BuildError> {
        let owner = if self.caller.is_admin() {
            None
        } else {
            self.caller.tenant.clone()
        };
        let Some(name) = pulled_name(reference, owner.as_deref()) else {
            return Ok(None);
        };
        // Pulled by an earlier build: the store's copy (as `docker build` uses its own).
        if let Ok(m) = self.store.manifest(&name) {
            return Ok(Some(m));
        }
        let opts = warren_image::import::registry::RegistryOptions {
            insecure: self.insecure,
            credentials: None,
            owner,
            // The name is the build's own (a hash of the reference); two builds pulling the
            // same `FROM` at once both tag what the registry served, neither is refused.
            replace: true,
        };
        warren_image::import::registry::import_registry(self.store.clone(), reference, &name, &opts)
            .await
            .and_then(|_| self.store.manifest(&name))
            .map(Some)
            .map_err(|e| BuildError::Host {
                code: e.code(),
                message: format!("FROM {reference}: pulling it: {e}"),
            })
    }
}

/// The Warren name a registry image `FROM` names is kept under (`pulled-<repo>-<hash>:<tag>`,
/// the hash over the owner and the whole reference), or `None` when `reference` names no
/// registry host (`host.domain/…`, `host:port/…`, `localhost/…`): bare names are Warren's
/// own images, never looked up on a registry unasked.
fn pulled_name(reference: &str, owner: Option<&str>) -> Option<String> {
    use sha2::Digest;
    let (host, rest) = reference.split_once('/')?;
    if !(host.contains('.') || host.contains(':') || host == "localhost") || rest.is_empty() {
        return None;
    }
    let (repo, tag) = match rest.split_once('@') {
        Some((r, d)) => (r, d.rsplit(':').next().unwrap_or(d)),
        None => match rest.rsplit_once(':') {
            Some((r, t)) if !t.contains('/') => (r, t),
            _ => (rest, "latest"),
        },
    };
    let clean = |s: &str, max: usize| -> String {
        let c: String = s
            .to_ascii_lowercase()
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '.' || c == '_' || c == '-' {
                    c
                } else {
                    '-'
                }
            })
            .collect();
        c.trim_start_matches('.').chars().take(max).collect()
    };
    let mut h = sha2::Sha256::new();
    h.update(owner.unwrap_or("").as_bytes());
    h.update(b"\0");
    h.update(reference.as_bytes());
    let hash = hex::encode(&h.finalize()[..6]);
    let name = format!("pulled-{}-{hash}:{}", clean(repo, 80), clean(tag, 64));
    warren_types::validate::image_ref(&name).ok()?;
    Some(name)
}

/// Deletes a build step's sandbox when dropped (on a task, since drop cannot wait).
struct DeleteOnDrop(Option<(Manager, SandboxId)>);

impl Drop for DeleteOnDrop {
    fn drop(&mut self) {
        if let Some((m, id)) = self.0.take() {
            tokio::spawn(async move {
                if let Err(e) = m.delete(&id).await {
                    tracing::warn!(sandbox = %id, error = %e, "removing a build step's sandbox");
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::pulled_name;

    #[test]
    fn registry_references_get_warren_names() {
        let n = pulled_name("127.0.0.1:5000/team/base:v1.2", None).unwrap();
        assert!(
            n.starts_with("pulled-team-base-") && n.ends_with(":v1.2"),
            "{n}"
        );
        assert!(pulled_name("localhost/base", None)
            .unwrap()
            .ends_with(":latest"));
        let d = format!("registry.example/x@sha256:{}", "a".repeat(64));
        assert!(pulled_name(&d, None).unwrap().ends_with(&"a".repeat(64)));
        // Other owners, other names.
        assert_ne!(
            pulled_name("localhost/base", Some("t1")),
            pulled_name("localhost/base", None)
        );
        for bare in ["default", "python:3.11", "library/python:3.11", "scratch"] {
            assert_eq!(pulled_name(bare, None), None, "{bare}");
        }
    }
}
