//! `warren cluster`: the nodes of a cluster as a gateway sees them, and their drain marks.
//! Needs a gateway URL (`--url` / `WARREN_URL`); a node daemon has no cluster view.

use warren_client::ClientError;
use warren_types::{ClusterInfo, NodeSummary};

use super::Ctx;
use crate::table::{age, now_ms, Table};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub action: Option<Action>,
    /// Print the gateway's whole view as JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Subcommand)]
pub enum Action {
    /// Take no new sandboxes on NODE; its sandboxes keep running and answering.
    Drain { node: String },
    /// Let NODE take new sandboxes again.
    Undrain { node: String },
    /// Forget a lost NODE: its sandboxes are then unknown (404) instead of lost (410).
    Forget { node: String },
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<i32> {
    let client = ctx.client()?;
    match args.action {
        Some(Action::Drain { node }) => {
            client.drain(&node).await.map_err(not_a_gateway)?;
            println!("{node} draining");
            Ok(0)
        }
        Some(Action::Undrain { node }) => {
            client.undrain(&node).await.map_err(not_a_gateway)?;
            println!("{node} ready");
            Ok(0)
        }
        Some(Action::Forget { node }) => {
            client.forget_node(&node).await.map_err(not_a_gateway)?;
            println!("{node} forgotten");
            Ok(0)
        }
        None => {
            let info = client.cluster().await.map_err(not_a_gateway)?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&info)?);
            } else {
                if !info.etcd_connected {
                    eprintln!(
                        "warren: the gateway has lost etcd; this is its last view (revision {})",
                        info.revision
                    );
                }
                print!("{}", render(&info, now_ms()));
            }
            Ok(0)
        }
    }
}

/// `404 no route` on a cluster route: the URL is a node daemon, not a gateway. A gateway's
/// `404 not_found` for an unknown node passes as it is.
fn not_a_gateway(e: ClientError) -> anyhow::Error {
    let no_route = e
        .api_error()
        .is_none_or(|a| a.message.starts_with("no route"));
    if e.status() == Some(404) && no_route {
        return anyhow::Error::new(e).context(
            "this URL does not serve the cluster routes: point --url (or WARREN_URL) at a \
             warren-gateway",
        );
    }
    anyhow::Error::new(e).context("the cluster call failed")
}

fn gib(mb: u64) -> String {
    format!("{:.1}", mb as f64 / 1024.0)
}

fn row(n: &NodeSummary, now: u64) -> Vec<String> {
    let r = &n.record;
    let substrates: Vec<&str> = r.substrates.iter().map(|s| s.as_str()).collect();
    let starting = if r.load.creating > 0 {
        format!(" ({} starting)", r.load.creating)
    } else {
        String::new()
    };
    vec![
        n.id.to_string(),
        r.address.clone(),
        n.state.as_str().to_string(),
        substrates.join(","),
        format!("{}{starting}", r.load.sandboxes()),
        format!(
            "{}/{} GiB",
            gib(r.load.memory_reserved_mb),
            gib(r.capacity.memory_total_mb)
        ),
        format!("{:.1}%", r.load.cpu_pressure),
        age(now.saturating_sub(r.started_at_ms)),
    ]
}

/// The nodes table: one row per node, ordered by id.
pub fn render(info: &ClusterInfo, now: u64) -> String {
    let mut t = Table::new([
        "ID",
        "ADDRESS",
        "STATE",
        "SUBSTRATES",
        "SANDBOXES",
        "MEMORY",
        "PRESSURE",
        "AGE",
    ]);
    let mut nodes: Vec<&NodeSummary> = info.nodes.iter().collect();
    nodes.sort_by(|a, b| a.id.as_str().cmp(b.id.as_str()));
    for n in nodes {
        t.row(row(n, now));
    }
    t.render()
}

#[cfg(test)]
mod tests {
    use super::*;
    use warren_types::{NodeCapacity, NodeLoad, NodeState, NodeSummaryRecord, Substrate};

    fn node(id: &str, state: NodeState, creating: u64, running: u64) -> NodeSummary {
        NodeSummary {
            id: id.parse().unwrap(),
            state,
            record: NodeSummaryRecord {
                incarnation: "i".into(),
                address: format!("http://10.0.0.{}:7070", id.len()),
                version: "0.1.0".into(),
                started_at_ms: 1_000,
                substrates: vec![Substrate::Container, Substrate::Microvm],
                capacity: NodeCapacity {
                    memory_total_mb: 65536,
                    ..Default::default()
                },
                load: NodeLoad {
                    creating,
                    running,
                    memory_reserved_mb: 1536,
                    cpu_pressure: 3.25,
                    ..Default::default()
                },
                pools: vec![],
                images: vec![],
                layers: vec![],
            },
            in_flight: 0,
        }
    }

    #[test]
    fn nodes_table_is_sorted_and_aligned() {
        let info = ClusterInfo {
            nodes: vec![
                node("n2", NodeState::Draining, 0, 7),
                node("n10", NodeState::Lost, 2, 40),
            ],
            etcd_connected: true,
            revision: 9,
        };
        let out = render(&info, 1_000 + 300_000);
        assert_eq!(
            out,
            "ID   ADDRESS               STATE     SUBSTRATES         SANDBOXES        MEMORY        PRESSURE  AGE\n\
             n10  http://10.0.0.3:7070  lost      container,microvm  42 (2 starting)  1.5/64.0 GiB  3.2%      5m\n\
             n2   http://10.0.0.2:7070  draining  container,microvm  7                1.5/64.0 GiB  3.2%      5m\n"
        );
    }
}
