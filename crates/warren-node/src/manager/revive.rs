//! Revive: a new sandbox made like a logged one (same substrate, image stack, limits, env,
//! labels, network policy, tenant), into which the logged calls that change a sandbox are run
//! again in order, each through the same code as the API call and with the same step, so
//! the new sandbox's log continues the old step numbering.
//!
//! - exec (its stdin fed again), spawn, kill (of a process this revive spawned: the old pid
//!   is mapped to the new one), file writes and tar uploads (their logged content), mkdir,
//!   remove, chmod and network policy changes are run again;
//! - a fork's record is copied (with its step and the old children's ids), nothing is
//!   forked; pause, resume, terminals and cancelled calls are skipped;
//! - a sandbox that was itself forked first replays its parent's log up to the fork (without
//!   the parent's steps), also when its own log lacks its first entry (`forked_from`; its
//!   record in the store names the parent); a parent whose log does not reach the fork
//!   answers `invalid_state`.
//!
//! Each replayed call's outcome (success or error code, exit code and signal, sha256 of its
//! stdout and stderr) is compared with the logged one; the first divergence is reported.
//! The log is read through a [`LogSource`]: the node's own journal while the sandbox is
//! here, else the source given to [`super::Trajectories::set_log_source`].

use base64::Engine as _;
use bytes::Bytes;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;
use warren_blob::trajectory::ForkOrigin;
use warren_types::{
    ApiError, Caller, CreateSandboxRequest, Divergence, ErrorCode, ExecCall, ExecRequest, ImageRef,
    OutputEncoding, ReplayOutcome, ReviveOptions, ReviveReport, Role, SandboxId, TrajectoryCall,
};

use super::runner::Begun;
use super::{Manager, Trajectories};
use crate::error::{NodeError, StoreError};
use crate::trajectory::source::LoggedSandbox;
use crate::trajectory::{
    request_digest, Blobs, Forked, LogPage, LogSource, StoredEntry, StoredResult,
};

/// Entries read per page of the old log.
const PAGE: usize = 256;

/// The node's own logs, for sandboxes it holds.
struct LocalLog {
    manager: Manager,
}

#[async_trait::async_trait]
impl LogSource for LocalLog {
    async fn sandbox(&self, id: &SandboxId) -> Result<Option<LoggedSandbox>, StoreError> {
        Ok(self.manager.lookup(id).ok().map(|sb| LoggedSandbox {
            info: sb.lock().info.clone(),
            hostname: Some(sb.hostname.clone()),
            // Its own log is whole here: its first entry says where it came from.
            forked_from: None,
        }))
    }

    async fn page(
        &self,
        id: &SandboxId,
        from_seq: u64,
        limit: usize,
    ) -> Result<LogPage, StoreError> {
        let (entries, blobs, more) =
            self.manager
                .journal()
                .read()?
                .entries_with_inputs(id, from_seq, limit, 16 << 20)?;
        Ok(LogPage {
            entries,
            blobs,
            more,
        })
    }
}

/// How a logged entry ended, as revive compares it.
fn outcome(entry: &StoredEntry) -> ReplayOutcome {
    let mut o = ReplayOutcome {
        error: entry.error.as_ref().map(|e| e.code.as_str().to_string()),
        ..Default::default()
    };
    if let Some(StoredResult::Exec(e)) = &entry.result {
        o.exit_code = e.exit.exit_code;
        o.signal = e.exit.signal;
        o.stdout_sha256 = Some(e.stdout.sha256.clone());
        o.stderr_sha256 = Some(e.stderr.sha256.clone());
    }
    o
}

fn not_replayable(why: &str) -> ReplayOutcome {
    ReplayOutcome {
        not_replayable: Some(why.to_string()),
        ..Default::default()
    }
}

