//! The contract test: `api/openapi.yaml` and the router must describe the same routes, the
//! spec must list every error code and trajectory entry kind, and its schemas must name the
//! same fields as the types the daemon serializes.

use std::collections::BTreeSet;
use warren_node::ROUTES;
use warren_types::{
    ChmodRequest, CreateSandboxRequest, ErrorCode, ExecCall, ExecRequest, ExecResult, FileKind,
    FileStat, ForkRequest, MkdirRequest, PauseStats, TrajectoryCall, TrajectoryEntry,
};

fn spec() -> serde_yaml::Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../api/openapi.yaml");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    serde_yaml::from_str(&text).expect("openapi.yaml is YAML")
}

fn schema<'a>(spec: &'a serde_yaml::Value, name: &str) -> &'a serde_yaml::Value {
    &spec["components"]["schemas"][name]
}

#[test]
fn routes_match_the_spec_both_ways() {
    let spec = spec();
    let mut in_spec = BTreeSet::new();
    let paths = spec["paths"].as_mapping().expect("paths");
    for (path, item) in paths {
        let path = path.as_str().unwrap();
        // Routes only a cluster gateway serves (warren-gateway checks them).
        if item["x-warren-gateway-only"].as_bool() == Some(true) {
            continue;
        }
        // The dashboard's files (warren-ui checks them).
        if item["x-warren-ui"].as_bool() == Some(true) {
            continue;
        }
        for (method, _) in item.as_mapping().expect("path item") {
            let method = method.as_str().unwrap();
            if [
                "get", "put", "post", "delete", "patch", "head", "options", "trace",
            ]
            .contains(&method)
            {
                in_spec.insert((method.to_uppercase(), path.to_string()));
            }
        }
    }
    let in_code: BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|(m, p)| (m.to_string(), warren_types::routes::openapi_path(p)))
        .collect();
    let missing_in_spec: Vec<_> = in_code.difference(&in_spec).collect();
    let missing_in_code: Vec<_> = in_spec.difference(&in_code).collect();
    assert!(
        missing_in_spec.is_empty(),
        "routes served but not in api/openapi.yaml: {missing_in_spec:?}"
    );
    assert!(
        missing_in_code.is_empty(),
        "routes in api/openapi.yaml but not served: {missing_in_code:?}"
    );
}

#[test]
fn every_error_code_is_in_the_spec() {
    let spec = spec();
    let kinds: BTreeSet<String> = schema(&spec, "TrajectoryKind")["enum"]
        .as_sequence()
        .expect("TrajectoryKind enum")
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    let calls = [
        TrajectoryCall::Exec(ExecCall::default()),
        TrajectoryCall::Spawn(ExecCall::default()),
        TrajectoryCall::Kill { pid: 1, signal: 9 },
        TrajectoryCall::WriteFile {
            path: "/".into(),
            mode: None,
            sha256: String::new(),
            size: 0,
        },
        TrajectoryCall::WriteTar {
            path: "/".into(),
            sha256: String::new(),
            size: 0,
        },
        TrajectoryCall::Mkdir {
            path: "/".into(),
            parents: false,
            mode: None,
        },
        TrajectoryCall::Remove {
            path: "/".into(),
            recursive: false,
        },
        TrajectoryCall::Chmod {
            path: "/".into(),
            mode: 0,
        },
        TrajectoryCall::Fork {
            children: vec![],
            n: None,
            labels: Default::default(),
        },
        TrajectoryCall::ForkedFrom {
            parent: String::new(),
            parent_seq: 0,
        },
        TrajectoryCall::Pause { by: "call".into() },
        TrajectoryCall::Resume {},
        TrajectoryCall::Snapshot {
            snapshot: String::new(),
        },
        TrajectoryCall::Network {
            policy: Default::default(),
        },
        TrajectoryCall::Terminal {
            session: 1,
            part: 0,
            argv: vec![],
        },
    ];
    let known: BTreeSet<String> = calls.iter().map(|c| c.kind().to_string()).collect();
    assert_eq!(
        kinds, known,
        "TrajectoryKind enum differs from the entry kinds"
    );
    let listed: BTreeSet<String> = schema(&spec, "ErrorCode")["enum"]
        .as_sequence()
        .expect("ErrorCode enum")
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    let known: BTreeSet<String> = ErrorCode::ALL
        .iter()
        .map(|c| c.as_str().to_string())
        .collect();
    assert_eq!(
        listed, known,
        "ErrorCode enum in api/openapi.yaml differs from warren_types::ErrorCode"
    );
}

fn fields_of<T: serde::Serialize>(value: &T) -> BTreeSet<String> {
    serde_json::to_value(value)
        .unwrap()
        .as_object()
        .expect("an object")
        .keys()
        .cloned()
        .collect()
}

