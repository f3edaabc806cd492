//! Overwriting the image's shell: the change stays in the sandbox's own writable layer; the
//! neighbour, later sandboxes and the image are untouched, and the agent still runs commands
//! by argv.

use warren_client::ExecRequest;

use crate::Scene;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overwriting_the_shell_stays_in_the_writable_layer() {
    let Some(s) = Scene::new().await else { return };
    let original =
        s.d.sh_ok(&s.b, "sha256sum /bin/sh /usr/bin/python3 | cut -c1-64")
            .await;
    // Replace /bin/sh (and its target) and python with a program that prints a forged answer.
    let attack = "sh_path=$(readlink -f /bin/sh); \
         printf '#!/bin/bash\\necho FORGED\\n' > /tmp/fake && chmod +x /tmp/fake && \
         cp --remove-destination /tmp/fake \"$sh_path\" && \
         cp --remove-destination /tmp/fake \"$(readlink -f /usr/bin/python3)\" && echo replaced";
    let r =
        s.d.exec(&s.a, &ExecRequest::argv(["bash", "-c", attack]))
            .await;
    assert!(
        r.stdout.contains("replaced"),
        "the overwrite itself failed: {r:?}"
    );
    // Inside the attacker sandbox the change is real (its own layer)...
    let r =
        s.d.exec(&s.a, &ExecRequest::argv(["/bin/sh", "-c", "echo real"]))
            .await;
    assert_eq!(
        r.stdout.trim(),
        "FORGED",
        "the sandbox's own overwrite did not apply"
    );
    // ...but the agent still runs argv commands directly, without any shell.
    let r =
        s.d.exec(&s.a, &ExecRequest::argv(["/usr/bin/env", "echo", "direct"]))
            .await;
    assert_eq!(r.stdout.trim(), "direct");
    // The neighbour and a sandbox created afterwards see the image's files.
    let after_b =
        s.d.sh_ok(&s.b, "sha256sum /bin/sh /usr/bin/python3 | cut -c1-64")
            .await;
    assert_eq!(original, after_b, "the neighbour's shell changed");
    let c = s.d.sandbox().await;
    let fresh =
        s.d.sh_ok(&c, "sha256sum /bin/sh /usr/bin/python3 | cut -c1-64")
            .await;
    assert_eq!(original, fresh, "a new sandbox got the overwritten shell");
    assert_eq!(s.d.sh_ok(&c, "echo ok").await.trim(), "ok");
    // The image's layers are read-only mounts on the host (nothing to write through).
    let r =
        s.d.exec(&s.a, &ExecRequest::argv(["touch", "/usr/lib/os-release.x"]))
            .await;
    assert!(r.success(), "the sandbox cannot write its own layer: {r:?}");
    let c2 = s.d.sandbox().await;
    let seen = s.d.sh(&c2, "test -e /usr/lib/os-release.x").await;
    assert_eq!(
        seen.exit_code,
        Some(1),
        "a write reached the shared image: {r:?}"
    );
    s.assert_unaffected().await;
}
