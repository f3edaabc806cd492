//! Network policy of sandboxes: applied at create (and to fork children), changed at run
//! time (`PUT /v1/sandboxes/{id}/network`), re-applied after a daemon restart, removed with
//! the sandbox. The links, rules and resolvers themselves belong to `warren_net::Network`;
//! [`SandboxNetwork`] holds it and decides how a policy reaches an instance (and writes the
//! sandbox's `/etc/resolv.conf` through its agent); the manager decides when.

use std::sync::{Arc, OnceLock};
use tracing::warn;
use warren_runtime::Instance;
use warren_types::{NetworkPolicy, NetworkStatus, SandboxId};

use super::Manager;
use crate::error::NodeError;

/// The sandboxes' network: owns the node's `warren_net::Network` (its links, rules and
/// resolvers; none until the daemon gives it one, and then only policy `none` is accepted)
/// and applies policies to instances. Knows nothing of the sandbox registry: the manager
/// calls it at create, fork, delete and recovery. Cheap to clone; every clone is the same.
#[derive(Clone, Default)]
pub struct SandboxNetwork {
    net: Arc<OnceLock<Arc<warren_net::Network>>>,
}

impl std::fmt::Debug for SandboxNetwork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxNetwork")
            .field("enabled", &self.net.get().is_some())
            .finish()
    }
}

impl SandboxNetwork {
    /// Gives the node's network (without one, only `none` is accepted). Once only.
    pub fn set(&self, net: Arc<warren_net::Network>) {
        let _ = self.net.set(net);
    }

    /// The node's network, if it has one.
    pub fn get(&self) -> Option<&Arc<warren_net::Network>> {
        self.net.get()
    }

    /// Checks a policy's syntax and that this node can honour it.
    pub(crate) fn check(&self, policy: &NetworkPolicy) -> Result<(), NodeError> {
        policy.validate()?;
        if policy.is_none() {
            return Ok(());
        }
        match self.get() {
            Some(n) => Ok(n.check(policy)?),
            None => Err(NodeError::Network(warren_net::NetError::Policy(
                "network policies are unavailable on this node (it runs without a network)".into(),
            ))),
        }
    }

    /// Applies `policy` to a live instance: link, rules, resolver, resolv.conf (unless
    /// `resolv_written`: the sandbox started with the one of its reserved link). A `none`
    /// policy on a sandbox that never had a link costs nothing.
    pub(crate) async fn apply(
        &self,
        id: &SandboxId,
        instance: &Arc<dyn Instance>,
        policy: &NetworkPolicy,
        resolv_written: bool,
    ) -> Result<Option<warren_net::LinkInfo>, NodeError> {
        let Some(net) = self.get() else {
            return if policy.is_none() {
                Ok(None)
            } else {
                Err(self.check(policy).unwrap_err())
            };
        };
        let had = net.link_of(id.as_str()).is_some();
        if policy.is_none() && !had {
            return Ok(None);
        }
        let Some(pid) = instance.netns_pid() else {
            return Err(NodeError::Network(warren_net::NetError::Policy(
                "this sandbox has no network interface: a VM gets one only when it is created \
                 with a network policy other than none"
                    .into(),
            )));
        };
        let netns = warren_net::Netns::of_pid(pid)?;
        let link = net
            .apply(id.as_str(), &netns, instance.guest_tap(), policy)
            .await?;
        // Only a link that came or went changes the inside (a new policy on a kept link is
        // rules and resolver names only: the guest's interface is left alone).
        if had != link.is_some() && instance.guest_tap().is_some() {
            configure_guest(instance, link.as_ref())
                .await
                .map_err(|e| NodeError::runtime(id, e))?;
        } else if had != link.is_some() && !(resolv_written && link.is_some()) {
            let text = warren_net::resolv_conf(link.as_ref());
            let agent = instance.agent();
            let write = async {
                let mut w = agent
                    .write_file("/etc/resolv.conf", Some(0o644), None)
                    .await?;
                w.write(bytes::Bytes::from(text)).await?;
                w.finish().await
            };
            if let Err(e) = write.await {
                warn!(sandbox = %id, error = %e, "cannot write the sandbox's resolv.conf");
            }
        }
        Ok(link)
    }

