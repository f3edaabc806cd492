//! The cluster: a real 3-member etcd, real nodes registered in it and real gateways. Placement
//! spreads sandboxes; exec, streams, files and terminals go through a gateway; listings merge;
//! an idempotency key through two gateways gives one sandbox; drain; admission refusals; a
//! node killed with SIGKILL (fast 503, then 410; creates go elsewhere) and restarted (its
//! sandboxes are reachable again); the etcd leader killed (no node marked lost); etcd quorum
//! lost (routing goes on). Trajectories shipped to a shared store outlive a killed node and a
//! deleted sandbox; a node lost during 40 rollouts: each of its rollouts revived and finished,
//! no original alive when it returns. Membership itself: duplicate ids refused, a revoked lease
//! re-registered; a node cut off from etcd runs nothing in a sandbox revived elsewhere. A
//! Dockerfile built through a gateway: placed, its log streamed, its image used, its layers
//! started lazily on another node from the blob store. SandboxFusion's `/run_jupyter`
//! through a gateway.

#[path = "../common/browser.rs"]
mod browser;
#[path = "../common/mod.rs"]
mod common;
#[path = "../common/etcd.rs"]
mod etcd;
#[path = "../../../warren-image/tests/common/mod.rs"]
mod layers;

mod build;
mod cutoff;
mod etcd_trouble;
mod fusion;
mod harness;
mod hung;
mod loss;
mod membership;
mod observe;
mod rollouts;
mod routing;
mod trajectories;
