//! The trajectory's promise under a crash: a daemon killed with SIGKILL during a burst of
//! 1,000 steps from several clients at once keeps, after its restart, every step a client
//! got an answer for (appends share fsyncs in groups; none is answered before it is on
//! disk), each once and in a gapless log.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use warren_client::ExecRequest;

use crate::common::Daemon;

const CLIENTS: u64 = 4;
const STEPS: u64 = 250;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answered_steps_survive_a_kill_during_a_burst() {
    let Some(mut d) = Daemon::start().await else {
        return;
    };
    let mut ids = Vec::new();
    for _ in 0..CLIENTS {
        ids.push(d.sandbox().await);
    }
    let answered = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = ids
        .iter()
        .map(|id| {
            let (c, id, answered) = (d.client().clone(), id.clone(), answered.clone());
            tokio::spawn(async move {
                let mut got = Vec::new();
                for step in 1..=STEPS {
                    let req = ExecRequest {
                        step: Some(step),
                        ..ExecRequest::shell(format!("echo {step}"))
                    };
                    match c.exec(&id, &req).await {
                        Ok(r) => {
                            assert_eq!(r.stdout, format!("{step}\n"));
                            got.push(step);
                            answered.fetch_add(1, Ordering::SeqCst);
                        }
                        // The daemon is gone: nothing after this is answered.
                        Err(_) => break,
                    }
                }
                got
            })
        })
        .collect();
    // Killed part way through the burst.
    let total = (CLIENTS * STEPS) as usize;
    while answered.load(Ordering::SeqCst) < total * 2 / 5 {
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    d.kill9();
    let mut got = Vec::new();
    for c in clients {
        got.push(c.await.unwrap());
    }
    let n: usize = got.iter().map(Vec::len).sum();
    assert!(n < total, "the kill came after the burst ({n} answers)");
    println!("{n} of {total} steps answered before the kill");

    d.spawn().await;
    println!(
        "entries past the index recovered at the start: {}",
        d.log_tail(200)
            .contains("trajectory entries past the index recovered")
    );
    for (id, got) in ids.iter().zip(&got) {
        let log = d.client().trajectory(id, None).await.unwrap();
        let seqs: Vec<u64> = log.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, (1..=log.len() as u64).collect::<Vec<_>>(), "{id}");
        let logged: Vec<u64> = log.iter().filter_map(|e| e.step).collect();
        let unique: BTreeSet<u64> = logged.iter().copied().collect();
        assert_eq!(unique.len(), logged.len(), "{id}: a step logged twice");
        for step in got {
            assert!(
                unique.contains(step),
                "{id}: step {step} was answered but is not in the log after the crash"
            );
        }
        // At most the calls in flight at the kill are logged beyond the answers.
        assert!(logged.len() <= got.len() + 1, "{id}: {logged:?}");
        // The last answered step, retried, answers from the log (its step index row may have
        // been rebuilt from the log at the start).
        if let Some(&last) = got.last() {
            let again = d
                .exec(
                    id,
                    &ExecRequest {
                        step: Some(last),
                        ..ExecRequest::shell(format!("echo {last}"))
                    },
                )
                .await;
            assert!(
                again.replayed,
                "{id}: step {last} ran again after the crash"
            );
            assert_eq!(again.stdout, format!("{last}\n"));
        }
        // The log goes on where it stopped.
        let next = logged.last().copied().unwrap_or(0) + 1;
        let r = d
            .exec(
                id,
                &ExecRequest {
                    step: Some(next),
                    ..ExecRequest::shell("echo after")
                },
            )
            .await;
        assert_eq!(r.stdout, "after\n");
    }
}