/// The request a logged exec was, fed `stdin` again.
fn exec_request(c: &ExecCall, stdin: Option<&Bytes>, step: Option<u64>) -> ExecRequest {
    ExecRequest {
        argv: c.argv.clone(),
        shell: c.shell.clone(),
        cwd: c.cwd.clone(),
        env: c.env.clone(),
        stdin: stdin.map(|b| base64::engine::general_purpose::STANDARD.encode(b)),
        stdin_encoding: OutputEncoding::Base64,
        timeout_secs: c.timeout_secs,
        max_output_bytes: c.max_output_bytes,
        user: c.user.clone(),
        encoding: c.encoding,
        kill_tree: c.kill_tree,
        step,
    }
}

/// The create request of a sandbox made like `info`.
/// Lifetimes are held to `max_ttl_secs`: a lifetime extended after the sandbox was made can
/// have grown past what a create may ask for.
fn create_request(old: &LoggedSandbox, max_ttl_secs: u64) -> CreateSandboxRequest {
    let info = &old.info;
    CreateSandboxRequest {
        substrate: info.substrate,
        image: ImageRef::Stack(info.image.clone()),
        cpus: Some(info.limits.cpus),
        memory_mb: Some(info.limits.memory_mb),
        disk_mb: Some(info.limits.disk_mb),
        disk_medium: (info.substrate == warren_types::Substrate::Container)
            .then_some(info.limits.disk_medium),
        pids: Some(info.limits.pids),
        cpu_class: Some(info.limits.cpu_class),
        trajectory_mb: Some(info.limits.trajectory_mb),
        env: info.env.clone(),
        workdir: info.workdir.clone(),
        user: info.user.clone(),
        network: info.network.clone(),
        // The lifetime it was given, counted from now.
        ttl_secs: info.expires_at_ms.map(|e| {
            e.saturating_sub(info.created_at_ms)
                .div_ceil(1000)
                .clamp(1, max_ttl_secs.max(1))
        }),
        idle_timeout_secs: info
            .idle_timeout_secs
            .map(|t| t.clamp(1, max_ttl_secs.max(1))),
        labels: info.labels.clone(),
        idempotency_key: None,
        hostname: old.hostname.clone(),
        pty: info.pty,
        snapshot: None,
    }
}

/// One revive in progress.
struct Replay {
    manager: Manager,
    new: SandboxId,
    opts: ReviveOptions,
    /// Old pid → new pid of processes spawned again.
    pids: HashMap<u32, u32>,
    report: ReviveReport,
}

/// What to do with one logged entry.
enum Action {
    /// Run again; the outcome to compare.
    Ran(ReplayOutcome),
    /// Not run again (the count of skipped entries grows).
    Skipped,
}

