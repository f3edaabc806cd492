//! `/metrics` of a real node: a container's start is measured phase by phase, pauses and
//! resumes are timed, requests count by route template, the sandboxes' CPU comes from the
//! node's parent cgroups, and every family is listed in docs/metrics.md.

use warren_client::CreateSandboxRequest;

use crate::common::{repo_root, Daemon};

fn has(text: &str, line: &str) {
    assert!(text.contains(line), "{line} not in\n{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_measure_a_real_node() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let c = d.client();
    let sb = d
        .create(&CreateSandboxRequest {
            memory_mb: Some(64),
            ..Default::default()
        })
        .await;
    d.sh_ok(&sb.id, "true").await;
    c.pause(&sb.id).await.unwrap();
    c.resume(&sb.id).await.unwrap();
    let first = c.metrics().await.unwrap();
    d.sh_ok(&sb.id, "true").await;
    let text = c.metrics().await.unwrap();

    for phase in ["record", "image", "cgroups", "agent", "network"] {
        has(
            &text,
            &format!(
                "warren_sandbox_create_phase_seconds_count{{substrate=\"container\",phase=\"{phase}\"}} 1\n"
            ),
        );
    }
    has(
        &text,
        "warren_sandbox_create_seconds_count{substrate=\"container\"} 1\n",
    );
    has(
        &text,
        "warren_sandbox_pause_seconds_count{substrate=\"container\"} 1\n",
    );
    has(
        &text,
        "warren_sandbox_resume_seconds_count{substrate=\"container\"} 1\n",
    );
    has(
        &text,
        "warren_exec_duration_seconds_count{substrate=\"container\"} 2\n",
    );
    has(
        &text,
        "warren_sandboxes{state=\"running\",substrate=\"container\"} 1\n",
    );
    has(
        &text,
        "warren_http_requests_total{method=\"POST\",route=\"/v1/sandboxes/{id}/exec\",status=\"200\"} 2\n",
    );
    // The CPU of all sandboxes, from the node's parent cgroups; the idle share needs two
    // scrapes (the first one starts its window).
    assert!(
        !first.contains("warren_sandboxes_cpu_idle_ratio"),
        "{first}"
    );
    has(&text, "warren_sandboxes_cpu_seconds_total ");
    has(&text, "warren_sandboxes_cpu_idle_ratio ");
    has(&text, "process_cpu_seconds_total ");
    let doc = std::fs::read_to_string(repo_root().join("docs/metrics.md")).unwrap();
    let undocumented = warren_edge::http_metrics::undocumented(&text, &doc);
    assert!(
        undocumented.is_empty(),
        "not in docs/metrics.md: {undocumented:?}"
    );
    c.delete(&sb.id).await.unwrap();
}
