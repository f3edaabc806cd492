//! Steps stay exactly-once across a daemon crash: a step whose command is running when the
//! daemon is killed with SIGKILL runs on in the sandbox, the restarted daemon collects its
//! result into the log before it serves, and the client's retry of the step answers that
//! result (`replayed`) instead of running the command a second time.

use std::time::Duration;

use warren_client::{ExecRequest, ExecResult};

use crate::common::{wait_for, Daemon};

/// A step that counts its runs in the sandbox, then sleeps `secs` and prints.
fn counted(step: u64, secs: f64) -> ExecRequest {
    ExecRequest {
        step: Some(step),
        ..ExecRequest::shell(format!(
            "echo run >> /root/runs-{step}; sleep {secs}; echo finished {step}; echo oops >&2"
        ))
    }
}

async fn runs(d: &Daemon, id: &str, step: u64) -> usize {
    let r = d
        .sh(id, &format!("cat /root/runs-{step} 2>/dev/null"))
        .await;
    r.stdout.lines().count()
}

async fn started(d: &Daemon, id: &str, step: u64) {
    let c = d.client().clone();
    let path = format!("/root/runs-{step}");
    let seen = wait_for(Duration::from_secs(20), || {
        let (c, path) = (c.clone(), path.clone());
        async move { c.read_file_bytes(id, &path).await.ok().map(|_| ()) }
    })
    .await;
    assert!(
        seen.is_some(),
        "step {step} never started; log:\n{}",
        d.log_tail(30)
    );
}

fn check_answer(r: &ExecResult, step: u64) {
    assert!(r.replayed, "the retry of step {step} ran it again: {r:?}");
    assert_eq!(r.stdout, format!("finished {step}\n"), "{r:?}");
    assert_eq!(r.stderr, "oops\n", "{r:?}");
    assert_eq!(r.exit_code, Some(0), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_a_step_in_flight_when_the_daemon_is_killed_runs_once() {
    let Some(mut d) = Daemon::start().await else {
        return;
    };
    // One step ends while the daemon is down, one is still running when it is back.
    let (a, b) = (d.sandbox().await, d.sandbox().await);
    let (short, long) = (counted(1, 0.2), counted(2, 4.0));
    let calls: Vec<_> = [(&a, &short), (&b, &long)]
        .into_iter()
        .map(|(id, req)| {
            let (c, id, req) = (d.client().clone(), id.clone(), req.clone());
            tokio::spawn(async move { c.exec(&id, &req).await })
        })
        .collect();
    started(&d, &a, 1).await;
    started(&d, &b, 2).await;
    d.kill9();
    for c in calls {
        assert!(
            c.await.unwrap().is_err(),
            "a step answered although the daemon was killed during it"
        );
    }
    // The short step ends while no daemon runs.
    tokio::time::sleep(Duration::from_millis(600)).await;
    d.spawn().await;

    // The retries: the ended step answers at once, the running one when it ends.
    let r = d.client().exec(&a, &short).await.unwrap();
    check_answer(&r, 1);
    let r = d.client().exec(&b, &long).await.unwrap();
    check_answer(&r, 2);
    assert_eq!(runs(&d, &a, 1).await, 1, "step 1 ran more than once");
    assert_eq!(runs(&d, &b, 2).await, 1, "step 2 ran more than once");

    // Each step is in the log once, with its result.
    for (id, step) in [(&a, 1), (&b, 2)] {
        let log = d.client().trajectory(id, None).await.unwrap();
        let entries: Vec<_> = log.iter().filter(|e| e.step == Some(step)).collect();
        assert_eq!(entries.len(), 1, "{id}: step {step} logged {log:?}");
    }
    // A further retry still replays, and the next step runs as usual.
    check_answer(&d.client().exec(&b, &long).await.unwrap(), 2);
    let next = d.client().exec(&b, &counted(3, 0.0)).await.unwrap();
    assert!(!next.replayed && next.stdout == "finished 3\n", "{next:?}");
    assert_eq!(runs(&d, &b, 2).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_a_streamed_step_survives_a_graceful_restart_too() {
    let Some(mut d) = Daemon::start().await else {
        return;
    };
    let id = d.sandbox().await;
    let req = counted(5, 2.0);
    let c = d.client().clone();
    let (sid, sreq) = (id.clone(), req.clone());
    let call = tokio::spawn(async move {
        let s = c.exec_stream(&sid, &sreq).await?;
        s.finish(|_| {}).await
    });
    started(&d, &id, 5).await;
    // SIGTERM: the daemon's shutdown must not cancel a step's command either.
    d.restart().await;
    let _ = call.await;
    // Streamed or not is the same request (the log's digest leaves it out): both retries
    // replay the one run.
    check_answer(&d.client().exec(&id, &req).await.unwrap(), 5);
    let s = d.client().exec_stream(&id, &req).await.unwrap();
    let mut out = String::new();
    let r = s
        .finish(|ev| {
            if let warren_client::ExecEvent::Stdout { data } = ev {
                out.push_str(data);
            }
        })
        .await
        .unwrap();
    assert!(r.replayed, "{r:?}");
    assert_eq!(out, "finished 5\n");
    assert_eq!(runs(&d, &id, 5).await, 1, "step 5 ran more than once");
}
