//! `deploy/` stays true: the systemd units pass `systemd-analyze verify`, every variable they
//! use is set in their environment file, the Kubernetes manifests parse with the kinds and
//! privileges a cluster needs, and every flag either names exists in the `--help` of the
//! binary it is given to (warrend, warren-gateway, etcd). Needs no root; needs the built
//! binaries (`$WARREN_BIN_DIR`). Under `CI=true` a missing tool fails the test.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    here.canonicalize().unwrap_or(here)
}

fn bin_dir() -> PathBuf {
    match std::env::var_os("WARREN_BIN_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => repo().join("target/release"),
    }
}

/// Says why the test cannot run: a failure under `CI=true`, a printed skip otherwise.
fn cannot_run(why: &str) {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("cannot run under CI: {why}");
    }
    println!("SKIP: {why}");
}

/// The long flags a binary's `--help` lists.
fn help_flags(bin: &Path) -> Option<BTreeSet<String>> {
    let out = Command::new(bin).arg("--help").output().ok()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Some(flags_in(&text))
}

/// Every `--flag` in a text (up to `=`, whitespace or punctuation).
fn flags_in(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let b = text.as_bytes();
    let mut i = 0;
    while i + 2 < b.len() {
        let starts = b[i] == b'-'
            && b[i + 1] == b'-'
            && b[i + 2].is_ascii_alphabetic()
            && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'-'));
        if starts {
            let mut j = i + 2;
            while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'-') {
                j += 1;
            }
            out.insert(text[i..j].to_string());
            i = j;
        } else {
            i += 1;
        }
    }
    out
}

/// The binaries to check flags against, by the name a unit or manifest runs.
fn known_flags() -> Option<BTreeMap<&'static str, BTreeSet<String>>> {
    let mut m = BTreeMap::new();
    for name in ["warrend", "warren-gateway"] {
        let p = bin_dir().join(name);
        match help_flags(&p) {
            Some(f) if f.contains("--help") => {
                m.insert(name, f);
            }
            _ => {
                cannot_run(&format!(
                    "{} is missing or does not answer --help; build with `cargo build --release \
                     --workspace --bins` or set WARREN_BIN_DIR",
                    p.display()
                ));
                return None;
            }
        }
    }
    Some(m)
}

fn check_flags(known: &BTreeMap<&str, BTreeSet<String>>, bin: &str, text: &str, whose: &str) {
    let flags = &known[bin];
    let used = flags_in(text);
    assert!(!used.is_empty(), "{whose}: no flags found for {bin}");
    for f in used {
        assert!(
            flags.contains(&f),
            "{whose} gives {bin} the flag {f}, which its --help does not list"
        );
    }
}

/// `KEY=value` lines of an environment file.
fn env_file(path: &Path) -> BTreeMap<String, String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (k, v) = l
                .split_once('=')
                .unwrap_or_else(|| panic!("{}: bad line {l:?}", path.display()));
            (k.to_string(), v.to_string())
        })
        .collect()
}

/// `${VAR}` and `$VAR` references in a text.
fn vars_in(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find('$') {
        rest = &rest[i + 1..];
        let name: String = rest
            .trim_start_matches(['{', '('])
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() && name.chars().next().is_some_and(|c| c.is_ascii_uppercase()) {
            out.insert(name);
        }
    }
    out
}

/// The `ExecStart=` command of a unit, continuation lines joined.
fn exec_start(unit: &str) -> String {
    let joined = unit.replace("\\\n", " ");
    joined
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("a unit has ExecStart")
        .to_string()
}

#[test]
fn systemd_units() {
    let dir = repo().join("deploy/systemd");
    let Some(known) = known_flags() else { return };
    for (unit, bin, env) in [
        ("warrend.service", "warrend", "warrend.env"),
        (
            "warren-gateway.service",
            "warren-gateway",
            "warren-gateway.env",
        ),
    ] {
        let text = std::fs::read_to_string(dir.join(unit)).unwrap();
        let cmd = exec_start(&text);
        assert!(
            cmd.starts_with(&format!("/usr/local/bin/{bin} ")),
            "{unit}: {cmd}"
        );
        check_flags(&known, bin, &cmd, unit);
        assert!(
            text.contains(&format!("EnvironmentFile=/etc/warren/{env}")),
            "{unit}"
        );
        let vars = env_file(&dir.join(env));
        for v in vars_in(&cmd) {
            assert!(
                vars.contains_key(&v),
                "{unit} uses ${v}, which {env} does not set"
            );
        }
        for v in vars.keys() {
            assert!(
                vars_in(&cmd).contains(v),
                "{env} sets {v}, which {unit} does not use"
            );
        }
    }

    // systemd-analyze checks the units' syntax; the binaries are looked for at their
    // ExecStart path, so verify copies that point at the built ones.
    let Ok(out) = Command::new("systemd-analyze").arg("--version").output() else {
        return cannot_run("systemd-analyze is not installed (scripts/setup.sh installs systemd)");
    };
    assert!(out.status.success());
    let tmp = tempfile::tempdir().unwrap();
    let mut units = Vec::new();
    for unit in ["warrend.service", "warren-gateway.service"] {
        let text = std::fs::read_to_string(dir.join(unit))
            .unwrap()
            .replace("/usr/local/bin/", &format!("{}/", bin_dir().display()));
        let p = tmp.path().join(unit);
        std::fs::write(&p, text).unwrap();
        units.push(p);
    }
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .args(&units)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Only complaints about our units count (the host's own units may have warnings).
    let ours: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("warrend.service") || l.contains("warren-gateway.service"))
        .collect();
    assert!(
        out.status.success() && ours.is_empty(),
        "systemd-analyze verify: {stderr}"
    );
}

