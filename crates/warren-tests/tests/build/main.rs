//! Image builds from Dockerfiles against a real `warrend` (run as root): every `RUN` in a
//! real sandbox, every step a layer, the cache, the image's configuration applied to its
//! sandboxes (built and imported images alike), a failing step that leaves nothing behind.

mod add;
#[path = "../common/mod.rs"]
mod common;
mod hostile;
#[path = "../../../warren-image/tests/common/mod.rs"]
mod layers;
mod mirror;
mod podman;
mod registry;
mod share;

use common::{bin_dir, image_store, Daemon};
use std::path::Path;
use std::process::Command;
use warren_client::{CreateSandboxRequest, ExecRequest, ImageRef};

/// Runs podman: whether it succeeded, and its stdout and stderr.
fn podman(args: &[&str]) -> (bool, String) {
    common::netslot::run("podman", args)
}

/// A name unique to this test process.
fn unique(what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{what}-{}-{}", std::process::id(), nanos % 100_000)
}

/// `warren image build …` against `d`; (exit code, stdout, stderr).
fn build(d: &Daemon, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(bin_dir().join("warren"))
        .arg("--url")
        .arg(format!("unix://{}", d.socket.display()))
        .args(["image", "build"])
        .args(args)
        .output()
        .expect("running warren image build");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The `result` event of a `--json` build log.
fn result_of(stdout: &str) -> serde_json::Value {
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["type"] == "result")
        .unwrap_or_else(|| panic!("no result event in {stdout}"))
}

fn write(root: &Path, rel: &str, content: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, content).unwrap();
}

fn image(refname: &str) -> CreateSandboxRequest {
    CreateSandboxRequest {
        image: ImageRef::Stack(vec![refname.to_string()]),
        ..Default::default()
    }
}

const DOCKERFILE: &str = r#"# a task environment
ARG BASE=default
FROM ${BASE}
ARG GREETING=hello
ENV GREETING=${GREETING} APP_HOME=/srv/app
RUN useradd -m -u 1234 agent \
 && rm /etc/debian_version \
 && mkdir -p /opt/data && echo "$GREETING from run" > /opt/data/run.txt