impl Replay {
    /// Replays the log of `id` from `source` up to `upto` (inclusive); with `own_steps`
    /// false, steps are left out (a parent's log, replayed before a child's). Answers the
    /// seq of the last entry it went through (0: none).
    fn run<'a>(
        &'a mut self,
        source: Arc<dyn LogSource>,
        id: SandboxId,
        upto: u64,
        own_steps: bool,
    ) -> futures::future::BoxFuture<'a, Result<u64, NodeError>> {
        Box::pin(async move {
            let mut from = 1;
            let mut seen = 0;
            loop {
                let page = source.page(&id, from, PAGE).await?;
                let Some(last) = page.entries.last().map(|e| e.seq) else {
                    return Ok(seen);
                };
                for entry in &page.entries {
                    if entry.seq > upto {
                        return Ok(seen);
                    }
                    seen = entry.seq;
                    if let TrajectoryCall::ForkedFrom { parent, parent_seq } = &entry.call {
                        self.report.skipped += 1;
                        self.parent(&source, &id, parent, *parent_seq).await?;
                        continue;
                    }
                    let step = entry.step.filter(|_| own_steps);
                    if self.entry(entry, step, &page.blobs).await? {
                        return Ok(seen);
                    }
                }
                if !page.more {
                    return Ok(seen);
                }
                from = last + 1;
            }
        })
    }

    /// Replays the parent of `child` (forked from it after its entry `upto`) up to the
    /// fork; a parent whose log does not reach the fork is `invalid_state` (the child's
    /// files cannot be made).
    async fn parent(
        &mut self,
        source: &Arc<dyn LogSource>,
        child: &SandboxId,
        parent: &str,
        upto: u64,
    ) -> Result<(), NodeError> {
        let parent: SandboxId = parent.parse().map_err(|e| {
            NodeError::Api(ApiError::internal(format!(
                "trajectory of {child} names a bad parent {parent:?}: {e}"
            )))
        })?;
        if upto == 0 {
            return Ok(());
        }
        let local: Arc<dyn LogSource> = Arc::new(LocalLog {
            manager: self.manager.clone(),
        });
        let from = if local.sandbox(&parent).await?.is_some() {
            local
        } else {
            source.clone()
        };
        let reached = self.run(from, parent.clone(), upto, false).await?;
        if reached < upto && !self.report.stopped {
            return Err(NodeError::Api(ApiError::new(
                ErrorCode::InvalidState,
                format!(
                    "sandbox {child} cannot be revived: it was forked from {parent} after \
                     entry {upto} of its log, and the log holds {reached} of them (its node \
                     died before the rest was shipped)"
                ),
            )));
        }
        Ok(())
    }

    /// A fork's child whose log lacks its first entry (its node died before shipping it):
    /// the parent up to the fork, as that entry would have replayed it.
    async fn origin(
        &mut self,
        source: &Arc<dyn LogSource>,
        id: &SandboxId,
        origin: &ForkOrigin,
    ) -> Result<(), NodeError> {
        let first = source.page(id, 1, 1).await?;
        let logged = first
            .entries
            .first()
            .is_some_and(|e| matches!(e.call, TrajectoryCall::ForkedFrom { .. }));
        if logged {
            return Ok(());
        }
        self.parent(source, id, &origin.parent, origin.parent_seq)
            .await
    }

    /// Replays one entry; true when the replay stops here.
    async fn entry(
        &mut self,
        entry: &StoredEntry,
        step: Option<u64>,
        blobs: &Blobs,
    ) -> Result<bool, NodeError> {
        if entry.cancelled {
            self.report.skipped += 1;
            return Ok(false);
        }
        let started = Instant::now();
        let action = self.act(entry, step, blobs).await?;
        let got = match action {
            Action::Skipped => {
                self.report.skipped += 1;
                return Ok(false);
            }
            Action::Ran(got) => got,
        };
        self.report.replayed += 1;
        if step.is_some() {
            self.report.steps_replayed += 1;
            self.report.last_step = self.report.last_step.max(step);
        }
        self.report.recorded_ms += entry.duration_ms;
        let expected = outcome(entry);
        tracing::trace!(
            seq = entry.seq,
            ms = started.elapsed().as_secs_f64() * 1e3,
            "replayed"
        );
        if got == expected {
            return Ok(false);
        }
        self.report.divergences += 1;
        if self.report.first_divergence.is_none() {
            self.report.first_divergence = Some(Divergence {
                step: entry.step,
                seq: entry.seq,
                kind: entry.call.kind().to_string(),
                expected,
                got,
            });
        }
        if self.opts.stop_on_divergence {
            self.report.stopped = true;
            return Ok(true);
        }
        Ok(false)
    }

    /// The outcome of the call the new sandbox logged last, when it logged one since
    /// `before`; else the error the call answered.
    fn logged_outcome(
        &self,
        before: u64,
        answered: Result<(), NodeError>,
    ) -> Result<ReplayOutcome, NodeError> {
        let sb = self.manager.lookup(&self.new)?;
        let seq = sb.log.last_seq();
        if seq > before {
            if let Some((e, _)) = self.manager.journal().read()?.entry(&self.new, seq)? {
                return Ok(outcome(&e));
            }
        }
        Ok(match answered {
            Ok(()) => ReplayOutcome::default(),
            Err(e) => ReplayOutcome {
                error: Some(e.to_api().code.as_str().to_string()),
                ..Default::default()
            },
        })
    }

    async fn act(
        &mut self,
        entry: &StoredEntry,
        step: Option<u64>,
        blobs: &Blobs,
    ) -> Result<Action, NodeError> {
        let m = self.manager.clone();
        let (procs, files) = (
            super::Processes::new(m.clone()),
            super::Files::new(m.clone()),
        );
        let id = self.new.clone();
        let input = match &entry.input {
            Some(i) if i.omitted => {
                return Ok(Action::Ran(not_replayable(
                    "its input was over the trajectory budget and not kept",
                )))
            }
            Some(i) => Some(i.bytes(blobs)),
            None => None,
        };
        let before = m.lookup(&id)?.log.last_seq();
        let answered: Result<(), NodeError> = match &entry.call {
            TrajectoryCall::Exec(c) => {
                if c.stdin_sha256.is_some() && input.is_none() {
                    return Ok(Action::Ran(not_replayable("its stdin was not logged")));
                }
                procs
                    .exec(&id, exec_request(c, input.as_ref(), step))
                    .await
                    .map(drop)
            }
            TrajectoryCall::Spawn(c) => match procs.spawn(&id, exec_request(c, None, step)).await {
                Ok((p, _)) => {
                    if let Some(StoredResult::Process(old)) = &entry.result {
                        self.pids.insert(old.pid, p.pid);
                    }
                    Ok(())
                }
                Err(e) => Err(e),
            },
            TrajectoryCall::Kill { pid, signal } => {
                let pid = self.pids.get(pid).copied().unwrap_or(*pid);
                procs.kill_proc(&id, pid, *signal, step).await.map(drop)
            }
            TrajectoryCall::WriteFile {
                path, mode, size, ..
            } => {
                let Some(content) = input else {
                    return Ok(Action::Ran(not_replayable("its content was not logged")));
                };
                let body = futures::stream::iter([Ok::<_, std::io::Error>(content)]);
                files
                    .write_file(&id, path, *mode, Some(*size), step, body)
                    .await
                    .map(drop)
            }
            TrajectoryCall::WriteTar { path, .. } => {
                let Some(content) = input else {
                    return Ok(Action::Ran(not_replayable("its content was not logged")));
                };
                let body = futures::stream::iter([Ok::<_, std::io::Error>(content)]);
                files.write_tar(&id, path, body).await
            }
            TrajectoryCall::Mkdir {
                path,
                parents,
                mode,
            } => files
                .mkdir(&id, path, *parents, *mode, step)
                .await
                .map(drop),
            TrajectoryCall::Remove { path, recursive } => {
                files.remove(&id, path, *recursive, step).await.map(drop)
            }
            TrajectoryCall::Chmod { path, mode } => {
                files.chmod(&id, path, *mode, step).await.map(drop)
            }
            TrajectoryCall::Network { policy } => m
                .parts()
                .network
                .set_policy(&m, &id, policy.clone())
                .await
                .map(drop),
            TrajectoryCall::Fork {
                children,
                n,
                labels,
            } => {
                self.copy_fork(entry, step, children, *n, labels).await?;
                return Ok(Action::Skipped);
            }
            TrajectoryCall::ForkedFrom { .. }
            | TrajectoryCall::Pause { .. }
            | TrajectoryCall::Resume {}
            | TrajectoryCall::Snapshot { .. }
            | TrajectoryCall::Terminal { .. } => return Ok(Action::Skipped),
        };
        self.logged_outcome(before, answered).map(Action::Ran)
    }

    /// Logs a fork's record in the new sandbox (with its step): a retry of that step answers
    /// the children the first run made; nothing is forked.
    async fn copy_fork(
        &mut self,
        entry: &StoredEntry,
        step: Option<u64>,
        children: &[String],
        n: Option<u32>,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> Result<(), NodeError> {
        if entry.error.is_some() {
            return Ok(());
        }
        let call = TrajectoryCall::Fork {
            children: children.to_vec(),
            n,
            labels: labels.clone(),
        };
        let digest = request_digest(&TrajectoryCall::Fork {
            children: Vec::new(),
            n,
            labels: labels.clone(),
        });
        match self
            .manager
            .begin::<Forked>(&self.new, step, Some(digest))
            .await?
        {
            Begun::Replay(_) => {}
            Begun::Run(r) => {
                r.finish(call, Ok(children.to_vec())).await?;
            }
        }
        if step.is_some() {
            self.report.last_step = self.report.last_step.max(step);
        }
        Ok(())
    }
}

