//! Placement: which nodes to ask, in order, for a new sandbox or a function call.
//!
//! Filter first (registered, not draining, serves the substrate, has or can fetch the image,
//! big enough, memory headroom, not full), then power-of-k choices: k nodes sampled at random,
//! the one with the lowest score first. The score is the node's published load plus this
//! gateway's own placements not yet reflected in it (so a burst does not herd onto the node
//! that looked emptiest), lowered a little for nodes holding the image's layers and, for calls,
//! for nodes with idle warm containers of that image. The remaining nodes follow by score, for
//! the gateway to try when a node refuses.
//!
//! A request with an idempotency key goes to its key's home alone: the node the key hashes to
//! (rendezvous hashing) among the nodes that could ever take it (registered, not draining,
//! serving the substrate and the image, big enough). Those facts are the same on every
//! gateway, while load, memory headroom and this gateway's placements in flight are not, so
//! they do not move a key: every gateway asks the same node, whose idempotency table answers
//! a retry with the one sandbox. A busy home refuses (the caller waits and retries there);
//! only a home that leaves the cluster or drains moves the key.
//!
//! Pure functions of a [`View`]: no I/O, no clock.

use std::cmp::Ordering;

use warren_types::{NodeId, NodeRecord, Substrate};

use crate::view::View;

/// What is being placed.
#[derive(Debug, Clone, PartialEq)]
pub struct PlaceRequest {
    pub substrate: Substrate,
    /// Image refs, lowest first.
    pub image: Vec<String>,
    /// The sandbox's memory limit, in MiB.
    pub memory_mb: u64,
    /// The create's idempotency key.
    pub key: Option<String>,
    /// A function call (prefers nodes with idle warm containers of the image).
    pub call: bool,
}

/// How many nodes each check excluded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Exclusions {
    pub lost: usize,
    pub draining: usize,
    pub substrate: usize,
    pub image: usize,
    pub too_big: usize,
    pub memory: usize,
    pub full: usize,
}

impl Exclusions {
    /// Nodes excluded by a check that the request can never pass there.
    pub fn permanent(&self) -> usize {
        self.substrate + self.image + self.too_big
    }

    /// Nodes excluded for now.
    pub fn transient(&self) -> usize {
        self.draining + self.memory + self.full
    }

    /// `"2 nodes do not serve substrate vm, 1 node lacks the image"`.
    pub fn describe(&self, req: &PlaceRequest) -> String {
        let n = |c: usize| {
            if c == 1 {
                "1 node".to_string()
            } else {
                format!("{c} nodes")
            }
        };
        let mut parts = Vec::new();
        // The verb agrees with the count: "1 node is draining", "2 nodes are draining".
        let mut add = |c: usize, one: String, many: String| {
            if c > 0 {
                parts.push(format!("{} {}", n(c), if c == 1 { one } else { many }));
            }
        };
        let s = req.substrate.as_str();
        add(
            self.substrate,
            format!("does not serve substrate {s}"),
            format!("do not serve substrate {s}"),
        );
        let image = req.image.join(", ");
        add(
            self.image,
            format!("lacks image {image}"),
            format!("lack image {image}"),
        );
        let mib = req.memory_mb;
        add(
            self.too_big,
            format!("is too small for {mib} MiB"),
            format!("are too small for {mib} MiB"),
        );
        for (c, what) in [
            (self.draining, "draining"),
            (self.memory, "short of memory"),
            (self.full, "full"),
            (self.lost, "lost"),
        ] {
            add(c, format!("is {what}"), format!("are {what}"));
        }
        if parts.is_empty() {
            "the cluster has no nodes".into()
        } else {
            parts.join(", ")
        }
    }
}

/// Why nothing can be placed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlaceError {
    /// No live node could ever take the request.
    #[error("no node can take this request: {0}")]
    Unschedulable(String, Exclusions),
    /// Nodes exist that could, but none can now.
    #[error("no node can take this request now: {0}")]
    Unavailable(String, Exclusions),
}