WORKDIR $APP_HOME
COPY --chown=agent:agent src/*.py ./
COPY conf/ /etc/app/
USER agent
RUN id -un > /home/agent/whoami.txt && pwd > /home/agent/where.txt
CMD ["python3", "main.py"]
LABEL org.example.task=demo
"#;

/// A task-style Dockerfile: ARG/ENV substitution, a RUN that adds a user and deletes a base
/// file, WORKDIR, COPY with a glob, --chown and .dockerignore, USER non-root. The image's
/// sandboxes see all of it, run as its user in its directory with its environment; a
/// rebuild runs no step; a change to a copied file reruns that step and those after only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dockerfile_steps_become_layers_config_applies_and_rebuilds_are_cached() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let t = layers::scratch("build-ctx");
    let ctx = t.path();
    write(ctx, "Dockerfile", DOCKERFILE);
    write(
        ctx,
        ".dockerignore",
        "# not for the image\nsrc/secret.py\n**/*.log\n",
    );
    write(ctx, "src/main.py", "print('main')\n");
    write(ctx, "src/util.py", "X = 1\n");
    write(ctx, "src/secret.py", "KEY = 'no'\n");
    write(ctx, "conf/app.toml", "debug = false\n");
    write(ctx, "conf/debug.log", "noise\n");
    let tag = format!("{}:1", unique("built"));
    let ctx_s = ctx.to_str().unwrap();
    let (code, out, err) = build(
        &d,
        &[ctx_s, "-t", &tag, "--build-arg", "GREETING=hi", "--json"],
    );
    assert_eq!(code, 0, "build failed: {out}{err}");
    let first = result_of(&out);
    assert_eq!(first["steps_cached"], 0, "{first}");
    // RUN, WORKDIR (a new directory), COPY, COPY, RUN: five layers over the base's.
    assert_eq!(first["steps_run"], 5, "{first}");
    let layers1: Vec<String> = first["image"]["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["digest"].as_str().unwrap().to_string())
        .collect();

    let info = d.client().image(&tag).await.expect("inspect");
    let c = info
        .config
        .clone()
        .expect("the built image has a configuration");
    assert!(c.env.contains(&"GREETING=hi".to_string()), "{c:?}");
    assert!(c.env.contains(&"APP_HOME=/srv/app".to_string()), "{c:?}");
    assert_eq!(c.working_dir.as_deref(), Some("/srv/app"));
    assert_eq!(c.user.as_deref(), Some("agent"));
    assert_eq!(
        c.cmd,
        Some(vec!["python3".to_string(), "main.py".to_string()])
    );
    assert_eq!(
        c.labels.get("org.example.task").map(String::as_str),
        Some("demo")
    );

    let id = d.create(&image(&tag)).await.id;
    let seen = d
        .sh_ok(
            &id,
            "echo $GREETING; pwd; id -un; ls; stat -c '%U %a' main.py; ls /etc/app; \
             cat /opt/data/run.txt /home/agent/whoami.txt /home/agent/where.txt; \
             test -e /etc/debian_version && echo base-file-still-there; echo end",
        )
        .await;
    assert_eq!(
        seen,
        "hi\n/srv/app\nagent\nmain.py\nutil.py\nagent 644\napp.toml\nhi from run\nagent\n/srv/app\nend\n"
    );
    // A call may override the image's user and directory.
    let r = d
        .exec(
            &id,
            &ExecRequest {
                shell: Some("id -un; pwd".into()),
                user: Some("root".into()),
                cwd: Some("/tmp".into()),
                ..Default::default()
            },
        )
        .await;
    assert_eq!(r.stdout, "root\n/tmp\n");
    d.client().delete(&id).await.unwrap();

    // Unchanged: nothing runs, the same layers.
    let (code, out, err) = build(
        &d,
        &[ctx_s, "-t", &tag, "--build-arg", "GREETING=hi", "--json"],
    );
    assert_eq!(code, 0, "rebuild failed: {out}{err}");
    let again = result_of(&out);
    assert_eq!(again["steps_run"], 0, "{again}");
    assert_eq!(again["steps_cached"], 5, "{again}");
    assert_eq!(again["image"]["layers"], first["image"]["layers"]);

    // A copied file changed: its COPY and the RUN after it run again, the rest is cached.
    write(ctx, "conf/app.toml", "debug = true\n");
    let (code, out, err) = build(
        &d,
        &[ctx_s, "-t", &tag, "--build-arg", "GREETING=hi", "--json"],
    );
    assert_eq!(code, 0, "build failed: {out}{err}");
    let changed = result_of(&out);
    assert_eq!(
        (
            changed["steps_run"].as_u64(),
            changed["steps_cached"].as_u64()
        ),
        (Some(2), Some(3)),
        "{changed}"
    );
    let layers3: Vec<String> = changed["image"]["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["digest"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(layers3[..layers3.len() - 2], layers1[..layers1.len() - 2]);
    d.client().delete_image(&tag).await.unwrap();
}

/// A failing RUN: the CLI exits non-zero naming the step, its exit status and the tail of
/// its output; no sandbox, no lease and no scratch file of the build is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_run_reports_the_step_and_leaves_nothing_behind() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let t = layers::scratch("build-fail");
    write(
        t.path(),
        "Dockerfile",
        "FROM default\nRUN echo first > /f\nRUN echo about to fail && echo oops >&2 && exit 3\nRUN echo never\n",
    );
    let tag = format!("{}:1", unique("fails"));
    let (code, out, err) = build(&d, &[t.path().to_str().unwrap(), "-t", &tag]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("Step 3/4 : RUN echo about to fail"), "{err}");
    assert!(err.contains("oops"), "{err}");
    assert!(err.contains("exit status 3"), "{err}");
    assert!(!err.contains("never\n"), "{err}");
    assert!(d.client().image(&tag).await.is_err(), "nothing is tagged");
    assert!(d.list().await.is_empty(), "no sandbox is left");
    let pid = d.pid().expect("daemon pid").to_string();
    let tmp: Vec<String> = std::fs::read_dir(image_store().join("tmp"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(&format!("-{pid}-")))
        .collect();
    assert!(tmp.is_empty(), "scratch files left: {tmp:?}");
    let leases: Vec<String> = std::fs::read_dir(image_store().join("leases"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(&format!("-{pid}-")) || n.contains(&d.node))
        .collect();
    assert!(leases.is_empty(), "leases left: {leases:?}");

    // A Dockerfile that does not parse is refused before anything runs.
    write(t.path(), "Dockerfile", "FROM default\nFROB x\n");
    let (code, _, err) = build(&d, &[t.path().to_str().unwrap(), "-t", &tag]);
    assert_eq!(code, 1);
    assert!(err.contains("line 2") && err.contains("FROB"), "{err}");
}

/// An imported image's ENV, WORKDIR and USER are the defaults of its sandboxes' commands;
/// a create may override each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn imported_image_env_workdir_and_user_apply_to_exec() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let t = layers::scratch("imported-config");
    let layer = layers::tar_entries(&[("work/", ""), ("work/hello.txt", "hello\n")]);
    let archive = t.path().join("img.tar");
    layers::docker_archive_with_config(
        &[layer],
        "x:1",
        &archive,
        serde_json::json!({
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "GREETING=hi"],
            "WorkingDir": "/work",
            "User": "nobody",
            "Cmd": ["cat", "hello.txt"],
        }),
    );
    let tag = format!("{}:1", unique("imported"));
    let st = Command::new(bin_dir().join("warren"))
        .args(["image", "import"])
        .arg(&archive)
        .args(["--tag", &tag, "--store"])
        .arg(image_store())
        .status()
        .unwrap();
    assert!(st.success());
    let info = d.client().image(&tag).await.unwrap();
    let c = info.config.expect("the import kept the configuration");
    assert_eq!(c.working_dir.as_deref(), Some("/work"));
    assert_eq!(
        c.cmd,
        Some(vec!["cat".to_string(), "hello.txt".to_string()])
    );

    let stack = tag.to_string();
    let req = CreateSandboxRequest {
        image: ImageRef::Stack(vec!["default".into(), stack.clone()]),
        ..Default::default()
    };
    let id = d.create(&req).await.id;
    assert_eq!(
        d.sh_ok(&id, "echo $GREETING; pwd; id -un; cat hello.txt")
            .await,
        "hi\n/work\nnobody\nhello\n"
    );
    let mut over = req.clone();
    over.workdir = Some("/".into());
    over.user = Some("root".into());
    over.env.insert("GREETING".into(), "over".into());
    let id2 = d.create(&over).await.id;
    assert_eq!(
        d.sh_ok(&id2, "echo $GREETING; pwd; id -un").await,
        "over\n/\nroot\n"
    );
    for i in [id, id2] {
        d.client().delete(&i).await.unwrap();
    }
    d.client().delete_image(&tag).await.unwrap();
}

