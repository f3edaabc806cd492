//! `warren bench crash`: the daemon killed with SIGKILL during rollouts, round after round;
//! no step may run twice and none may be lost.
//!
//! It starts its own `warrend` (root; `WARREN_BIN_DIR` or next to this executable) on a
//! private state directory. Each round creates `-c` sandboxes (rollouts, default 50) and runs
//! 20 logged steps in each, from one client task per rollout; every step appends its number to
//! a file in its sandbox, sleeps a little and prints it. Part way through the round (at a
//! point that moves from round to round) the daemon is killed with SIGKILL and started again
//! on the same state; the clients retry each unanswered step with the same step number
//! until it answers (at most 60 s). Then each sandbox's file tells how often each step ran:
//! twice or more is a step run twice, never (or an answer that never came) a step lost.
//! Reported per run: steps, answers that were replays, steps twice, steps lost, and the
//! restart time (kill → the node answers again). Targets: 0 twice, 0 lost.
//!
//! The same run's baseline: a first round with no kill (the same rollouts and steps, counted
//! the same way), so a round's time with a kill reads against one without.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use serde::Serialize;
use warren_client::{Client, ClientError, CreateSandboxRequest, ExecRequest};

use super::daemon::Daemon;
use super::Check;
use crate::table::{ms, Table};

/// Steps of each rollout.
const STEPS: u64 = 20;
/// How long a client retries one step while the node is away.
const RETRY_FOR: Duration = Duration::from_secs(60);

#[derive(Debug, Default, Serialize)]
pub struct CrashBench {
    pub rounds: usize,
    pub rollouts: usize,
    pub steps_per_rollout: u64,
    /// Steps answered (all should be).
    pub steps: u64,
    /// Answers that came from the log (`replayed`): steps in flight at a kill, or retried.
    pub replayed: u64,
    /// Steps whose command ran more than once.
    pub twice: u64,
    /// Steps never answered, or answered but never run.
    pub lost: u64,
    /// Kill → the node answers again, per round.
    pub restart_ms: Vec<f64>,
    /// The baseline round (no kill): its time, steps, steps twice and lost.
    pub baseline_ms: f64,
    pub baseline_steps: u64,
    pub baseline_twice: u64,
    pub baseline_lost: u64,
    /// Each round with a kill: first create → last step answered.
    pub round_ms: Vec<f64>,
}

impl CrashBench {
    pub fn checks(&self) -> Vec<Check> {
        vec![
            Check::at_most("steps run twice", self.twice as f64, "steps", 0.0),
            Check::at_most("steps lost", self.lost as f64, "steps", 0.0),
        ]
    }

    pub fn render(&self) -> String {
        let mut t = Table::new([
            "",
            "ROUNDS",
            "ROLLOUTS",
            "STEPS",
            "REPLAYED",
            "TWICE",
            "LOST",
            "ROUND p50",
        ]);
        t.row([
            "no kill (baseline)".to_string(),
            "1".to_string(),
            self.rollouts.to_string(),
            self.baseline_steps.to_string(),
            "0".to_string(),
            self.baseline_twice.to_string(),
            self.baseline_lost.to_string(),
            format!("{} ms", ms(self.baseline_ms)),
        ]);
        t.row([
            "kill -9 each round".to_string(),
            self.rounds.to_string(),
            self.rollouts.to_string(),
            self.steps.to_string(),
            self.replayed.to_string(),
            self.twice.to_string(),
            self.lost.to_string(),
            format!("{} ms", ms(median(&self.round_ms))),
        ]);
        format!(
            "daemon kill -9 during {} rollouts x {} steps, once per round\n{}\nrestart (kill -> answering) median: {} ms\n",
            self.rollouts,
            self.steps_per_rollout,
            t.render(),
            ms(median(&self.restart_ms))
        )
    }
}

fn median(v: &[f64]) -> f64 {
    let mut sorted = v.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(0.0)
}

/// What one round counted.
#[derive(Debug, Default)]
struct Counts {
    steps: u64,
    replayed: u64,
    twice: u64,
    lost: u64,
}

/// The crash run's daemon: its own state directory, removed with it.
struct Node {
    daemon: Daemon,
}

impl Node {
    fn client(&self, connections: usize) -> Result<Client> {
        self.daemon.client(connections)
    }

    async fn start(&mut self) -> Result<()> {
        let probe = self.client(1)?;
        self.daemon
            .start(|_| {}, &probe, Duration::from_secs(60))
            .await
    }

    fn kill9(&mut self) {
        self.daemon.kill9();
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.daemon.stop();
        let _ = std::fs::remove_dir_all(self.daemon.dir());
    }
}

/// Is `e` the node being away (worth waiting for), rather than an answer?
fn away(e: &ClientError) -> bool {
    match e {
        ClientError::Api { status, .. } => *status == 503,
        _ => true,
    }
}

