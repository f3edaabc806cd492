use super::*;
use crate::wire::parse;
use warren_types::CallFileResult;

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

fn plan(body: &str) -> (Plan, CallRequest) {
    Plan::new(&parse(body.as_bytes()).unwrap()).unwrap()
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

fn result(exit: Option<i32>, stdout: &str, files: Vec<CallFileResult>) -> CallResult {
    CallResult {
        exit_code: exit,
        stdout: b64(stdout),
        stderr: b64(""),
        encoding: OutputEncoding::Base64,
        files,
        duration_ms: 12.0,
        queued_ms: 2.0,
        ..Default::default()
    }
}

#[test]
fn python_is_one_call_on_the_warm_interpreter() {
    let (p, c) = plan(
        r#"{"code": "print(input())", "language": "python", "stdin": "7", "run_timeout": 3,
            "files": {"data/in.txt": "aGk=", "/abs": "aGk=", "skip": null},
            "fetch_files": ["out.txt", "gone"], "memory_limit_MB": 256}"#,
    );
    assert_eq!(c.argv.as_deref().unwrap(), ["python3", "/tmp/code/main.py"]);
    assert_eq!(c.interpreter.as_deref(), Some("python3"));
    assert_eq!(
        (c.timeout_secs, c.memory_mb, c.disk_mb),
        (Some(3.0), Some(256), Some(256))
    );
    let paths: Vec<&str> = c.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(
        paths,
        ["/tmp/code/main.py", "/abs", "/tmp/code/data/in.txt"]
    );
    assert_eq!(c.return_files, ["/tmp/code/out.txt", "/tmp/code/gone"]);
    let r = result(
        Some(0),
        "7\n",
        vec![
            file("/tmp/code/out.txt", Some("x")),
            file("/tmp/code/gone", None),
        ],
    );
    let a = p.answer(&r, Some("n1"));
    assert_eq!(a.status, RunStatus::Success);
    let run = a.run_result.unwrap();
    assert_eq!(
        (run.status, run.return_code),
        (CommandRunStatus::Finished, Some(0))
    );
    assert_eq!(run.stdout.as_deref(), Some("7\n"));
    assert_eq!(run.execution_time, Some(0.01));
    assert_eq!(a.files.len(), 1);
    assert_eq!(a.files["out.txt"], b64("x"));
    assert_eq!(a.executor_pod_name.as_deref(), Some("n1"));
}

#[test]
fn direct_outcomes() {
    let (p, _) = plan(r#"{"code": "x", "language": "bash"}"#);
    let mut r = result(None, "partial", vec![]);
    r.timed_out = true;
    let a = p.answer(&r, None);
    assert_eq!(a.status, RunStatus::Failed);
    let run = a.run_result.unwrap();
    assert_eq!(
        (run.status, run.return_code),
        (CommandRunStatus::TimeLimitExceeded, None)
    );
    assert_eq!(run.stdout.as_deref(), Some("partial"));
    let mut r = result(None, "", vec![]);
    r.signal = Some(9);
    let a = p.answer(&r, None);
    assert_eq!(
        (a.status, a.run_result.unwrap().return_code),
        (RunStatus::Failed, Some(137))
    );
    let a = p.answer(&result(Some(1), "", vec![]), None);
    assert_eq!(a.status, RunStatus::Failed);
    let a = p.answer(&result(None, "", vec![]), None);
    assert_eq!(a.status, RunStatus::SandboxError);
}

fn records(missing: Option<&str>, compile: Option<&str>, run: Option<&str>) -> Vec<CallFileResult> {
    vec![
        file("missing", missing),
        file("compile.rc", compile),
        file("compile.out", compile.map(|_| "")),
        file("compile.err", compile.map(|_| "main.cpp:1: error")),
        file("run.rc", run),
    ]
}

#[test]
fn compiled_languages_go_through_the_driver() {
    let (p, c) = plan(
        r#"{"code": "int main(){}", "language": "cpp", "compile_timeout": 5, "run_timeout": 2}"#,
    );
    let argv = c.argv.clone().unwrap();
    assert_eq!(
        argv[..5],
        ["/bin/sh", "/tmp/.warren-fusion/driver", "5", "2", "g++"]
    );
    assert!(
        argv[5].starts_with("g++ ") && argv[5].contains("'main.cpp'"),
        "{argv:?}"
    );
    assert_eq!(c.timeout_secs, Some(17.0));
    assert_eq!(c.return_files.len(), 5);

    let ok = p.answer(
        &result(
            Some(0),
            "hi",
            records(None, Some("0 1000000000 2000000000"), Some("0 5 10")),
        ),
        None,
    );
    assert_eq!(ok.status, RunStatus::Success, "{ok:?}");
    assert_eq!(
        ok.compile_result.as_ref().unwrap().execution_time,
        Some(1.0)
    );
    assert_eq!(ok.run_result.unwrap().stdout.as_deref(), Some("hi"));

    let bad = p.answer(
        &result(Some(0), "", records(None, Some("1 0 5"), None)),
        None,
    );
    assert_eq!(bad.status, RunStatus::Failed);
    assert!(bad.run_result.is_none());
    let cr = bad.compile_result.unwrap();
    assert_eq!(cr.return_code, Some(1));
    assert_eq!(cr.stderr.as_deref(), Some("main.cpp:1: error"));

    let tle = p.answer(
        &result(
            Some(0),
            "",
            records(None, Some("0 0 1"), Some("137 0 2000000000")),
        ),
        None,
    );
    assert_eq!(
        tle.run_result.unwrap().status,
        CommandRunStatus::TimeLimitExceeded
    );
    let killed = p.answer(
        &result(Some(0), "", records(None, Some("0 0 1"), Some("137 0 100"))),
        None,
    );
    assert_eq!(killed.run_result.unwrap().return_code, Some(137));

    let none = p.answer(&result(Some(0), "", records(Some("g++"), None, None)), None);
    assert_eq!(none.status, RunStatus::SandboxError);
    assert!(none.message.contains("g++"), "{}", none.message);

    let mut cut = result(None, "", records(None, None, None));
    cut.timed_out = true;
    let a = p.answer(&cut, None);
    assert_eq!(
        a.compile_result.unwrap().status,
        CommandRunStatus::TimeLimitExceeded
    );
}

#[test]
fn languages_not_served_are_sandbox_errors() {
    let e = Plan::new(&parse(br#"{"code": "x", "language": "lean"}"#).unwrap()).unwrap_err();
    assert_eq!(e.status(), 200);
    let v: serde_json::Value = serde_json::from_slice(&e.body()).unwrap();
    assert_eq!(v["status"], "SandboxError");
}

#[test]
fn bad_paths_are_invalid() {
    for files in [r#"{"../../../x": "aGk="}"#, r#"{"a": "!!notbase64"}"#] {
        let body = format!(r#"{{"code": "x", "language": "python", "files": {files}}}"#);
        let e = Plan::new(&parse(body.as_bytes()).unwrap()).unwrap_err();
        assert_eq!(e.status(), 422, "{files}: {e}");
    }
}

#[test]
fn java_files_are_named_after_their_class() {
    let (_, c) = plan(r#"{"code": "public class Sol { }", "language": "java"}"#);
    assert_eq!(c.files[0].path, "/tmp/code/Sol.java");
    assert!(c.argv.unwrap()[6].ends_with(" Sol"));
}

#[test]
fn pytest_args_are_quoted() {
    let (_, c) = plan(r#"{"code": "x", "language": "pytest", "args": ["-k", "a'b; rm"]}"#);
    assert!(c.argv.unwrap()[6].ends_with(r"'-k' 'a'\''b; rm'"));
}
