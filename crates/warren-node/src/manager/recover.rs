//! Start-up recovery: re-adopt every sandbox an earlier daemon left running or paused (a
//! paused one stays paused), tear down the ones that cannot be adopted (marking them failed,
//! never leaking them), and let each runtime remove host objects that belong to no known
//! sandbox. Each sandbox's trajectory log continues where it stopped.

use std::collections::HashMap;
use tracing::{info, warn};
use warren_types::{Caller, SandboxId, SandboxState};

use super::{now_ms, KeyEntry, Manager, Sandbox};
use crate::error::NodeError;
use crate::store::StoredSandbox;
use crate::trajectory::SandboxLog;

/// What recovery did.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct RecoveryReport {
    /// Sandboxes re-adopted and running again.
    pub adopted: Vec<SandboxId>,
    /// Sandboxes that could not be adopted, torn down and kept as failed, with why.
    pub failed: Vec<(SandboxId, String)>,
    /// Sandboxes already stopped or failed before the restart, kept as they were.
    pub kept: Vec<SandboxId>,
    /// Host objects removed because no known sandbox owned them.
    pub orphans_removed: Vec<String>,
    /// Store entries that could not be read.
    pub skipped: Vec<String>,
}

impl Manager {
    /// Loads the store and brings every sandbox in it back (or down). Call once, before
    /// serving.
    pub async fn recover(&self) -> Result<RecoveryReport, NodeError> {
        let loaded = self.inner.store.load()?;
        let mut report = RecoveryReport {
            skipped: loaded.skipped,
            ..Default::default()
        };
        for s in &report.skipped {
            warn!(entry = %s, "state entry skipped");
        }
        for stored in loaded.sandboxes {
            self.recover_one(stored, &mut report).await?;
        }
        self.inner
            .parts
            .snapshots
            .remove_leftovers(self.inner.substrates.runtimes())
            .await;

        let mut keys: HashMap<String, KeyEntry> = HashMap::new();
        for (key, k) in loaded.keys {
            if self.inner.registry.map().contains_key(&k.id) {
                keys.insert(
                    key,
                    KeyEntry {
                        id: k.id,
                        request: k.request,
                    },
                );
            } else if let Err(e) = self.inner.store.remove_sandbox(&k.id, Some(&key)) {
                warn!(key, error = %e, "cannot drop a stale idempotency key");
            }
        }
        *self.inner.registry.keys() = keys;

        // Everything not adopted is dead by now, so only adopted sandboxes are "known".
        for rt in self.inner.substrates.runtimes() {
            match rt.reconcile(&report.adopted).await {
                Ok(removed) => {
                    for r in &removed {
                        warn!(substrate = rt.substrate().as_str(), removed = %r, "orphan removed");
                    }
                    report.orphans_removed.extend(removed);
                }
                Err(e) => {
                    warn!(substrate = rt.substrate().as_str(), error = %e, "reconcile failed")
                }
            }
        }
        let linked = report
            .adopted
            .iter()
            .filter_map(|id| {
                let sb = self.lookup(id).ok()?;
                let st = sb.lock();
                Some((id.clone(), st.instance.clone()?, st.info.network.clone()))
            })
            .collect();
        self.inner.parts.network.reattach_all(linked).await;
        // Before anything is served: a retry of a step that ran across the restart must find
        // it claimed (and then logged), never free to run again.
        super::held::collect_all(self, &report.adopted).await;
        info!(
            adopted = report.adopted.len(),
            failed = report.failed.len(),
            kept = report.kept.len(),
            orphans = report.orphans_removed.len(),
            "recovery done"
        );
        Ok(report)
    }

    async fn recover_one(
        &self,
        stored: StoredSandbox,
        report: &mut RecoveryReport,
    ) -> Result<(), NodeError> {
        let StoredSandbox {
            info,
            hostname,
            record,
            ..
        } = stored;
        let id: SandboxId = match info.id.parse() {
            Ok(id) => id,
            Err(e) => {
                report.skipped.push(format!("sandbox {:?}: {e}", info.id));
                return Ok(());
            }
        };
        let runtime = match self.inner.substrates.runtime_for(info.substrate) {
            Ok(r) => r,
            Err(e) => {
                // Not ours to touch with another runtime; keep it visible so a person notices.
                warn!(sandbox = %id, error = %e, "sandbox of a substrate this daemon does not serve");
                report.skipped.push(format!("sandbox {id}: {e}"));
                return Ok(());
            }
        };
        // The log goes on where it stopped (a store that cannot be read stops the start).
        let log = SandboxLog::open(self.journal(), &id)?;
        let sb = Sandbox::new(id.clone(), info, runtime.clone(), hostname, record, log);
        let (state, spec, record) = {
            let st = sb.lock();
            (st.info.state, sb.spec(&st.info), st.record.clone())
        };
        let failure = match (state, record) {
            (SandboxState::Running | SandboxState::Paused, Some(record)) => {
                match runtime.adopt(&spec, &record).await {
                    Ok(instance) => {
                        {
                            let mut st = sb.lock();
                            // A sandbox paused before the restart is still frozen: it stays
                            // paused until a call resumes it.
                            st.info.state = if instance.is_paused() {
                                SandboxState::Paused
                            } else {
                                SandboxState::Running
                            };
                            st.info.last_activity_ms = now_ms();
                            st.record = Some(instance.record());
                            st.instance = Some(instance.clone());
                            if let Err(e) = self.persist(&sb, &st) {
                                warn!(sandbox = %id, error = %e, "cannot record the adopted sandbox");
                            }
                        }
                        self.watch_lost(sb.clone(), instance);
                        info!(sandbox = %id, "sandbox re-adopted");
                        report.adopted.push(id.clone());
                        None
                    }
                    Err(e) => {
                        if let Err(de) = runtime.destroy_record(&id, Some(&record)).await {
                            warn!(sandbox = %id, error = %de, "cannot tear down a sandbox that failed adoption");
                        }
                        Some(format!("could not re-adopt after a daemon restart: {e}"))
                    }
                }
            }
            (SandboxState::Running | SandboxState::Paused | SandboxState::Creating, record) => {
                if let Err(de) = runtime.destroy_record(&id, record.as_ref()).await {
                    warn!(sandbox = %id, error = %de, "cannot tear down a half-made sandbox");
                }
                Some(if state == SandboxState::Creating {
                    "the daemon stopped while the sandbox was being created".to_string()
                } else {
                    "no runtime record to re-adopt after a daemon restart".to_string()
                })
            }
            (SandboxState::Stopped | SandboxState::Failed, _) => {
                report.kept.push(id.clone());
                None
            }
        };
        if let Some(reason) = failure {
            warn!(sandbox = %id, reason, "sandbox marked failed");
            let mut st = sb.lock();
            st.info.state = SandboxState::Failed;
            st.info.reason = Some(reason.clone());
            if let Err(e) = self.persist(&sb, &st) {
                warn!(sandbox = %id, error = %e, "cannot record the failed sandbox");
            }
            report.failed.push((id.clone(), reason));
        }
        let mut map = self.inner.registry.map_mut();
        {
            // Counted against its tenant's quotas again (never refused: it exists).
            let st = sb.lock();
            self.inner.tenants.admit(
                &Caller::admin(),
                st.info.tenant.as_deref(),
                1,
                &st.info.limits,
            )?;
        }
        map.insert(id, sb);
        Ok(())
    }
}
