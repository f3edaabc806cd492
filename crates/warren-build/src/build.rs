//! The planner and the step runner: stages in order, each instruction a step; `RUN`, `COPY`,
//! `ADD` and a `WORKDIR` that makes a directory add a layer (from the cache when it holds
//! the step's key), the others change the stage's configuration.
//!
//! A cache key is the sha256 of the stage's layers so far (the parent), the step's kind and
//! what the step does after substitution: for `RUN` the command, environment (build
//! arguments included), working directory, user and network; for `COPY`/`ADD` the digest of
//! the files it adds (paths, modes, owners, contents). A rebuild of an unchanged Dockerfile
//! over an unchanged base and context finds every key and runs nothing; a change in step k
//! changes the parent of every later step, which then run again.
//!
//! The build holds a temporary lease on every layer it uses or makes until the image is
//! tagged, so no collection removes one meanwhile. A failing step leaves nothing: its
//! sandbox is removed by the host and no layer of it is stored. Layers of the steps before it
//! stay in the cache (unreferenced: the next collection takes them).

use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;
use warren_image::{ImageManifest, ImageStore, Lease};
use warren_types::{BuildEvent, BuildOptions, ErrorCode, ImageConfig, ImageInfo};

use crate::context::Context;
use crate::copy::{self, Source};
use crate::parse::{Args, Instruction};
use crate::stack::StackView;
use crate::words::{pairs, word, words};
use crate::BuildError;

/// What the node does for a build.
#[async_trait::async_trait]
pub trait Host: Send + Sync {
    fn store(&self) -> &Arc<ImageStore>;

    /// Runs `spec` in a new sandbox over `spec.layers`, sending its output to `out` as it
    /// comes; when the command exits 0, captures the sandbox's changes as a layer (held by
    /// the returned lease). The sandbox is removed in every case.
    async fn run(
        &self,
        spec: RunSpec,
        out: mpsc::Sender<RunEvent>,
    ) -> Result<RunResult, BuildError>;

    /// The layers and configuration of a registry image (`FROM host/repo:tag`), pulled and
    /// converted as `image import --registry` does. `None` when this host does not pull.
    async fn pull(&self, reference: &str) -> Result<Option<ImageManifest>, BuildError> {
        let _ = reference;
        Ok(None)
    }
}

/// One `RUN`.
#[derive(Debug, Clone)]
pub struct RunSpec {
    pub layers: Vec<String>,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: String,
    pub user: Option<String>,
    pub stdin: Option<Vec<u8>>,
    /// No network at all (`--network none`, `RUN --network=none`).
    pub no_network: bool,
    pub timeout_secs: f64,
    pub memory_mb: Option<u64>,
    pub cpus: Option<f64>,
    pub disk_mb: Option<u64>,
    /// What the layer records as its origin.
    pub source: String,
}

/// Output of a `RUN` as it comes.
#[derive(Debug, Clone)]
pub enum RunEvent {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
}

/// How a `RUN` ended.
#[derive(Debug)]
pub struct RunResult {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    /// The captured layer (only when the command exited 0).
    pub layer: Option<(String, Lease)>,
}

/// A build to do.
#[derive(Debug, Clone)]
pub struct BuildRequest {
    pub dockerfile: String,
    pub context: PathBuf,
    pub options: BuildOptions,
    /// The tenant the image will belong to (`None`: the node's own).
    pub owner: Option<String>,
}

/// What a build made.
#[derive(Debug, Clone)]
pub struct Built {
    pub image: ImageInfo,
    pub steps_run: usize,
    pub steps_cached: usize,
    pub seconds: f64,
}

/// Default longest `RUN`.
pub const DEFAULT_STEP_TIMEOUT_SECS: f64 = 1800.0;
const TAIL_LINES: usize = 20;
/// The longest line of a step's output in the build log (bytes); a longer one comes in pieces.
pub const MAX_LINE: usize = 16 << 10;

