//! `warren demo`: a small but real reinforcement-learning style rollout in N sandboxes at
//! once, the way a training loop uses Warren.
//!
//! Each rollout: create a sandbox, write a task (a Python module with a bug and its unit
//! tests) through the files API, commit it with git, run the tests (they must fail), apply a
//! scripted fix, run the tests again (they must pass), and take `git diff --stat`. Every step
//! is timed. All sandboxes are deleted at the end, also after an error or Ctrl-C.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{bail, Context as _};
use warren_client::{Client, CreateSandboxRequest, ExecRequest, ExecResult, ImageRef};

use super::{delete_all, run_tasks, sweep_label, until_interrupted, Ctx, Stop, STOP_GRACE};
use crate::stats::{mean, percentile};
use crate::table::{ms, Table};

/// Label carried by every demo sandbox; its value is the run id.
const DEMO_LABEL: &str = "warren.demo";
const TASK_DIR: &str = "/workspace/task";
const CALC_PY: &str = "def add(a, b):\n    return a - b\n";
const TEST_CALC_PY: &str = r#"import unittest

from calc import add


class AddTest(unittest.TestCase):
    def test_small(self):
        self.assertEqual(add(2, 3), 5)

    def test_negative(self):
        self.assertEqual(add(-4, 1), -3)


if __name__ == "__main__":
    unittest.main()
"#;
const GIT: &str = "git -c user.email=demo@warren -c user.name=demo -c 'safe.directory=*'";
const TEST_CMD: &str = "python3 -m unittest -q test_calc";
const FIX_CMD: &str = "sed -i 's/return a - b/return a + b/' calc.py";
/// Limit on each command of a rollout.
const STEP_TIMEOUT_SECS: f64 = 120.0;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Rollouts to run at once (one sandbox each)
    #[arg(long, short = 'n', default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub n: u32,
    /// Image to run the rollouts in (needs python3 and git)
    #[arg(long, default_value = "default")]
    pub image: String,
}

/// A test run: its exit code and how long it took.
#[derive(Debug, Clone, Copy)]
struct TestRun {
    passed: bool,
    ms: f64,
}

impl TestRun {
    fn cell(run: Option<TestRun>) -> String {
        match run {
            Some(t) if t.passed => format!("pass {}ms", ms(t.ms)),
            Some(t) => format!("fail {}ms", ms(t.ms)),
            None => "-".into(),
        }
    }
}

