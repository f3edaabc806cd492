//! The same Dockerfile and context built by Warren and by `podman build` on this machine
//! give the same file tree (paths, kinds, modes, owners, contents, symlink targets) and the
//! same env, cmd, entrypoint, user and working directory. Podman's base is the node's own
//! default image (a tar of its layer, `podman import`ed), so no registry is needed. The
//! podman-built image, saved as an archive and imported, runs its sandboxes' commands with
//! its env, working directory and user, and holds the same tree.

use super::{build, podman, result_of, write};
use crate::common::{self, image_store, Daemon};
use crate::layers;
use std::process::Command;

const DOCKERFILE: &str = r#"ARG BASE=default
FROM ${BASE}
ENV LANG=C.UTF-8 TOOL_HOME=/opt/tool
RUN useradd -m -u 1500 runner && mkdir -p /opt/tool/bin \
 && printf '#!/bin/sh\necho tool\n' > /opt/tool/bin/tool && chmod 0750 /opt/tool/bin/tool \
 && ln -s /opt/tool/bin/tool /usr/local/bin/tool && rm -f /etc/issue.net
COPY --chown=1500:1500 app/ /opt/app/
COPY --chmod=0600 conf/*.ini /etc/tool/
WORKDIR /opt/app
RUN echo "$TOOL_HOME" > where && chmod 0640 where
USER runner
ENTRYPOINT ["/usr/local/bin/tool"]
CMD ["--help"]
"#;

/// What both trees hold under the paths the Dockerfile touched: one line per path.
const DESCRIBE: &str =
    "for p in /opt/tool /opt/app /etc/tool /usr/local/bin/tool /home/runner /etc/issue.net; do \
    [ -e \"$p\" ] || [ -L \"$p\" ] || { echo \"$p absent\"; continue; }; \
    find \"$p\" -printf '%p %y %m %U %G %l\\n'; \
    find \"$p\" -type f -exec sha256sum {} +; done | sort";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warren_and_podman_build_the_same_image() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    if !podman(&["--version"]).0 {
        common::skip("podman is not installed (scripts/setup-test.sh installs it)");
        return;
    }
    let t = layers::scratch("build-podman");
    let ctx = t.path().join("ctx");
    write(&ctx, "Dockerfile", DOCKERFILE);
    write(&ctx, "app/main.py", "print('hi')\n");
    write(&ctx, "app/lib/util.py", "X = 1\n");
    std::os::unix::fs::symlink("lib/util.py", ctx.join("app/util-link.py")).unwrap();
    write(&ctx, "conf/a.ini", "[a]\n");
    write(&ctx, "conf/b.ini", "[b]\n");
    let tag = format!("{}:1", super::unique("vs-podman"));
    let (code, out, err) = build(&d, &[ctx.to_str().unwrap(), "-t", &tag, "--json"]);
    assert_eq!(code, 0, "warren build failed: {out}{err}");
    let _ = result_of(&out);

    // Podman's base: the default image's one layer, as a tar.
    let base = d.client().image("default").await.unwrap();
    assert_eq!(base.layers.len(), 1, "the default image has one layer");
    let hex = base.layers[0]
        .digest
        .trim_start_matches("sha256:")
        .to_string();
    let mnt = image_store().join("mnt").join(&hex);
    assert!(
        mnt.join("etc").is_dir(),
        "the default image's layer is mounted (the build read it)"
    );
    let base_tar = t.path().join("base.tar");
    let st = Command::new("tar")
        .args(["--numeric-owner", "--xattrs", "-C"])
        .arg(&mnt)
        .arg("-cf")
        .arg(&base_tar)
        .arg(".")
        .status()
        .unwrap();
    assert!(st.success());
    let pbase = format!("localhost/warren-test-base-{}:1", std::process::id());
    let pimg = format!("localhost/warren-test-built-{}:1", std::process::id());
    let (ok, o) = podman(&["import", base_tar.to_str().unwrap(), &pbase]);
    assert!(ok, "podman import: {o}");
    let (ok, o) = podman(&[
        "build",
        "--runtime",
        "runc",
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=1024:1024",
        "--network",
        "none",
        "-q",
        "-t",
        &pimg,
        "--build-arg",
        &format!("BASE={pbase}"),
        ctx.to_str().unwrap(),
    ]);
    let archive = t.path().join("podman-built.tar");
    let run_and_save = || {
        if !ok {
            return Err(format!("podman build: {o}"));
        }
        let (ok, tree) = podman(&[
            "run",
            "--rm",
            "--runtime",
            "runc",
            "--ulimit",
            "nofile=1024:1024",
            "--ulimit",
            "nproc=1024:1024",
            "--network",
            "none",
            "--user",
            "root",
            "--entrypoint",
            "/bin/sh",
            &pimg,
            "-c",
            DESCRIBE,
        ]);
        if !ok {
            return Err(format!("podman run: {tree}"));
        }
        let (_, inspect) = podman(&["image", "inspect", &pimg]);
        let (ok, o) = podman(&[
            "save",
            "--format",
            "docker-archive",
            "-o",
            archive.to_str().unwrap(),
            &pimg,
        ]);
        if !ok {
            return Err(format!("podman save: {o}"));
        }
        Ok((tree, inspect))
    };
    let saved = run_and_save();
    let _ = podman(&["rmi", "-f", &pimg, &pbase]);
    let (podman_tree, inspect) = saved.unwrap();

    let id = d
        .create(&warren_client::CreateSandboxRequest {
            image: warren_client::ImageRef::Stack(vec![tag.clone()]),
            user: Some("root".into()),
            ..Default::default()
        })
        .await
        .id;
    let warren_tree = d.sh_ok(&id, DESCRIBE).await;
    assert_eq!(warren_tree, podman_tree, "the two builds' trees differ");

    let pc: serde_json::Value =
        serde_json::from_str::<serde_json::Value>(&inspect).unwrap()[0]["Config"].clone();
    let wc = d.client().image(&tag).await.unwrap().config.unwrap();
    let strings = |v: &serde_json::Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut penv = strings(&pc["Env"]);
    penv.retain(|e| !e.starts_with("PATH=") && !e.starts_with("container="));
    assert_eq!(wc.env, penv, "env");
    assert_eq!(wc.cmd.unwrap_or_default(), strings(&pc["Cmd"]), "cmd");
    assert_eq!(
        wc.entrypoint.unwrap_or_default(),
        strings(&pc["Entrypoint"]),
        "entrypoint"
    );
    assert_eq!(wc.user.as_deref(), pc["User"].as_str(), "user");
    assert_eq!(
        wc.working_dir.as_deref(),
        pc["WorkingDir"].as_str(),
        "working dir"
    );
    d.client().delete(&id).await.unwrap();
    d.client().delete_image(&tag).await.unwrap();

    // Podman's image imported: its sandboxes' commands run as its user, in its directory,
    // with its env; its tree is the same.
    let imported = format!("{}:1", super::unique("podman-built"));
    let st = Command::new(common::bin_dir().join("warren"))
        .args(["image", "import"])
        .arg(&archive)
        .args(["--tag", &imported, "--store"])
        .arg(image_store())
        .status()
        .unwrap();
    assert!(st.success(), "importing podman's archive");
    let c = d.client().image(&imported).await.unwrap().config.unwrap();
    assert_eq!(c.user.as_deref(), Some("runner"));
    let id = d.create(&super::image(&imported)).await.id;
    assert_eq!(
        d.sh_ok(&id, "echo $TOOL_HOME $LANG; pwd; id -un; ls where")
            .await,
        "/opt/tool C.UTF-8\n/opt/app\nrunner\nwhere\n"
    );
    let r = d
        .exec(
            &id,
            &warren_client::ExecRequest {
                shell: Some(DESCRIBE.into()),
                user: Some("root".into()),
                ..Default::default()
            },
        )
        .await;
    assert_eq!(
        r.stdout, podman_tree,
        "the imported image's tree differs: {}",
        r.stderr
    );
    d.client().delete(&id).await.unwrap();
    d.client().delete_image(&imported).await.unwrap();
}