    /// Reserves the link of a container about to start with `policy` (see
    /// [`warren_net::Network::reserve`]); `None` when it starts without one, or is not a
    /// container (a VM's guest is configured once it runs).
    pub(crate) fn reserve_link(
        &self,
        id: &SandboxId,
        runtime: &dyn warren_runtime::Runtime,
        policy: &NetworkPolicy,
    ) -> Result<Option<warren_net::LinkInfo>, NodeError> {
        if policy.is_none() || runtime.substrate() != warren_types::Substrate::Container {
            return Ok(None);
        }
        let Some(net) = self.get() else {
            return Err(self.check(policy).unwrap_err());
        };
        Ok(Some(net.reserve(id.as_str(), policy)?))
    }

    /// A hook that makes the link of a container starting with `policy` (one with a reserved
    /// link) as soon as its network namespace exists, while the container goes on starting;
    /// `None` when there is no link to make. The outcome is taken with [`EarlyLink::settle`].
    pub(crate) fn early_link(
        &self,
        id: &SandboxId,
        policy: &NetworkPolicy,
    ) -> Option<(warren_runtime::NetnsHook, EarlyLink)> {
        let net = self.get()?.clone();
        if policy.is_none() {
            return None;
        }
        let slot = EarlyLink(Arc::new(std::sync::Mutex::new(None)));
        let (id, policy, filled) = (id.clone(), policy.clone(), slot.clone());
        let hook = warren_runtime::NetnsHook::new(move |pid| {
            // Opened now: the process may exit right after the hook.
            let netns = match warren_net::Netns::of_pid(pid) {
                Ok(n) => n,
                Err(e) => {
                    // The link is then made after the start, as without a hook.
                    tracing::debug!(sandbox = %id, error = %e, "network namespace not opened early");
                    return;
                }
            };
            let (net, id, policy) = (net.clone(), id.clone(), policy.clone());
            let task =
                tokio::spawn(async move { net.apply(id.as_str(), &netns, None, &policy).await });
            *filled.0.lock().expect("early link lock") = Some(task);
        });
        Some((hook, slot))
    }

    /// Removes a sandbox's link (if any). Errors are logged: the sandbox is gone anyway.
    pub(crate) async fn detach(&self, id: &SandboxId) {
        if let Some(net) = self.get() {
            if let Err(e) = net.detach(id.as_str()).await {
                warn!(sandbox = %id, error = %e, "cannot remove the sandbox's network");
            }
        }
    }

    fn status(&self, id: &SandboxId, policy: NetworkPolicy) -> NetworkStatus {
        let link = self.get().and_then(|n| n.link_of(id.as_str()));
        NetworkStatus {
            policy,
            address: link.as_ref().map(|l| l.address.to_string()),
            gateway: link.as_ref().map(|l| l.gateway.to_string()),
        }
    }

    /// After a restart: gives every adopted sandbox (id, instance, policy) its link again.
    pub(crate) async fn reattach_all(
        &self,
        adopted: Vec<(SandboxId, Arc<dyn Instance>, NetworkPolicy)>,
    ) {
        for (id, instance, policy) in adopted {
            if policy.is_none() {
                continue;
            }
            if let Err(e) = self.reattach(&id, &instance, &policy).await {
                warn!(sandbox = %id, error = %e, "cannot restore the sandbox's network; it keeps loopback only");
            }
        }
    }