/// What one rollout did and how long each step took.
#[derive(Debug, Default)]
struct Rollout {
    id: Option<String>,
    create_ms: Option<f64>,
    /// (step, milliseconds) in order, create excluded.
    steps: Vec<(&'static str, f64)>,
    test_before: Option<TestRun>,
    test_after: Option<TestRun>,
    diff_stat: String,
    total_ms: f64,
    error: Option<String>,
}

fn elapsed_ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

fn tail(s: &str, lines: usize) -> String {
    let v: Vec<&str> = s.trim_end().lines().collect();
    v[v.len().saturating_sub(lines)..].join(" | ")
}

async fn sh(client: &Client, id: &str, cmd: &str) -> anyhow::Result<ExecResult> {
    let mut req = ExecRequest::shell(cmd);
    req.cwd = Some(TASK_DIR.to_string());
    req.timeout_secs = Some(STEP_TIMEOUT_SECS);
    client
        .exec(id, &req)
        .await
        .with_context(|| format!("exec {cmd:?}"))
}

fn expect_ok(r: &ExecResult, what: &str) -> anyhow::Result<()> {
    if r.success() {
        return Ok(());
    }
    bail!(
        "{what} failed (exit {:?}, signal {:?}): {}",
        r.exit_code,
        r.signal,
        tail(&format!("{}{}", r.stdout, r.stderr), 3)
    )
}

/// Runs the steps of one rollout, recording into `r` as it goes.
async fn steps(
    client: &Client,
    image: &str,
    run_label: &str,
    created: &Mutex<Vec<String>>,
    stop: &Stop,
    r: &mut Rollout,
) -> anyhow::Result<()> {
    stop.check()?;
    let t = Instant::now();
    let req = CreateSandboxRequest {
        image: ImageRef::Name(image.to_string()),
        labels: BTreeMap::from([(DEMO_LABEL.to_string(), run_label.to_string())]),
        env: BTreeMap::from([("PYTHONDONTWRITEBYTECODE".to_string(), "1".to_string())]),
        ..Default::default()
    };
    let sb = client.create(&req).await.context("create")?;
    created.lock().expect("registry lock").push(sb.id.clone());
    r.create_ms = Some(elapsed_ms(t));
    let id = sb.id.clone();
    r.id = Some(sb.id);

    stop.check()?;
    let t = Instant::now();
    client
        .mkdir(&id, TASK_DIR, true, None)
        .await
        .context("mkdir")?;
    client
        .write_file_bytes(&id, &format!("{TASK_DIR}/calc.py"), Some(0o644), CALC_PY)
        .await
        .context("writing calc.py")?;
    client
        .write_file_bytes(
            &id,
            &format!("{TASK_DIR}/test_calc.py"),
            Some(0o644),
            TEST_CALC_PY,
        )
        .await
        .context("writing test_calc.py")?;
    r.steps.push(("write", elapsed_ms(t)));

    stop.check()?;
    let t = Instant::now();
    let commit = format!("git init -q && {GIT} add -A && {GIT} commit -q -m 'task: add calc'");
    expect_ok(&sh(client, &id, &commit).await?, "git commit")?;
    r.steps.push(("commit", elapsed_ms(t)));

    stop.check()?;
    let t = Instant::now();
    let before = sh(client, &id, TEST_CMD).await?;
    r.test_before = Some(TestRun {
        passed: before.success(),
        ms: elapsed_ms(t),
    });
    if before.success() {
        bail!("the tests passed before the fix");
    }
    if before.exit_code.is_none() {
        expect_ok(&before, "the first test run")?;
    }

    stop.check()?;
    let t = Instant::now();
    expect_ok(&sh(client, &id, FIX_CMD).await?, "the fix")?;
    r.steps.push(("fix", elapsed_ms(t)));

    stop.check()?;
    let t = Instant::now();
    let after = sh(client, &id, TEST_CMD).await?;
    r.test_after = Some(TestRun {
        passed: after.success(),
        ms: elapsed_ms(t),
    });
    expect_ok(&after, "the tests after the fix")?;

    stop.check()?;
    let t = Instant::now();
    let diff = sh(client, &id, &format!("{GIT} diff --stat")).await?;
    expect_ok(&diff, "git diff")?;
    r.steps.push(("diff", elapsed_ms(t)));
    r.diff_stat = diff.stdout.lines().next().unwrap_or("").trim().to_string();
    if !r.diff_stat.contains("calc.py") {
        bail!("git diff --stat does not show calc.py: {:?}", diff.stdout);
    }
    Ok(())
}

async fn rollout(
    client: Client,
    image: String,
    run_label: String,
    created: Arc<Mutex<Vec<String>>>,
    stop: Stop,
) -> Rollout {
    let start = Instant::now();
    let mut r = Rollout::default();
    if let Err(e) = steps(&client, &image, &run_label, &created, &stop, &mut r).await {
        r.error = Some(format!("{e:#}"));
    }
    r.total_ms = elapsed_ms(start);
    r
}

fn report(rollouts: &[Rollout], wall_ms: f64) -> String {
    let mut t = Table::new([
        "SANDBOX",
        "CREATE ms",
        "TEST BEFORE",
        "TEST AFTER",
        "TOTAL ms",
        "RESULT",
        "DIFF",
    ]);
    for r in rollouts {
        t.row([
            r.id.clone().unwrap_or_else(|| "-".into()),
            r.create_ms.map(ms).unwrap_or_else(|| "-".into()),
            TestRun::cell(r.test_before),
            TestRun::cell(r.test_after),
            ms(r.total_ms),
            if r.error.is_none() {
                "ok".into()
            } else {
                "FAILED".into()
            },
            r.diff_stat.clone(),
        ]);
    }
    let mut out = t.render();
    for (i, r) in rollouts.iter().enumerate() {
        if let Some(e) = &r.error {
            out.push_str(&format!(
                "rollout {i} ({}): {e}\n",
                r.id.as_deref().unwrap_or("no sandbox")
            ));
        }
    }
    let mut step_names: Vec<&str> = Vec::new();
    for r in rollouts {
        for (name, _) in &r.steps {
            if !step_names.contains(name) {
                step_names.push(name);
            }
        }
    }
    let mut means = vec![format!(
        "create {}",
        ms(mean(
            &rollouts
                .iter()
                .filter_map(|r| r.create_ms)
                .collect::<Vec<_>>()
        ))
    )];
    for name in step_names {
        let xs: Vec<f64> = rollouts
            .iter()
            .flat_map(|r| r.steps.iter().filter(|(n, _)| *n == name).map(|(_, v)| *v))
            .collect();
        means.push(format!("{name} {}", ms(mean(&xs))));
    }
    for (label, pick) in [("test-before", true), ("test-after", false)] {
        let xs: Vec<f64> = rollouts
            .iter()
            .filter_map(|r| if pick { r.test_before } else { r.test_after })
            .map(|t| t.ms)
            .collect();
        if !xs.is_empty() {
            means.push(format!("{label} {}", ms(mean(&xs))));
        }
    }
    out.push_str(&format!("mean step ms: {}\n", means.join(", ")));
    let ok = rollouts.iter().filter(|r| r.error.is_none()).count();
    let mut creates: Vec<f64> = rollouts.iter().filter_map(|r| r.create_ms).collect();
    creates.sort_by(f64::total_cmp);
    out.push_str(&format!(
        "{ok}/{} rollouts passed in {} ms wall (create p50 {} ms, p99 {} ms)\n",
        rollouts.len(),
        ms(wall_ms),
        ms(percentile(&creates, 50.0)),
        ms(percentile(&creates, 99.0)),
    ));
    out
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<i32> {
    let n = args.n as usize;
    let client = ctx.client_with(n.clamp(8, 256))?;
    let run_label = format!("{}", crate::table::now_ms());
    let created: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(Vec::new()));
    eprintln!("warren demo: {n} rollouts on image {:?}", args.image);

    let start = Instant::now();
    let stop = Stop::default();
    let tasks = (0..n).map(|_| {
        rollout(
            client.clone(),
            args.image.clone(),
            run_label.clone(),
            created.clone(),
            stop.clone(),
        )
    });
    let (outcome, interrupted) = until_interrupted(run_tasks(tasks), &stop, STOP_GRACE).await;
    let wall_ms = elapsed_ms(start);

    let mut code = match outcome {
        None => 130,
        Some(results) => {
            let rollouts: Vec<Rollout> = results
                .into_iter()
                .map(|r| {
                    r.unwrap_or_else(|e| Rollout {
                        error: Some(format!("{e:#}")),
                        ..Default::default()
                    })
                })
                .collect();
            print!("{}", report(&rollouts, wall_ms));
            if rollouts.iter().all(|r| r.error.is_none()) {
                0
            } else {
                1
            }
        }
    };
    if interrupted {
        code = 130;
    }

    let t = Instant::now();
    let ids = created.lock().expect("registry lock").clone();
    let count = ids.len();
    let failed = delete_all(&client, ids, 64).await;
    for (id, e) in &failed {
        eprintln!("warren: deleting {id} failed: {e}");
    }
    let mut deleted = count - failed.len();
    if interrupted {
        // Rollouts abandoned by a second Ctrl-C may have creates in flight; the run's label
        // finds what they left.
        deleted += sweep_label(&client, DEMO_LABEL, &run_label).await;
    }
    eprintln!("deleted {deleted} sandboxes in {} ms", ms(elapsed_ms(t)));
    Ok(if failed.is_empty() { code } else { code.max(1) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_lists_every_rollout_and_a_summary() {
        let ok = Rollout {
            id: Some("n1-a".into()),
            create_ms: Some(12.0),
            steps: vec![("write", 2.0), ("commit", 20.0)],
            test_before: Some(TestRun {
                passed: false,
                ms: 40.0,
            }),
            test_after: Some(TestRun {
                passed: true,
                ms: 38.0,
            }),
            diff_stat: "calc.py | 2 +-".into(),
            total_ms: 150.0,
            error: None,
        };
        let bad = Rollout {
            error: Some("create: limit_exceeded".into()),
            ..Default::default()
        };
        let out = report(&[ok, bad], 200.0);
        assert!(out.contains("n1-a"), "{out}");
        assert!(out.contains("fail 40.0ms"), "{out}");
        assert!(out.contains("pass 38.0ms"), "{out}");
        assert!(
            out.contains("rollout 1 (no sandbox): create: limit_exceeded"),
            "{out}"
        );
        assert!(out.contains("1/2 rollouts passed"), "{out}");
        assert!(
            out.contains("mean step ms: create 12.0, write 2.00, commit 20.0"),
            "{out}"
        );
    }
}
