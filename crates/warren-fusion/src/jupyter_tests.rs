use super::*;
use warren_types::CallFileResult;

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

fn plan(body: &str) -> (JupyterPlan, CallRequest) {
    JupyterPlan::new(&parse_jupyter(body.as_bytes()).unwrap()).unwrap()
}

fn file(path: &str, content: Option<&str>) -> CallFileResult {
    CallFileResult {
        path: path.into(),
        content: content.map(b64).unwrap_or_default(),
        encoding: OutputEncoding::Base64,
        size: content.map(|c| c.len() as u64).unwrap_or(0),
        truncated: false,
        error: content.is_none().then(|| "not found".into()),
    }
}

fn result(exit: Option<i32>, timed_out: bool, files: Vec<CallFileResult>) -> CallResult {
    CallResult {
        exit_code: exit,
        timed_out,
        stdout: b64(""),
        stderr: b64("boom"),
        encoding: OutputEncoding::Base64,
        files,
        duration_ms: 30.0,
        queued_ms: 10.0,
        ..Default::default()
    }
}

const TWO_CELLS: &str = r#"{"cells": [{"stdout": "1\n", "stderr": "", "display": [],
    "error": []}, {"stdout": "", "stderr": "", "display": [{"text/plain": "2"}],
    "error": []}], "timed_out": false}"#;

#[test]
fn cells_are_one_call_of_the_driver_on_the_warm_interpreter() {
    let (p, c) = plan(
        r#"{"cells": ["print(1)", "2"], "cell_timeout": 2, "total_timeout": 9,
            "kernel": "python3", "files": {"in.txt": "aGk=", "skip": null},
            "fetch_files": ["out.txt", "gone"], "unknown": 1}"#,
    );
    assert_eq!(
        c.argv.as_deref().unwrap(),
        ["python3", "/tmp/.warren-fusion/jupyter.py"]
    );
    assert_eq!(c.interpreter.as_deref(), Some("python3"));
    assert_eq!(c.timeout_secs, Some(9.0 + SLACK_SECS));
    let paths: Vec<&str> = c.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "/tmp/.warren-fusion/jupyter.py",
            "/tmp/.warren-fusion/cells.json",
            "/tmp/code/in.txt"
        ]
    );
    let spec: serde_json::Value = serde_json::from_str(&c.files[1].content).unwrap();
    assert_eq!(
        spec,
        serde_json::json!({"cells": ["print(1)", "2"], "cell_timeout": 2.0})
    );
    assert_eq!(
        c.return_files,
        [
            "/tmp/.warren-fusion/cells.out.json",
            "/tmp/code/out.txt",
            "/tmp/code/gone"
        ]
    );

    let r = result(
        Some(0),
        false,
        vec![
            file("/tmp/.warren-fusion/cells.out.json", Some(TWO_CELLS)),
            file("/tmp/code/out.txt", Some("x")),
            file("/tmp/code/gone", None),
        ],
    );
    let a = p.answer(&r, Some("n1"));
    assert_eq!(a.status, RunStatus::Success, "{a:?}");
    assert_eq!(a.cells.len(), 2);
    assert_eq!(a.cells[0].stdout, "1\n");
    assert_eq!(a.cells[1].display[0]["text/plain"], "2");
    let d = a.driver.unwrap();
    assert_eq!(
        (d.status, d.return_code, d.execution_time),
        (CommandRunStatus::Finished, Some(0), Some(0.02))
    );
    assert_eq!(a.executor_pod_name.as_deref(), Some("n1"));
    assert_eq!(a.files.keys().collect::<Vec<_>>(), ["out.txt"]);
}

#[test]
fn timeouts_fail_with_the_cells_that_ended() {
    let (p, _) = plan(r#"{"cells": ["1", "while True: pass"], "cell_timeout": 1}"#);
    let cell_tle = r#"{"cells": [{"stdout": "", "stderr": "", "display": [], "error": [{"ename":
        "TimeoutError", "evalue": "", "traceback": []}]}], "timed_out": true}"#;
    let a = p.answer(
        &result(
            Some(0),
            false,
            vec![file("/tmp/.warren-fusion/cells.out.json", Some(cell_tle))],
        ),
        None,
    );
    assert_eq!(a.status, RunStatus::Failed);
    assert_eq!(
        a.driver.as_ref().unwrap().status,
        CommandRunStatus::TimeLimitExceeded
    );
    assert_eq!(a.cells.len(), 1);
    assert!(a.message.contains("1 s"), "{}", a.message);

    // The call's own deadline (total_timeout): the record so far, or none.
    let a = p.answer(&result(None, true, vec![file("x", None)]), None);
    assert_eq!(a.status, RunStatus::Failed);
    assert!(a.cells.is_empty());
    assert_eq!(a.driver.unwrap().return_code, None);
}

#[test]
fn a_dead_interpreter_fails_and_a_broken_record_is_a_sandbox_error() {
    let (p, _) = plan(r#"{"cells": ["import os; os._exit(3)"]}"#);
    let a = p.answer(&result(Some(3), false, vec![file("x", None)]), None);
    assert_eq!(a.status, RunStatus::Failed);
    assert_eq!(a.driver.as_ref().unwrap().return_code, Some(3));
    assert!(a.message.contains("boom"), "{}", a.message);

    let a = p.answer(
        &result(Some(0), false, vec![file("x", Some("{not json"))]),
        None,
    );
    assert_eq!(a.status, RunStatus::SandboxError);
    let mut big = file("x", Some(TWO_CELLS));
    big.truncated = true;
    let a = p.answer(&result(Some(0), false, vec![big]), None);
    assert_eq!(a.status, RunStatus::SandboxError);
    assert!(a.message.contains("larger"), "{}", a.message);
}

#[test]
fn refuses_in_the_protocols_shape() {
    for (body, loc) in [
        (&br#"{"cell_timeout": 1}"#[..], "body"),
        (br#"{"cells": ["1"], "kernel": "ruby"}"#, "kernel"),
        (br#"{"cells": ["1"], "cell_timeout": -1}"#, "cell_timeout"),
        (br#"{"cells": ["1"], "total_timeout": 0}"#, "total_timeout"),
        (br#"{"cells": "1"}"#, "body"),
        (b"  ", "body"),
    ] {
        let e = parse_jupyter(body).unwrap_err();
        assert_eq!(e.status(), 422, "{e}");
        let v: serde_json::Value = serde_json::from_slice(&e.body()).unwrap();
        let l = v["detail"][0]["loc"].as_array().unwrap();
        assert_eq!(l.last().unwrap(), loc, "{v}");
    }
    // What the client package sends by default.
    let r = parse_jupyter(
        br#"{"cells": ["a = 1"], "cell_timeout": 0.0, "total_timeout": 45.0,
             "kernel": "python3", "files": {}, "fetch_files": []}"#,
    )
    .unwrap();
    assert_eq!((r.cell_timeout, r.total_timeout), (0.0, 45.0));
}