/// The nodes to ask, best first. `in_flight(id)` counts this gateway's placements on a node
/// that its published load does not show yet; `seed` drives the random sampling.
pub fn candidates(
    view: &View,
    req: &PlaceRequest,
    in_flight: &dyn Fn(&NodeId) -> u64,
    seed: u64,
    k: usize,
) -> Result<Vec<NodeId>, PlaceError> {
    let mut ex = Exclusions::default();
    let mut eligible: Vec<(&NodeId, f64)> = Vec::new();
    // Nodes that could take the request whatever their load: where keys have their home.
    let mut homes: Vec<&NodeId> = Vec::new();
    let mut live = 0;
    for (id, m) in &view.members {
        if m.lost {
            ex.lost += 1;
            continue;
        }
        live += 1;
        let r = &m.record;
        // What no load changes: the same on every gateway.
        let never = if !serves(r, req.substrate) {
            Some(&mut ex.substrate)
        } else if !has_image(r, &req.image) {
            Some(&mut ex.image)
        } else if too_big(r, req.memory_mb) {
            Some(&mut ex.too_big)
        } else if view.drained.contains(id) {
            Some(&mut ex.draining)
        } else {
            None
        };
        if let Some(count) = never {
            *count += 1;
            continue;
        }
        homes.push(id);
        if r.capacity.min_free_memory_mb > 0
            && r.load.memory_available_mb < r.capacity.min_free_memory_mb
        {
            ex.memory += 1;
        } else if full(r, in_flight(id)) {
            ex.full += 1;
        } else {
            eligible.push((id, score(r, req, in_flight(id))));
        }
    }
    if let Some(key) = &req.key {
        // The key decides the node, the same on every gateway.
        if let Some(home) = homes.iter().max_by_key(|id| (rendezvous(key, id), **id)) {
            return Ok(vec![(*home).clone()]);
        }
    }
    if eligible.is_empty() {
        let why = ex.describe(req);
        return Err(if live > 0 && ex.permanent() == live {
            PlaceError::Unschedulable(why, ex)
        } else {
            PlaceError::Unavailable(why, ex)
        });
    }
    let by_score = |a: &(&NodeId, f64), b: &(&NodeId, f64)| {
        a.1.partial_cmp(&b.1)
            .unwrap_or(Ordering::Equal)
            .then_with(|| a.0.cmp(b.0))
    };
    let mut order: Vec<NodeId> = Vec::with_capacity(eligible.len());
    let mut rng = SplitMix(seed);
    let k = k.clamp(1, eligible.len());
    // Partial Fisher-Yates: the first k entries are a uniform sample.
    let mut pool = eligible.clone();
    for i in 0..k {
        let j = i + (rng.next() % (pool.len() - i) as u64) as usize;
        pool.swap(i, j);
    }
    let best = pool[..k]
        .iter()
        .min_by(|a, b| by_score(a, b))
        .expect("k >= 1");
    order.push(best.0.clone());
    eligible.sort_by(by_score);
    for (id, _) in eligible {
        if id != &order[0] {
            order.push(id.clone());
        }
    }
    Ok(order)
}

fn serves(r: &NodeRecord, s: Substrate) -> bool {
    r.substrates.contains(&s)
        || (s == Substrate::Function && r.substrates.contains(&Substrate::Container))
}

/// `name` → `name:latest`; digests stay as they are.
pub fn normalize_ref(r: &str) -> String {
    if r.starts_with("sha256:") || r.contains(':') {
        r.to_string()
    } else {
        format!("{r}:latest")
    }
}

fn has_image(r: &NodeRecord, refs: &[String]) -> bool {
    refs.iter().all(|x| {
        if x.starts_with("sha256:") {
            r.blob_store
                || r.layers.iter().any(|l| l == x)
                || r.images.values().any(|ls| ls.iter().any(|l| l == x))
        } else {
            r.images.contains_key(&normalize_ref(x))
        }
    })
}

fn too_big(r: &NodeRecord, memory_mb: u64) -> bool {
    let c = &r.capacity;
    (c.max_sandbox_memory_mb > 0 && memory_mb > c.max_sandbox_memory_mb)
        || (c.memory_total_mb > 0 && memory_mb > c.memory_total_mb)
}

fn full(r: &NodeRecord, in_flight: u64) -> bool {
    let c = &r.capacity;
    let l = &r.load;
    (c.max_sandboxes > 0 && l.sandboxes() + in_flight >= c.max_sandboxes)
        || (c.max_running > 0 && l.running + l.paused + l.creating + in_flight >= c.max_running)
}

/// Lower is better: the share of the node's capacity in use (its published load plus this
/// gateway's placements in flight), a little less where the image's layers or warm
/// containers are already there.
fn score(r: &NodeRecord, req: &PlaceRequest, in_flight: u64) -> f64 {
    let c = &r.capacity;
    let l = &r.load;
    let cap = if c.max_running > 0 {
        c.max_running
    } else {
        10_000
    } as f64;
    let used = (l.creating + l.running + l.paused + in_flight) as f64 / cap;
    let mem = if c.memory_total_mb > 0 {
        (l.memory_reserved_mb + in_flight * req.memory_mb) as f64 / c.memory_total_mb as f64
    } else {
        0.0
    };
    // Memory limits are ceilings, not use: they weigh less than sandbox counts.
    let mut s = used + 0.25 * mem;
    let layers = wanted_layers(r, &req.image);
    if !layers.is_empty() {
        let held = layers.iter().filter(|l| r.layers.contains(l)).count();
        s -= 0.02 * held as f64 / layers.len() as f64;
    }
    if req.call {
        let image: Vec<String> = req.image.iter().map(|x| normalize_ref(x)).collect();
        let idle = r
            .pools
            .iter()
            .filter(|p| {
                p.image
                    .iter()
                    .map(|x| normalize_ref(x))
                    .eq(image.iter().cloned())
            })
            .map(|p| p.idle)
            .sum::<u64>();
        if idle > 0 {
            s -= 0.05;
        }
    }
    s
}

fn wanted_layers(r: &NodeRecord, refs: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for x in refs {
        if x.starts_with("sha256:") {
            out.push(x.clone());
        } else if let Some(ls) = r.images.get(&normalize_ref(x)) {
            out.extend(ls.iter().cloned());
        }
    }
    out
}

/// FNV-1a of the key and the node, finished by a SplitMix step: stable across processes and
/// builds, unlike the standard library's hasher.
fn rendezvous(key: &str, node: &NodeId) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes().chain([0u8]).chain(node.as_str().bytes()) {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    SplitMix(h).next()
}

/// SplitMix64: a tiny, good-enough generator for sampling.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests;