fn properties(spec: &serde_yaml::Value, name: &str) -> BTreeSet<String> {
    schema(spec, name)["properties"]
        .as_mapping()
        .unwrap_or_else(|| panic!("schema {name} has properties"))
        .keys()
        .map(|k| k.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn schemas_name_the_serialized_fields() {
    let spec = spec();
    let stat = FileStat {
        name: "/a".into(),
        kind: FileKind::File,
        size: 0,
        mode: 0,
        uid: 0,
        gid: 0,
        mtime_ms: 0,
        link_target: Some("/b".into()),
    };
    let cases: Vec<(&str, BTreeSet<String>)> = vec![
        (
            "CreateSandboxRequest",
            fields_of(&CreateSandboxRequest {
                trajectory_mb: Some(1),
                pty: true,
                snapshot: Some(String::new()),
                disk_medium: Some(warren_types::DiskMedium::Disk),
                ..CreateSandboxRequest::default()
            }),
        ),
        (
            "ImageConfig",
            fields_of(&warren_types::ImageConfig {
                env: vec!["A=b".into()],
                working_dir: Some("/w".into()),
                user: Some("u".into()),
                cmd: Some(vec![]),
                entrypoint: Some(vec![]),
                labels: [("a".to_string(), "b".to_string())].into(),
                exposed_ports: vec!["80/tcp".into()],
                stop_signal: Some("SIGTERM".into()),
                healthcheck: Some(Default::default()),
                shell: Some(vec![]),
            }),
        ),
        (
            "CreateSnapshotRequest",
            fields_of(&warren_types::CreateSnapshotRequest::default()),
        ),
        (
            "SnapshotInfo",
            fields_of(&warren_types::SnapshotInfo {
                id: String::new(),
                sandbox: String::new(),
                sandbox_seq: 0,
                substrate: Default::default(),
                image: vec![],
                limits: Default::default(),
                env: Default::default(),
                workdir: None,
                user: None,
                network: Default::default(),
                labels: Default::default(),
                processes: false,
                size_bytes: 0,
                created_at_ms: 0,
                tenant: Some(String::new()),
                pty: true,
            }),
        ),
        (
            "ExecRequest",
            fields_of(&ExecRequest {
                step: Some(0),
                kill_tree: true,
                stdin_encoding: warren_types::OutputEncoding::Base64,
                ..ExecRequest::default()
            }),
        ),
        ("ExecResult", fields_of(&ExecResult::default())),
        ("Limits", fields_of(&warren_types::Limits::default())),
        ("FileStat", fields_of(&stat)),
        (
            "MkdirRequest",
            fields_of(&MkdirRequest {
                path: "/".into(),
                parents: false,
                mode: None,
            }),
        ),
        (
            "ChmodRequest",
            fields_of(&ChmodRequest {
                path: "/".into(),
                mode: 0,
            }),
        ),
        ("PauseStats", fields_of(&PauseStats::default())),
        (
            "ForkRequest",
            fields_of(&ForkRequest {
                n: 1,
                labels: Default::default(),
            }),
        ),
        (
            "ExecCall",
            fields_of(&ExecCall {
                kill_tree: true,
                ..ExecCall::default()
            }),
        ),
        (
            "TrajectoryEntry",
            fields_of(&TrajectoryEntry {
                seq: 1,
                step: None,
                call: TrajectoryCall::Kill { pid: 1, signal: 9 },
                request_sha256: String::new(),
                started_at_ms: 0,
                ended_at_ms: 0,
                duration_ms: 0.0,
                result: None,
                error: None,
                cancelled: false,
            }),
        ),
    ];
    for (name, fields) in cases {
        assert_eq!(
            properties(&spec, name),
            fields,
            "schema {name} differs from the type's fields"
        );
    }
    let info: warren_types::SandboxInfo = serde_json::from_value(serde_json::json!({
        "id": "n1-01jd0m7x4e8k0k9yq1w2e3r4t5", "substrate": "container", "state": "running",
        "image": ["default"], "limits": {"cpus": 1.0, "memory_mb": 1, "disk_mb": 1, "pids": 8},
        "labels": {}, "env": {}, "workdir": null, "user": null, "network": "none",
        "created_at_ms": 0, "expires_at_ms": null, "idle_timeout_secs": null,
        "last_activity_ms": 0, "reason": null, "idempotency_key": null, "tenant": "team-a",
        "pty": true
    }))
    .expect("the spec's SandboxInfo example is a SandboxInfo");
    assert_eq!(properties(&spec, "SandboxInfo"), fields_of(&info));
    let outcome = warren_types::ReplayOutcome {
        error: Some("x".into()),
        exit_code: Some(0),
        signal: Some(9),
        stdout_sha256: Some("a".into()),
        stderr_sha256: Some("b".into()),
        not_replayable: Some("c".into()),
    };
    assert_eq!(properties(&spec, "ReplayOutcome"), fields_of(&outcome));
    let divergence = warren_types::Divergence {
        step: Some(1),
        seq: 1,
        kind: "exec".into(),
        expected: outcome.clone(),
        got: outcome,
    };
    assert_eq!(properties(&spec, "Divergence"), fields_of(&divergence));
    let report = warren_types::ReviveReport {
        sandbox: info,
        revived_from: String::new(),
        replayed: 0,
        steps_replayed: 0,
        skipped: 0,
        last_step: None,
        divergences: 0,
        first_divergence: Some(divergence),
        stopped: false,
        duration_ms: 0.0,
        recorded_ms: 0.0,
    };
    assert_eq!(properties(&spec, "ReviveReport"), fields_of(&report));
    let terminal = warren_types::TerminalOutcome {
        chunks: vec![],
        ended: true,
        exit_code: Some(0),
        signal: Some(1),
    };
    assert_eq!(properties(&spec, "TerminalOutcome"), fields_of(&terminal));
}