impl Trajectories {
    /// `POST /v1/sandboxes/{id}/revive` by `caller` into `sandboxes`: see the module docs. Another tenant's
    /// sandbox answers `not_found`, like a missing one; the new sandbox belongs to the old
    /// one's tenant and counts against its quotas.
    pub async fn revive_as(
        &self,
        sandboxes: &Manager,
        caller: &Caller,
        id: &SandboxId,
        opts: ReviveOptions,
    ) -> Result<ReviveReport, NodeError> {
        let started = Instant::now();
        let local: Arc<dyn LogSource> = Arc::new(LocalLog {
            manager: sandboxes.clone(),
        });
        let (source, old) = match local.sandbox(id).await? {
            Some(old) => {
                sandboxes.authorize(caller, id)?;
                (local, old)
            }
            None => {
                let missing = sandboxes
                    .lookup(id)
                    .err()
                    .unwrap_or(NodeError::SandboxNotFound {
                        id: id.clone(),
                        why: None,
                    });
                let Some(src) = self.log_source() else {
                    return Err(missing);
                };
                match src.sandbox(id).await? {
                    Some(old) if caller.sees(old.info.tenant.as_deref()) => (src, old),
                    _ => {
                        return Err(NodeError::SandboxNotFound {
                            id: id.clone(),
                            why: None,
                        })
                    }
                }
            }
        };
        // The owner of the new sandbox: the old one's tenant (a user caller is that tenant,
        // with its quotas; an administrator acts for it).
        let owner = if caller.is_admin() {
            Caller {
                tenant: old.info.tenant.clone(),
                role: Role::Admin,
                ..caller.clone()
            }
        } else {
            caller.clone()
        };
        let max_ttl = sandboxes.inner.cfg.bounds.max_ttl_secs;
        let created = sandboxes
            .create_as(&owner, create_request(&old, max_ttl))
            .await?;
        let new: SandboxId = created.info.id.parse().map_err(|e| {
            NodeError::Api(ApiError::internal(format!(
                "a new sandbox has a bad id: {e}"
            )))
        })?;
        // Before the new sandbox runs anything: the original's node, if it comes back,
        // deletes the original instead of resuming it beside its revived copy.
        if let Err(e) = source.fence(id, &new).await {
            if let Err(d) = sandboxes.delete(&new).await {
                tracing::warn!(sandbox = %new, error = %d, "cannot delete a failed revive");
            }
            return Err(e.into());
        }
        let mut replay = Replay {
            manager: sandboxes.clone(),
            new: new.clone(),
            opts,
            pids: HashMap::new(),
            report: ReviveReport {
                sandbox: created.info,
                revived_from: id.to_string(),
                replayed: 0,
                steps_replayed: 0,
                skipped: 0,
                last_step: None,
                divergences: 0,
                first_divergence: None,
                stopped: false,
                duration_ms: 0.0,
                recorded_ms: 0.0,
            },
        };
        let replayed = async {
            if let Some(origin) = &old.forked_from {
                replay.origin(&source, id, origin).await?;
            }
            replay.run(source.clone(), id.clone(), u64::MAX, true).await
        };
        if let Err(e) = replayed.await {
            // A revive that could not finish leaves nothing behind.
            if let Err(d) = sandboxes.delete(&new).await {
                tracing::warn!(sandbox = %new, error = %d, "cannot delete a failed revive");
            }
            return Err(e);
        }
        let mut report = replay.report;
        report.sandbox = sandboxes.get(&new).unwrap_or(report.sandbox);
        report.duration_ms = started.elapsed().as_secs_f64() * 1e3;
        tracing::info!(
            from = %id, sandbox = %new, replayed = report.replayed,
            divergences = report.divergences, ms = report.duration_ms, "revived"
        );
        Ok(report)
    }
}