/// Where to cut `b` so that its first piece is at most `max` bytes and ends on a UTF-8
/// character boundary (when `b` is UTF-8 there).
fn utf8_cut(b: &[u8], max: usize) -> usize {
    if b.len() <= max {
        return b.len();
    }
    let mut cut = max;
    // Back over at most three continuation bytes (10xxxxxx) to the start of a character.
    while cut > max.saturating_sub(3) && cut > 0 && b[cut] & 0xC0 == 0x80 {
        cut -= 1;
    }
    if b[cut] & 0xC0 == 0x80 || cut == 0 {
        max
    } else {
        cut
    }
}

/// A spawned task that is aborted when its handle is dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Files the sandbox's start writes into its root: never part of a `RUN`'s layer.
pub const NOT_CAPTURED: &[&str] = &["etc/hostname", "etc/hosts", "etc/resolv.conf"];

/// One stage of the Dockerfile.
#[derive(Debug, Clone)]
struct StageDef {
    name: Option<String>,
    base: String,
    line: usize,
    body: Vec<Instruction>,
}

/// A stage being built.
#[derive(Debug, Clone, Default)]
struct Stage {
    layers: Vec<String>,
    config: ImageConfig,
    /// Build arguments in scope (declared in this stage).
    args: Vec<(String, String)>,
    cmd_set: bool,
}

impl Stage {
    /// Variables for substitution: arguments, then the environment (which wins).
    fn vars(&self) -> Vec<(String, String)> {
        let mut v = self.args.clone();
        v.extend(self.config.env_pairs());
        v
    }

    fn parent_key(&self) -> Sha256 {
        let mut h = Sha256::new();
        for l in &self.layers {
            h.update(l.as_bytes());
            h.update(b"\n");
        }
        h
    }
}

fn invalid(i: &Instruction, m: impl std::fmt::Display) -> BuildError {
    BuildError::Invalid(format!("line {} ({}): {m}", i.line, i.keyword))
}

fn stages(df: &crate::parse::Dockerfile) -> Result<(Vec<Instruction>, Vec<StageDef>), BuildError> {
    let mut globals = Vec::new();
    let mut out: Vec<StageDef> = Vec::new();
    for i in &df.instructions {
        if i.keyword == "FROM" {
            out.push(StageDef {
                name: None,
                base: String::new(),
                line: i.line,
                body: vec![i.clone()],
            });
        } else if let Some(s) = out.last_mut() {
            s.body.push(i.clone());
        } else if i.keyword == "ARG" {
            globals.push(i.clone());
        } else {
            return Err(invalid(i, "only ARG may come before the first FROM"));
        }
    }
    if out.is_empty() {
        return Err(BuildError::Invalid("the Dockerfile has no FROM".into()));
    }
    Ok((globals, out))
}