/// One step, retried with its step number until the node answers it.
async fn step(c: &Client, id: &str, step: u64) -> Option<bool> {
    let req = ExecRequest {
        step: Some(step),
        ..ExecRequest::shell(format!(
            "echo {step} >> /root/runs; sleep 0.05; echo {step}"
        ))
    };
    let t = Instant::now();
    loop {
        match c.exec(id, &req).await {
            Ok(r) if r.stdout == format!("{step}\n") => return Some(r.replayed),
            Ok(_) => return None,
            Err(e) if away(&e) && t.elapsed() < RETRY_FOR => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(_) => return None,
        }
    }
}

/// How often each step ran, from the sandbox's file.
fn runs(text: &str) -> BTreeMap<u64, u64> {
    let mut m = BTreeMap::new();
    for l in text.lines() {
        if let Ok(s) = l.trim().parse::<u64>() {
            *m.entry(s).or_insert(0) += 1;
        }
    }
    m
}

/// One round of `rollouts`; the daemon is killed part way through unless `kill` is false.
/// Answers what it counted and the round's time (first create → last step answered).
async fn round(
    node: &mut Node,
    rollouts: usize,
    r: usize,
    kill: bool,
    restart_ms: &mut Vec<f64>,
) -> Result<(Counts, f64)> {
    let began = Instant::now();
    let mut out = Counts::default();
    let c = node.client(rollouts + 8)?;
    let mut ids = Vec::new();
    for _ in 0..rollouts {
        let req = CreateSandboxRequest {
            memory_mb: Some(64),
            ..Default::default()
        };
        ids.push(c.create(&req).await.context("creating a rollout")?.id);
    }
    let answered = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = ids
        .iter()
        .map(|id| {
            let (c, id, answered) = (c.clone(), id.clone(), answered.clone());
            tokio::spawn(async move {
                let mut got = Vec::new();
                for s in 1..=STEPS {
                    got.push(step(&c, &id, s).await);
                    answered.fetch_add(1, Ordering::Relaxed);
                }
                got
            })
        })
        .collect();
    // The kill comes at 20 % to 80 % of the round's steps, moving from round to round.
    let total = rollouts * STEPS as usize;
    let at = total * (20 + (r * 37) % 61) / 100;
    if kill {
        while answered.load(Ordering::Relaxed) < at {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let t = Instant::now();
        node.kill9();
        node.start().await?;
        restart_ms.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let mut all = Vec::new();
    for task in tasks {
        all.push(task.await?);
    }
    let took = began.elapsed().as_secs_f64() * 1000.0;
    for (got, id) in all.into_iter().zip(&ids) {
        let file = c
            .exec(id, &ExecRequest::shell("cat /root/runs"))
            .await
            .context("reading a rollout's runs")?;
        let ran = runs(&file.stdout);
        for (i, g) in got.iter().enumerate() {
            let s = i as u64 + 1;
            let n = ran.get(&s).copied().unwrap_or(0);
            match g {
                Some(replayed) => {
                    out.steps += 1;
                    out.replayed += u64::from(*replayed);
                }
                None => out.lost += 1,
            }
            if n > 1 {
                out.twice += 1;
            } else if n == 0 && g.is_some() {
                out.lost += 1;
            }
        }
        let _ = c.delete(id).await;
    }
    Ok((out, took))
}

pub async fn measure(rounds: usize, rollouts: usize) -> Result<CrashBench> {
    let dir = std::env::temp_dir().join(format!("warren-bench-crash-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut node = Node {
        daemon: Daemon::new(&dir, &format!("bcr{}", std::process::id() % 100_000))?,
    };
    node.start().await?;
    let mut out = CrashBench {
        rounds,
        rollouts,
        steps_per_rollout: STEPS,
        ..Default::default()
    };
    let mut restarts = Vec::new();
    let (base, took) = round(&mut node, rollouts, 0, false, &mut restarts).await?;
    (out.baseline_steps, out.baseline_twice, out.baseline_lost) =
        (base.steps, base.twice, base.lost);
    out.baseline_ms = took;
    eprintln!(
        "baseline round (no kill): {} steps, {} twice, {} lost, {took:.0} ms",
        base.steps, base.twice, base.lost
    );
    for r in 0..rounds {
        let (n, took) = round(&mut node, rollouts, r, true, &mut restarts).await?;
        out.steps += n.steps;
        out.replayed += n.replayed;
        out.twice += n.twice;
        out.lost += n.lost;
        out.round_ms.push(took);
        out.restart_ms = restarts.clone();
        eprintln!(
            "round {}/{rounds}: {} steps, {} replayed, {} twice, {} lost",
            r + 1,
            out.steps,
            out.replayed,
            out.twice,
            out.lost
        );
    }
    Ok(out)
}

pub async fn run(
    rounds: usize,
    rollouts: usize,
    json: bool,
    report_dir: Option<&std::path::Path>,
) -> Result<i32> {
    let b = measure(rounds, rollouts).await?;
    super::answer("crash", &b, b.render(), &b.checks(), 0, json, report_dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_counted_per_step() {
        let m = runs("1\n2\n2\n\nx\n3\n");
        assert_eq!(m.get(&1), Some(&1));
        assert_eq!(m.get(&2), Some(&2));
        assert_eq!(m.get(&4), None);
    }
}