    async fn reattach(
        &self,
        id: &SandboxId,
        instance: &Arc<dyn Instance>,
        policy: &NetworkPolicy,
    ) -> Result<(), NodeError> {
        // A paused sandbox's netns is there; only the resolv.conf write needs the agent, and
        // the address is the same kind, so write it only when running.
        let net = self
            .get()
            .ok_or_else(|| NodeError::Network(warren_net::NetError::Policy("no network".into())))?;
        let pid = instance.netns_pid().ok_or_else(|| {
            NodeError::Network(warren_net::NetError::Policy("no network namespace".into()))
        })?;
        let netns = warren_net::Netns::of_pid(pid)?;
        let link = net
            .apply(id.as_str(), &netns, instance.guest_tap(), policy)
            .await?;
        if instance.guest_tap().is_some() && !instance.is_paused() {
            configure_guest(instance, link.as_ref())
                .await
                .map_err(|e| NodeError::runtime(id, e))?;
        } else if !instance.is_paused() {
            let text = warren_net::resolv_conf(link.as_ref());
            let mut w = instance
                .agent()
                .write_file("/etc/resolv.conf", Some(0o644), None)
                .await
                .map_err(|e| NodeError::runtime(id, e))?;
            w.write(bytes::Bytes::from(text))
                .await
                .map_err(|e| NodeError::runtime(id, e))?;
            w.finish().await.map_err(|e| NodeError::runtime(id, e))?;
        }
        Ok(())
    }
}

impl SandboxNetwork {
    /// `GET /v1/sandboxes/{id}/network` of sandbox `id` of `sandboxes`.
    pub fn status_of(
        &self,
        sandboxes: &Manager,
        id: &SandboxId,
    ) -> Result<NetworkStatus, NodeError> {
        let sb = sandboxes.lookup(id)?;
        let policy = sb.lock().info.network.clone();
        Ok(self.status(id, policy))
    }

    /// `PUT /v1/sandboxes/{id}/network`: replaces the policy; new connections follow it at
    /// once (established ones keep going until they close).
    pub async fn set_policy(
        &self,
        sandboxes: &Manager,
        id: &SandboxId,
        policy: NetworkPolicy,
    ) -> Result<NetworkStatus, NodeError> {
        self.check(&policy)?;
        let sb = sandboxes.lookup(id)?;
        let (instance, _info, _guard) = sandboxes.ready_within(&sb, None).await?;
        let _lifecycle = sb.lifecycle.lock().await;
        let started_ms = super::now_ms();
        self.apply(id, &instance, &policy, false).await?;
        {
            let mut st = sb.lock();
            st.info.network = policy.clone();
            sandboxes.persist(&sb, &st)?;
        }
        crate::metrics::Metrics::inc(&sandboxes.inner.parts.telemetry.metrics().network_changes);
        sandboxes
            .log_lifecycle(
                &sb,
                warren_types::TrajectoryCall::Network {
                    policy: policy.clone(),
                },
                started_ms,
            )
            .await;
        Ok(self.status(id, policy))
    }
}

/// A VM's guest takes its link's address and resolv.conf itself, in one agent call.
async fn configure_guest(
    instance: &Arc<dyn Instance>,
    link: Option<&warren_net::LinkInfo>,
) -> Result<(), warren_runtime::RuntimeError> {
    instance
        .configure_guest_link(
            link.map(|l| warren_runtime::GuestLink {
                address: l.address,
                gateway: l.gateway,
                prefix_len: warren_net::link::LINK_PREFIX,
            }),
            warren_net::resolv_conf(link),
        )
        .await
}

/// The task making a starting container's link.
type LinkTask = tokio::task::JoinHandle<Result<Option<warren_net::LinkInfo>, warren_net::NetError>>;

/// The link of a starting container, being made since its network namespace appeared (see
/// [`SandboxNetwork::early_link`]).
#[derive(Clone)]
pub(crate) struct EarlyLink(Arc<std::sync::Mutex<Option<LinkTask>>>);

impl EarlyLink {
    /// Waits for the link if it was begun: `None` when the sandbox's start never handed its
    /// namespace over (the link is then made after the start, as for every other runtime).
    pub(crate) async fn settle(&self) -> Option<Result<Option<warren_net::LinkInfo>, NodeError>> {
        let task = self.0.lock().expect("early link lock").take()?;
        Some(match task.await {
            Ok(r) => r.map_err(NodeError::from),
            // The node's fault, not the policy's (as for the link task inside `apply`).
            Err(e) => Err(NodeError::Network(warren_net::NetError::Netlink {
                what: "link task".into(),
                message: e.to_string(),
            })),
        })
    }
}
