//! The install scripts as a newcomer meets them: the README's commands work as root without
//! sudo, hosts are recognised (or told what to do), a node installs only what a node needs,
//! and the service unit is what docs/operations.md says. No daemon, no package is installed.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The words of the bash array `name=( ... )` in `script`, comments dropped.
fn array(script: &str, name: &str) -> Vec<String> {
    let start = script
        .find(&format!("{name}=("))
        .unwrap_or_else(|| panic!("no {name} array"));
    let body = &script[start + name.len() + 2..];
    let body = &body[..body.find("\n)").expect("array end")];
    body.lines()
        .map(|l| l.split('#').next().unwrap_or(""))
        .flat_map(|l| l.split_whitespace().map(str::to_string))
        .collect()
}

#[test]
fn readme_install_commands_need_no_sudo() {
    let readme = read("README.md");
    let quick = &readme[readme.find("## Quick start").unwrap()..readme.find("## CLI").unwrap()];
    assert!(quick.contains("./scripts/up.sh") && quick.contains("./scripts/test.sh"));
    assert!(!quick.contains("sudo ./scripts"), "{quick}");
    for s in [
        "up.sh",
        "test.sh",
        "setup.sh",
        "setup-test.sh",
        "install-service.sh",
        "lib.sh",
    ] {
        let text = read(&format!("scripts/{s}"));
        for line in text.lines().filter(|l| !l.trim_start().starts_with('#')) {
            // `sudo` as a command: first word, or after `;`, `&&`, `||`, `|`, `(`.
            let runs = line
                .split([';', '&', '|', '('])
                .any(|part| part.split_whitespace().next() == Some("sudo"));
            assert!(!runs, "scripts/{s} runs sudo: {line}");
        }
    }
}

/// `detect_os` from scripts/lib.sh against a fake /etc/os-release.
fn detect(os_release: &str) -> std::process::Output {
    let t = tempfile::tempdir().unwrap();
    let f = t.path().join("os-release");
    std::fs::write(&f, os_release).unwrap();
    Command::new("bash")
        .arg("-c")
        .arg(format!(
            ". scripts/lib.sh; OS_RELEASE_FILE={} detect_os; echo \"$OS_ID $OS_VERSION\"",
            f.display()
        ))
        .current_dir(repo())
        .env_remove("WARREN_ANY_OS")
        .output()
        .unwrap()
}

#[test]
fn supported_hosts_are_recognised_and_others_told_what_to_do() {
    for (text, want) in [
        (
            "ID=debian\nVERSION_ID=\"12\"\nVERSION_CODENAME=bookworm\n",
            "debian 12",
        ),
        (
            "ID=debian\nVERSION_ID=\"13\"\nVERSION_CODENAME=trixie\n",
            "debian 13",
        ),
        (
            "ID=ubuntu\nVERSION_ID=\"22.04\"\nVERSION_CODENAME=jammy\n",
            "ubuntu 22.04",
        ),
        (
            "ID=ubuntu\nVERSION_ID=\"24.04\"\nVERSION_CODENAME=noble\n",
            "ubuntu 24.04",
        ),
    ] {
        let out = detect(text);
        assert!(out.status.success(), "{want}: {out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), want);
    }
    let out = detect("ID=fedora\nVERSION_ID=40\n");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("fedora 40") && err.contains("Ubuntu 24.04"),
        "{err}"
    );
    assert!(err.contains("erofs-utils"), "names what to install: {err}");
}

#[test]
fn a_node_installs_only_what_a_node_needs() {
    let node = array(&read("scripts/setup.sh"), "PACKAGES");
    let test = array(&read("scripts/setup-test.sh"), "TEST_PACKAGES");
    for only_tests in [
        "podman",
        "runc",
        "crun",
        "bubblewrap",
        "docker-registry",
        "etcd-server",
        "busybox-static",
    ] {
        assert!(
            !node.iter().any(|p| p == only_tests),
            "setup.sh installs {only_tests}"
        );
        assert!(
            test.iter().any(|p| p == only_tests),
            "setup-test.sh lacks {only_tests}"
        );
    }
    for needed in [
        "erofs-utils",
        "nftables",
        "fuse3",
        "debootstrap",
        "protobuf-compiler",
    ] {
        assert!(node.iter().any(|p| p == needed), "setup.sh lacks {needed}");
    }
    let test_sh = read("scripts/test.sh");
    assert!(test_sh.contains("scripts/setup-test.sh"));
    // bookworm-backports only where it exists.
    let setup: String = read("scripts/setup.sh")
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    let backports = setup.find("bookworm-backports").unwrap();
    let guard = setup[..backports]
        .rfind("if [[ \"$OS_VERSION\" == 12 ]]")
        .unwrap();
    assert!(
        backports - guard < 400,
        "backports outside the Debian 12 branch"
    );
}

#[test]
fn the_service_unit_keeps_sandboxes_and_owns_the_socket_group() {
    let out = Command::new("bash")
        .args(["scripts/install-service.sh", "--dry-run", "--group", "wrn"])
        .current_dir(repo())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("--socket-group wrn"), "{text}");
    assert!(
        text.contains("--network-config /etc/warren/network.toml"),
        "{text}"
    );
    assert!(text.contains("KillMode=process"), "{text}");
    assert!(
        text.contains("EnvironmentFile=-/etc/default/warrend"),
        "{text}"
    );
    assert!(text.contains("/etc/logrotate.d/warren") && text.contains("copytruncate"));
    let ops = read("docs/operations.md");
    for topic in [
        "## As a systemd service",
        "## Upgrading",
        "## Backing up the state",
        "## Logs",
    ] {
        assert!(ops.contains(topic), "docs/operations.md lacks {topic}");
    }
}