/// Runs a build, sending its log to `events` (the final result or error is the caller's to
/// send).
pub async fn build(
    host: Arc<dyn Host>,
    req: BuildRequest,
    events: mpsc::Sender<BuildEvent>,
) -> Result<Built, BuildError> {
    let t0 = Instant::now();
    let store = host.store().clone();
    let (name, tag) = {
        let r = &req.options.tag;
        warren_types::validate::image_ref(r).map_err(|e| BuildError::Invalid(e.message))?;
        let (n, t) = r.split_once(':').unwrap_or((r, "latest"));
        (n.to_string(), t.to_string())
    };
    // A build replaces an image of its tag (the rebuild of a task image is the usual case).
    store.check_claim(&name, &tag, req.owner.as_deref(), true)?;
    let df = crate::parse::parse(&req.dockerfile)?;
    let (globals, mut defs) = stages(&df)?;
    let esc = df.escape;
    // Global arguments: defaults, then --build-arg.
    let mut global_args: Vec<(String, String)> = Vec::new();
    for g in &globals {
        for (k, v) in pairs(&g.args.text(), &global_args, esc, false)? {
            let val = req
                .options
                .build_args
                .get(&k)
                .cloned()
                .or(v)
                .unwrap_or_default();
            global_args.push((k, val));
        }
    }
    for d in &mut defs {
        let from = &d.body[0];
        let ws = words(&from.args.text(), &global_args, esc)?;
        match ws.as_slice() {
            [img] => d.base = img.clone(),
            [img, as_, n] if as_.eq_ignore_ascii_case("as") => {
                d.base = img.clone();
                d.name = Some(n.to_ascii_lowercase());
            }
            _ => return Err(invalid(from, "expected FROM image [AS name]")),
        }
    }
    let target = match &req.options.target {
        Some(t) => defs
            .iter()
            .position(|d| d.name.as_deref() == Some(&t.to_ascii_lowercase()))
            .ok_or_else(|| BuildError::Invalid(format!("no stage named {t:?}")))?,
        None => defs.len() - 1,
    };
    let stage_index = |defs: &[StageDef], r: &str, before: usize| -> Option<usize> {
        let r = r.to_ascii_lowercase();
        defs[..before]
            .iter()
            .position(|d| d.name.as_deref() == Some(r.as_str()))
            .or_else(|| r.parse::<usize>().ok().filter(|n| *n < before))
    };
    // The stages the target needs.
    let mut needed = vec![false; defs.len()];
    needed[target] = true;
    for i in (0..=target).rev() {
        if !needed[i] {
            continue;
        }
        if let Some(j) = stage_index(&defs, &defs[i].base, i) {
            needed[j] = true;
        }
        for ins in &defs[i].body {
            if let Some(f) = ins.flag("from") {
                let f = word(f, &global_args, esc)?;
                if let Some(j) = stage_index(&defs, &f, i) {
                    needed[j] = true;
                }
            }
        }
    }
    let total: usize = defs
        .iter()
        .zip(&needed)
        .filter(|(_, n)| **n)
        .map(|(d, _)| d.body.len())
        .sum();
    let lease = store.temp_lease("build")?;
    let ctx = Context::open(&req.context)?;
    let mut b = Builder {
        host,
        store: store.clone(),
        opts: req.options.clone(),
        events,
        lease,
        ctx,
        esc,
        total,
        step: 0,
        run: 0,
        cached: 0,
        built: BTreeMap::new(),
        global_args,
    };
    let wanted: Vec<usize> = (0..=target).filter(|i| needed[*i]).collect();
    for i in wanted {
        let s = b.stage(&defs, i, &stage_index).await?;
        b.built.insert(i, s);
    }
    let fin = b.built.remove(&target).expect("the target stage was built");
    if fin.layers.is_empty() {
        return Err(BuildError::Invalid(
            "the image has no layers (FROM scratch without a COPY or RUN)".into(),
        ));
    }
    let mut size = 0;
    for l in &fin.layers {
        size += store.layer_info(l)?.size_bytes;
    }
    let m = ImageManifest {
        name,
        tag,
        layers: fin.layers.clone(),
        created_ms: now_ms(),
        source: format!(
            "build of {}",
            req.options.dockerfile.as_deref().unwrap_or("Dockerfile")
        ),
        size_bytes: size,
        stack: Vec::new(),
        owner: req.owner.clone(),
        config: Some(fin.config.clone()),
    };
    let st = store.clone();
    let image = tokio::task::spawn_blocking(move || {
        st.put_claimed_manifest(&m, true)?;
        st.info(&format!("{}:{}", m.name, m.tag))
    })
    .await
    .map_err(|e| BuildError::io("tag the image", std::io::Error::other(e.to_string())))??;
    drop(b.lease);
    Ok(Built {
        image,
        steps_run: b.run,
        steps_cached: b.cached,
        seconds: t0.elapsed().as_secs_f64(),
    })
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

struct Builder {
    host: Arc<dyn Host>,
    store: Arc<ImageStore>,
    opts: BuildOptions,
    events: mpsc::Sender<BuildEvent>,
    lease: Lease,
    ctx: Context,
    esc: char,
    total: usize,
    step: usize,
    run: usize,
    cached: usize,
    built: BTreeMap<usize, Stage>,
    global_args: Vec<(String, String)>,
}

type StageIndex = dyn Fn(&[StageDef], &str, usize) -> Option<usize> + Send + Sync;

impl Builder {
    async fn emit(&self, ev: BuildEvent) -> Result<(), BuildError> {
        self.events
            .send(ev)
            .await
            .map_err(|_| BuildError::Cancelled)
    }

    async fn begin(&mut self, stage: Option<&str>, text: String) -> Result<Instant, BuildError> {
        self.step += 1;
        self.emit(BuildEvent::Step {
            step: self.step,
            total: self.total,
            stage: stage.map(str::to_string),
            instruction: text,
        })
        .await?;
        Ok(Instant::now())
    }

    async fn done(&self, layer: Option<String>, t: Instant) -> Result<(), BuildError> {
        self.emit(BuildEvent::StepDone {
            step: self.step,
            layer,
            seconds: t.elapsed().as_secs_f64(),
        })
        .await
    }

    /// Runs blocking store work off the async threads.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> Result<T, BuildError> + Send + 'static,
    ) -> Result<T, BuildError> {
        tokio::task::spawn_blocking(f)
            .await
            .map_err(|e| BuildError::io("build task", std::io::Error::other(e.to_string())))?
    }

    async fn view(&self, layers: &[String]) -> Result<StackView, BuildError> {
        let (store, layers) = (self.store.clone(), layers.to_vec());
        self.blocking(move || StackView::of(&store, &layers)).await
    }

    async fn cache_get(&self, key: &str) -> Result<Option<String>, BuildError> {
        if self.opts.no_cache {
            return Ok(None);
        }
        Ok(self.store.cache_get(key, &self.lease)?)
    }

    async fn stage(
        &mut self,
        defs: &[StageDef],
        index: usize,
        stage_index: &StageIndex,
    ) -> Result<Stage, BuildError> {
        let def = &defs[index];
        let label = def.name.clone().or_else(|| Some(index.to_string()));
        let t = self
            .begin(label.as_deref(), format!("FROM {}", def.base))
            .await?;
        let mut st = if def.base.eq_ignore_ascii_case("scratch") {
            Stage::default()
        } else if let Some(j) = stage_index(defs, &def.base, index) {
            let mut s =
                self.built.get(&j).cloned().ok_or_else(|| {
                    BuildError::Invalid(format!("stage {} is not built", def.base))
                })?;
            s.args.clear();
            s.cmd_set = false;
            s
        } else {
            self.base(&def.base).await?
        };
        self.done(None, t).await?;
        let _ = def.line;
        for ins in def.body.iter().skip(1) {
            self.instruction(&mut st, ins, label.as_deref(), defs, index, stage_index)
                .await?;
        }
        Ok(st)
    }

    /// The stage a `FROM` names that is no stage: a Warren image, else a registry image.
    async fn base(&mut self, r: &str) -> Result<Stage, BuildError> {
        let store = self.store.clone();
        let name = r.to_string();
        let local = self
            .blocking(move || Ok(store.manifest(&name).ok()))
            .await?;
        let m = match local {
            Some(m) => m,
            None => match self.host.pull(r).await? {
                Some(m) => m,
                None => {
                    return Err(BuildError::Invalid(format!(
                        "FROM {r}: no such image on this node (name a registry image with \
                         its host, e.g. docker.io/library/{r}, to pull it)"
                    )))
                }
            },
        };
        for l in &m.layers {
            self.lease.hold(&self.store, l)?;
        }
        Ok(Stage {
            layers: m.layers,
            config: m.config.unwrap_or_default(),
            args: Vec::new(),
            cmd_set: false,
        })
    }

    async fn instruction(
        &mut self,
        st: &mut Stage,
        ins: &Instruction,
        label: Option<&str>,
        defs: &[StageDef],
        index: usize,
        stage_index: &StageIndex,
    ) -> Result<(), BuildError> {
        let esc = self.esc;
        let vars = st.vars();
        let kw = ins.keyword.as_str();
        match kw {
            "RUN" => return self.run_step(st, ins, label).await,
            "COPY" | "ADD" => {
                return self
                    .copy_step(st, ins, label, defs, index, stage_index)
                    .await
            }
            "WORKDIR" => {
                let w = word(ins.args.text().trim(), &vars, esc)?;
                let t = self.begin(label, format!("WORKDIR {w}")).await?;
                let base = st.config.working_dir.clone().unwrap_or_else(|| "/".into());
                let p = Path::new(&base).join(&w);
                let dir = format!("/{}", crate::stack::clean(&p).display());
                st.config.working_dir = Some(dir.clone());
                let layer = if st.layers.is_empty() {
                    None
                } else {
                    let view = self.view(&st.layers).await?;
                    let plan = self.blocking(move || copy::plan_mkdir(&dir, &view)).await?;
                    match plan {
                        Some(p) => Some(self.add_planned(st, "mkdir", p, "WORKDIR").await?),
                        None => None,
                    }
                };
                return self.done(layer, t).await;
            }
            _ => {}
        }
        let text = match kw {
            "CMD" | "ENTRYPOINT" | "SHELL" | "HEALTHCHECK" => ins.display(),
            _ => format!("{kw} {}", word(&ins.args.text(), &vars, esc)?),
        };
        let t = self.begin(label, text).await?;
        let c = &mut st.config;
        match kw {
            "ENV" => {
                for (k, v) in pairs(&ins.args.text(), &vars, esc, true)? {
                    let v = v.ok_or_else(|| invalid(ins, format!("{k} has no value")))?;
                    c.set_env(&k, &v);
                }
            }
            "ARG" => {
                for (k, v) in pairs(&ins.args.text(), &vars, esc, false)? {
                    let val = self
                        .opts
                        .build_args
                        .get(&k)
                        .cloned()
                        .or(v)
                        .or_else(|| {
                            self.global_args
                                .iter()
                                .rev()
                                .find(|(g, _)| *g == k)
                                .map(|(_, v)| v.clone())
                        })
                        .unwrap_or_default();
                    st.args.push((k, val));
                }
            }
            "LABEL" | "MAINTAINER" => {
                if kw == "MAINTAINER" {
                    c.labels
                        .insert("maintainer".into(), word(&ins.args.text(), &vars, esc)?);
                } else {
                    for (k, v) in pairs(&ins.args.text(), &vars, esc, true)? {
                        c.labels.insert(k, v.unwrap_or_default());
                    }
                }
            }
            "USER" => {
                let u = word(ins.args.text().trim(), &vars, esc)?;
                if u.is_empty() {
                    return Err(invalid(ins, "USER needs a user"));
                }
                c.user = Some(u);
            }
            "EXPOSE" => {
                for p in words(&ins.args.text(), &vars, esc)? {
                    let p = if p.contains('/') {
                        p
                    } else {
                        format!("{p}/tcp")
                    };
                    if !c.exposed_ports.contains(&p) {
                        c.exposed_ports.push(p);
                    }
                }
            }
            "STOPSIGNAL" => c.stop_signal = Some(word(ins.args.text().trim(), &vars, esc)?),
            "CMD" => {
                c.cmd = Some(command(&ins.args, c));
                st.cmd_set = true;
            }
            "ENTRYPOINT" => {
                c.entrypoint = Some(command(&ins.args, c));
                if !st.cmd_set {
                    c.cmd = None;
                }
            }
            "SHELL" => match &ins.args {
                Args::Exec(v) if !v.is_empty() => c.shell = Some(v.clone()),
                _ => return Err(invalid(ins, "SHELL takes a JSON array")),
            },
            "HEALTHCHECK" => c.healthcheck = Some(healthcheck(ins)?),
            "VOLUME" | "ONBUILD" => {
                // Kept out: a sandbox's files live in its writable layer; triggers of a
                // later build are not run.
            }
            _ => return Err(invalid(ins, "not supported")),
        }
        self.done(None, t).await
    }

    async fn run_step(
        &mut self,
        st: &mut Stage,
        ins: &Instruction,
        label: Option<&str>,
    ) -> Result<(), BuildError> {
        if ins.flag("mount").is_some() {
            return Err(invalid(ins, "RUN --mount is not supported"));
        }
        let no_network = match ins.flag("network") {
            None | Some("default") => self.opts.network.as_deref() == Some("none"),
            Some("none") => true,
            Some(other) => return Err(invalid(ins, format!("--network={other} is not supported"))),
        };
        let shell = st
            .config
            .shell
            .clone()
            .unwrap_or_else(|| vec!["/bin/sh".into(), "-c".into()]);
        let (argv, stdin) = match &ins.args {
            Args::Exec(v) => (v.clone(), None),
            Args::Shell(s) => {
                let mut script = s.clone();
                let only = ins.heredocs.len() == 1
                    && crate::parse::heredoc_names(s).len() == 1
                    && s.trim().starts_with("<<")
                    && !s.trim().contains(char::is_whitespace);
                if only {
                    let body = ins.heredocs[0].body.clone();
                    match body.strip_prefix("#!") {
                        Some(rest) => {
                            let interp: Vec<String> = rest
                                .lines()
                                .next()
                                .unwrap_or_default()
                                .split_whitespace()
                                .map(str::to_string)
                                .collect();
                            (interp, Some(body.into_bytes()))
                        }
                        None => {
                            let mut a = shell.clone();
                            a.push(body);
                            (a, None)
                        }
                    }
                } else {
                    for h in &ins.heredocs {
                        script.push('\n');
                        script.push_str(&h.body);
                        script.push_str(&h.name);
                    }
                    let mut a = shell.clone();
                    a.push(script);
                    (a, None)
                }
            }
        };
        if argv.is_empty() {
            return Err(invalid(ins, "RUN needs a command"));
        }
        let t = self
            .begin(label, format!("RUN {}", ins.args.text()))
            .await?;
        if st.layers.is_empty() {
            return Err(invalid(
                ins,
                "RUN needs a base image with a shell (FROM scratch has none)",
            ));
        }
        let mut env = st.args.clone();
        for (k, v) in st.config.env_pairs() {
            env.retain(|(a, _)| *a != k);
            env.push((k, v));
        }
        let cwd = st.config.working_dir.clone().unwrap_or_else(|| "/".into());
        let mut h = st.parent_key();
        h.update(
            serde_json::json!({
                "run": argv, "env": env, "cwd": cwd, "user": st.config.user,
                "stdin": stdin.as_ref().map(|b| hex::encode(Sha256::digest(b))),
                "no_network": no_network,
            })
            .to_string()
            .as_bytes(),
        );
        let key = format!("sha256:{}", hex::encode(h.finalize()));
        if let Some(layer) = self.cache_get(&key).await? {
            st.layers.push(layer.clone());
            self.cached += 1;
            self.emit(BuildEvent::Cached {
                step: self.step,
                layer: Some(layer.clone()),
            })
            .await?;
            return self.done(Some(layer), t).await;
        }
        let spec = RunSpec {
            layers: st.layers.clone(),
            argv,
            env,
            cwd,
            user: st.config.user.clone(),
            stdin,
            no_network,
            timeout_secs: self
                .opts
                .step_timeout_secs
                .unwrap_or(DEFAULT_STEP_TIMEOUT_SECS),
            memory_mb: self.opts.memory_mb,
            cpus: self.opts.cpus,
            disk_mb: self.opts.disk_mb,
            source: format!("build step: RUN {}", ins.args.text()),
        };
        let (tx, mut rx) = mpsc::channel::<RunEvent>(16);
        let host = self.host.clone();
        // Aborted when this build is dropped (its client went away): the step's sandbox goes
        // with the host's future, instead of running on to its timeout for nobody.
        let mut running = AbortOnDrop(tokio::spawn(async move { host.run(spec, tx).await }));
        let mut tail: std::collections::VecDeque<String> = Default::default();
        let mut partial: [Vec<u8>; 2] = [Vec::new(), Vec::new()];
        while let Some(ev) = rx.recv().await {
            let (i, name, data) = match ev {
                RunEvent::Stdout(d) => (0, "stdout", d),
                RunEvent::Stderr(d) => (1, "stderr", d),
            };
            partial[i].extend_from_slice(&data);
            while let Some(p) = partial[i].iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = partial[i].drain(..=p).collect();
                let line = String::from_utf8_lossy(&line[..line.len() - 1]).into_owned();
                self.line(&mut tail, name, line).await?;
            }
            // A step that writes without newlines is logged in pieces: its bytes are not
            // held until a newline that may never come (`head -c 10G /dev/zero`).
            while partial[i].len() >= MAX_LINE {
                let line: Vec<u8> = partial[i]
                    .drain(..utf8_cut(&partial[i], MAX_LINE))
                    .collect();
                let line = String::from_utf8_lossy(&line).into_owned();
                self.line(&mut tail, name, line).await?;
            }
        }
        for (i, name) in [(0, "stdout"), (1, "stderr")] {
            if !partial[i].is_empty() {
                let line = String::from_utf8_lossy(&partial[i]).into_owned();
                self.line(&mut tail, name, line).await?;
            }
        }
        let res = (&mut running.0)
            .await
            .map_err(|e| BuildError::io("RUN", std::io::Error::other(e.to_string())))??;
        let failed = |message: String| BuildError::Step {
            step: self.step,
            instruction: format!("RUN {}", ins.args.text()),
            message,
            exit_code: res.exit_code,
            output_tail: tail.iter().cloned().collect(),
        };
        if res.timed_out {
            return Err(failed("timed out".into()));
        }
        if let Some(s) = res.signal {
            return Err(failed(format!("killed by signal {s}")));
        }
        if res.exit_code != Some(0) {
            return Err(failed(format!(
                "exited with status {}",
                res.exit_code.map_or("?".into(), |c| c.to_string())
            )));
        }
        let Some((layer, step_lease)) = res.layer else {
            return Err(BuildError::Host {
                code: ErrorCode::Internal,
                message: "the step's layer was not captured".into(),
            });
        };
        self.lease.hold(&self.store, &layer)?;
        drop(step_lease);
        self.store.cache_put(&key, &layer)?;
        st.layers.push(layer.clone());
        self.run += 1;
        self.done(Some(layer), t).await
    }

    async fn line(
        &self,
        tail: &mut std::collections::VecDeque<String>,
        stream: &str,
        line: String,
    ) -> Result<(), BuildError> {
        if tail.len() == TAIL_LINES {
            tail.pop_front();
        }
        tail.push_back(line.clone());
        self.emit(BuildEvent::Output {
            step: self.step,
            stream: stream.to_string(),
            line,
        })
        .await
    }

    /// Adds the layer of a planned copy (from the cache, or staged and packed now).
    async fn add_planned(
        &mut self,
        st: &mut Stage,
        kind: &str,
        plan: copy::Plan,
        what: &str,
    ) -> Result<String, BuildError> {
        let mut h = st.parent_key();
        h.update(kind.as_bytes());
        h.update(plan.digest.as_bytes());
        let key = format!("sha256:{}", hex::encode(h.finalize()));
        if let Some(layer) = self.cache_get(&key).await? {
            self.cached += 1;
            self.emit(BuildEvent::Cached {
                step: self.step,
                layer: Some(layer.clone()),
            })
            .await?;
            st.layers.push(layer.clone());
            return Ok(layer);
        }
        let store = self.store.clone();
        let lease_holder = self.store.temp_lease("build-step")?;
        let source = format!("build step: {what}");
        let (layer, l) = self
            .blocking(move || {
                let dir = store.tmp_path("build-copy");
                std::fs::create_dir(&dir)
                    .map_err(|e| BuildError::io(format!("create {}", dir.display()), e))?;
                let r = plan
                    .stage(&dir)
                    .and_then(|()| Ok(store.add_dir_layer(&dir, &source, &lease_holder)?));
                let _ = std::fs::remove_dir_all(&dir);
                Ok((r?, lease_holder))
            })
            .await?;
        self.lease.hold(&self.store, &layer)?;
        drop(l);
        self.store.cache_put(&key, &layer)?;
        self.run += 1;
        st.layers.push(layer.clone());
        Ok(layer)
    }

    async fn copy_step(
        &mut self,
        st: &mut Stage,
        ins: &Instruction,
        label: Option<&str>,
        defs: &[StageDef],
        index: usize,
        stage_index: &StageIndex,
    ) -> Result<(), BuildError> {
        let esc = self.esc;
        let vars = st.vars();
        let ws = match &ins.args {
            Args::Exec(v) => v
                .iter()
                .map(|w| word(w, &vars, esc))
                .collect::<Result<Vec<_>, _>>()?,
            Args::Shell(s) => words(s, &vars, esc)?,
        };
        let t = self
            .begin(label, format!("{} {}", ins.keyword, ws.join(" ")))
            .await?;
        let heredoc_names: Vec<String> = ins.heredocs.iter().map(|h| h.name.clone()).collect();
        let mut sources: Vec<String> = Vec::new();
        let mut inline: Vec<(String, Vec<u8>)> = Vec::new();
        let (srcs, dest) = match ws.split_last() {
            Some((d, s)) if !s.is_empty() || !ins.heredocs.is_empty() => (s, d.clone()),
            _ => return Err(invalid(ins, "expected sources and a destination")),
        };
        for s in srcs {
            let name = s
                .trim_start_matches("<<")
                .trim_start_matches('-')
                .trim_matches(['"', '\'']);
            if s.starts_with("<<") && heredoc_names.iter().any(|h| h == name) {
                let h = ins.heredocs.iter().find(|h| h.name == name).expect("named");
                let body = if h.expand {
                    word(&h.body, &vars, '\u{0}')?
                } else {
                    h.body.clone()
                };
                inline.push((name.to_string(), body.into_bytes()));
            } else {
                if ins.keyword == "ADD"
                    && (s.starts_with("http://")
                        || s.starts_with("https://")
                        || s.starts_with("git@"))
                {
                    return Err(invalid(
                        ins,
                        "ADD of a URL is not supported: download it in a RUN",
                    ));
                }
                sources.push(s.clone());
            }
        }
        let workdir = st.config.working_dir.clone().unwrap_or_else(|| "/".into());
        let dest = if dest.starts_with('/') {
            dest
        } else {
            let trailing = dest.ends_with('/');
            let mut d = Path::new(&workdir).join(&dest).display().to_string();
            if trailing && !d.ends_with('/') {
                d.push('/');
            }
            d
        };
        if st.layers.is_empty() && sources.is_empty() && inline.is_empty() {
            return Err(invalid(ins, "nothing to copy"));
        }
        let under = self.view(&st.layers).await?;
        let mut opts = copy::Options::default();
        if let Some(c) = ins.flag("chown") {
            opts.chown = Some(copy::parse_chown(&word(c, &vars, esc)?, &under)?);
        }
        if let Some(m) = ins.flag("chmod") {
            opts.chmod = Some(copy::parse_chmod(&word(m, &vars, esc)?)?);
        }
        let from_view = match ins.flag("from") {
            Some(f) => {
                let f = word(f, &vars, esc)?;
                let layers = match stage_index(defs, &f, index) {
                    Some(j) => self
                        .built
                        .get(&j)
                        .map(|s| s.layers.clone())
                        .ok_or_else(|| invalid(ins, format!("stage {f} is not built")))?,
                    None => self.base(&f).await?.layers,
                };
                Some(self.view(&layers).await?)
            }
            None => None,
        };
        let ctx = self.ctx.clone();
        // Where an ADD from the context unpacks its archives, until the layer is packed.
        let scratch = (ins.keyword == "ADD" && from_view.is_none())
            .then(|| crate::add::Scratch(self.store.tmp_path("build-add")));
        let unpack = scratch.as_ref().map(|s| s.0.clone());
        let plan = self
            .blocking(move || {
                let from = match &from_view {
                    Some(v) => Source::Stack(v),
                    None => Source::Context(&ctx),
                };
                copy::plan_copy(
                    from,
                    &sources,
                    &inline,
                    &dest,
                    opts,
                    &under,
                    unpack.as_deref(),
                )
            })
            .await
            .map_err(|e| match e {
                BuildError::Invalid(m) => invalid(ins, m),
                e => e,
            })?;
        let what = format!("{} {}", ins.keyword, ws.join(" "));
        let layer = self.add_planned(st, "copy", plan, &what).await?;
        drop(scratch);
        self.done(Some(layer), t).await
    }
}

mod config;
use config::{command, healthcheck};

#[cfg(test)]
mod tests;