/// A context may hold symlinks that aim out of it (the CLI sends them as symlinks): they are
/// followed inside the context only, so a `COPY` through one never reads a file of the node
/// (a Dockerfile that is such a link: warren-build's unit tests).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn context_symlinks_never_reach_the_nodes_files() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let host = layers::scratch("build-host-secret");
    let marker = unique("node-only");
    write(host.path(), "secret", &marker);
    let t = layers::scratch("build-escape");
    std::os::unix::fs::symlink(host.path(), t.path().join("link")).unwrap();
    write(t.path(), "real/secret", "in the context");
    std::os::unix::fs::symlink("real", t.path().join("inner")).unwrap();
    let tag = format!("{}:1", unique("escape"));
    write(
        t.path(),
        "Dockerfile",
        "FROM default\nCOPY link/secret /leaked\n",
    );
    let (code, out, err) = build(&d, &[t.path().to_str().unwrap(), "-t", &tag]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("not in the build context"), "{err}");
    assert!(!format!("{out}{err}").contains(&marker), "{out}{err}");
    assert!(d.client().image(&tag).await.is_err(), "nothing is tagged");
    // A link inside the context is followed there.
    write(
        t.path(),
        "Dockerfile",
        "FROM default\nCOPY inner/secret /copied\n",
    );
    let (code, out, err) = build(&d, &[t.path().to_str().unwrap(), "-t", &tag]);
    assert_eq!(code, 0, "{out}{err}");
    let id = d.create(&image(&tag)).await.id;
    let r = d
        .exec(
            &id,
            &ExecRequest {
                argv: Some(vec!["cat".into(), "/copied".into()]),
                ..Default::default()
            },
        )
        .await;
    d.client().delete(&id).await.unwrap();
    d.client().delete_image(&tag).await.unwrap();
    assert_eq!(r.stdout, "in the context");
}