fn yaml_docs(path: &Path) -> Vec<serde_yaml::Value> {
    let text = std::fs::read_to_string(path).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| {
            <serde_yaml::Value as serde::Deserialize>::deserialize(d)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        })
        .filter(|v| !v.is_null())
        .collect()
}

fn s<'a>(v: &'a serde_yaml::Value, path: &[&str]) -> &'a serde_yaml::Value {
    path.iter().fold(v, |v, k| &v[*k])
}

/// The command and args of a container, as one text.
fn container_command(c: &serde_yaml::Value) -> String {
    let mut parts = Vec::new();
    for key in ["command", "args"] {
        if let Some(seq) = c[key].as_sequence() {
            parts.extend(seq.iter().filter_map(|x| x.as_str().map(str::to_string)));
        }
    }
    parts.join(" ")
}

#[test]
fn kubernetes_manifests() {
    let dir = repo().join("deploy/kubernetes");
    let Some(known) = known_flags() else { return };
    let mut by_kind: BTreeMap<String, Vec<serde_yaml::Value>> = BTreeMap::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty());
    for f in &files {
        for doc in yaml_docs(f) {
            let kind = doc["kind"]
                .as_str()
                .unwrap_or_else(|| panic!("{}: a document without kind", f.display()));
            assert!(
                doc["apiVersion"].as_str().is_some(),
                "{}: {kind} has no apiVersion",
                f.display()
            );
            assert!(
                s(&doc, &["metadata", "name"]).as_str().is_some(),
                "{}: {kind} has no name",
                f.display()
            );
            by_kind.entry(kind.to_string()).or_default().push(doc);
        }
    }
    for kind in [
        "Namespace",
        "ConfigMap",
        "Service",
        "StatefulSet",
        "DaemonSet",
        "Deployment",
    ] {
        assert!(
            by_kind.contains_key(kind),
            "no {kind} in deploy/kubernetes: {:?}",
            by_kind.keys()
        );
    }
    let config = &by_kind["ConfigMap"][0]["data"];

    // warrend: privileged, in the host's PID namespace, with the host paths it works in.
    let ds = &by_kind["DaemonSet"][0];
    let pod = s(ds, &["spec", "template", "spec"]);
    assert_eq!(
        pod["hostPID"].as_bool(),
        Some(true),
        "warrend needs hostPID"
    );
    let c = &pod["containers"][0];
    assert_eq!(
        s(c, &["securityContext", "privileged"]).as_bool(),
        Some(true)
    );
    let host_paths: BTreeSet<&str> = pod["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(|v| s(v, &["hostPath", "path"]).as_str())
        .collect();
    for p in [
        "/var/lib/warren",
        "/sys/fs/cgroup",
        "/run/warren",
        "/var/cache/warren",
    ] {
        assert!(
            host_paths.contains(p),
            "the DaemonSet does not mount the host's {p}"
        );
    }
    let cmd = container_command(c);
    assert!(cmd.contains("/usr/local/bin/warrend"), "{cmd}");
    check_flags(&known, "warrend", &cmd, "warrend.yaml");
    for v in vars_in(&cmd) {
        if cmd.contains(&format!("{v}=")) {
            continue; // set by the script itself
        }
        let from_env = c["env"]
            .as_sequence()
            .is_some_and(|e| e.iter().any(|x| x["name"].as_str() == Some(v.as_str())));
        assert!(
            from_env || !config[v.as_str()].is_null(),
            "warrend.yaml uses ${v}, set nowhere"
        );
    }

    // The gateways: a Deployment behind a Service.
    let dep = &by_kind["Deployment"][0];
    let c = s(dep, &["spec", "template", "spec", "containers"])[0].clone();
    let cmd = container_command(&c);
    assert!(cmd.contains("/usr/local/bin/warren-gateway"), "{cmd}");
    check_flags(&known, "warren-gateway", &cmd, "warren-gateway.yaml");
    for v in vars_in(&cmd) {
        assert!(
            !config[v.as_str()].is_null(),
            "warren-gateway.yaml uses ${v}, not in the ConfigMap"
        );
    }
    let selector = s(dep, &["spec", "selector", "matchLabels"]);
    assert!(
        by_kind["Service"]
            .iter()
            .any(|svc| &svc["spec"]["selector"] == selector),
        "no Service selects the gateways"
    );

    // etcd: 3 members, flags this etcd knows.
    let sts = &by_kind["StatefulSet"][0];
    assert_eq!(s(sts, &["spec", "replicas"]).as_u64(), Some(3));
    let c = &s(sts, &["spec", "template", "spec", "containers"])[0];
    let cmd = container_command(c);
    match help_flags(Path::new("/usr/bin/etcd")) {
        Some(etcd_flags) => {
            for f in flags_in(&cmd) {
                assert!(
                    etcd_flags.contains(&f),
                    "etcd.yaml gives etcd {f}, which etcd --help does not list"
                );
            }
        }
        None => cannot_run("/usr/bin/etcd is missing (scripts/setup.sh installs etcd-server)"),
    }
}

#[test]
fn helpers_read_flags_and_variables() {
    assert_eq!(
        flags_in("exec a --node \"$N\" --listen=x -x --vm-dir\n  --etcd, a--b"),
        ["--etcd", "--listen", "--node", "--vm-dir"]
            .map(String::from)
            .into()
    );
    assert_eq!(
        vars_in("--a ${WARREN_X} $WARREN_Y \"$HOST_IP:$PORT\" $(POD) $lower"),
        ["HOST_IP", "POD", "PORT", "WARREN_X", "WARREN_Y"]
            .map(String::from)
            .into()
    );
}
