//! Resolving a user spec (`name` or `uid[:gid]`) against the sandbox's /etc/passwd.
//!
//! As docker and podman do: no user named means uid 0, gid 0, whether or not the image has an
//! /etc/passwd; a numeric `uid[:gid]` never needs the file; only names are looked up.

pub struct User {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    pub home: String,
    pub name: String,
}

use crate::error::AgentError;

/// Resolves `spec` against the sandbox's /etc/passwd and /etc/group.
pub fn resolve(spec: Option<&str>) -> Result<User, AgentError> {
    resolve_at(std::path::Path::new("/"), spec)
}

/// [`resolve`] against the files of the tree at `root` (missing files count as empty).
fn resolve_at(root: &std::path::Path, spec: Option<&str>) -> Result<User, AgentError> {
    let read = |f: &str| std::fs::read_to_string(root.join(f)).unwrap_or_default();
    resolve_in(spec, &read("etc/passwd"), &read("etc/group"))
}

/// [`resolve`] against the given contents of /etc/passwd and /etc/group (empty when absent).
fn resolve_in(spec: Option<&str>, passwd: &str, group: &str) -> Result<User, AgentError> {
    let spec = spec.unwrap_or("0");
    let entries: Vec<Vec<&str>> = passwd
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .filter(|f| f.len() >= 7)
        .collect();
    let (uid, gid_override) = match spec.split_once(':') {
        Some((u, g)) => (
            u.parse::<u32>()
                .map_err(|_| AgentError::Invalid(format!("bad uid in {spec:?}")))?,
            Some(
                g.parse::<u32>()
                    .map_err(|_| AgentError::Invalid(format!("bad gid in {spec:?}")))?,
            ),
        ),
        None => match spec.parse::<u32>() {
            Ok(u) => (u, None),
            Err(_) => {
                let e = entries.iter().find(|f| f[0] == spec).ok_or_else(|| {
                    AgentError::Invalid(format!("no user {spec:?} in the sandbox's /etc/passwd"))
                })?;
                (e[2].parse().unwrap_or(65534), None)
            }
        },
    };
    let entry = entries
        .iter()
        .find(|f| f[2].parse::<u32>().ok() == Some(uid));
    let name = entry.map(|f| f[0].to_string()).unwrap_or_default();
    let gid = gid_override
        .or_else(|| entry.and_then(|f| f[3].parse().ok()))
        .unwrap_or(uid);
    let home = entry
        .map(|f| f[5].to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| if uid == 0 { "/root".into() } else { "/".into() });
    let name = if name.is_empty() && uid == 0 {
        "root".to_string()
    } else {
        name
    };
    let mut groups = vec![gid];
    if !name.is_empty() {
        for l in group.lines() {
            let f: Vec<&str> = l.split(':').collect();
            if f.len() >= 4 && f[3].split(',').any(|m| m == name) {
                if let Ok(g) = f[2].parse::<u32>() {
                    if !groups.contains(&g) {
                        groups.push(g);
                    }
                }
            }
        }
    }
    Ok(User {
        uid,
        gid,
        groups,
        home,
        name,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\nagent:x:1000:1001::/home/agent:/bin/sh\n";
    const GROUP: &str = "root:x:0:\nagent:x:1001:\ndocker:x:998:agent\n";

    #[test]
    fn no_user_named_is_root_even_without_a_passwd_file() {
        for passwd in ["", PASSWD] {
            let u = resolve_in(None, passwd, "").unwrap();
            assert_eq!((u.uid, u.gid, u.home.as_str()), (0, 0, "/root"));
            assert_eq!(u.name, "root");
        }
    }

    #[test]
    fn numeric_users_never_need_the_file() {
        let u = resolve_in(Some("1234"), "", "").unwrap();
        assert_eq!((u.uid, u.gid, u.home.as_str()), (1234, 1234, "/"));
        let u = resolve_in(Some("1234:55"), "", "").unwrap();
        assert_eq!((u.uid, u.gid, u.groups.as_slice()), (1234, 55, &[55][..]));
        assert!(resolve_in(Some("12x"), "", "").is_err());
        assert!(resolve_in(Some("1:g"), "", "").is_err());
    }

    #[test]
    fn names_are_looked_up() {
        let u = resolve_in(Some("agent"), PASSWD, GROUP).unwrap();
        assert_eq!((u.uid, u.gid, u.home.as_str()), (1000, 1001, "/home/agent"));
        assert_eq!(u.groups, [1001, 998]);
        let e = resolve_in(Some("nobody2"), PASSWD, GROUP).err().unwrap();
        assert_eq!(e.code(), warren_types::ErrorCode::InvalidRequest);
        assert!(e.to_string().contains("no user \"nobody2\""), "{e}");
        assert!(resolve_in(Some("root"), "", "").is_err());
    }

    #[test]
    fn the_files_are_read_under_the_given_root() {
        let d = tempfile::tempdir().unwrap();
        // No /etc at all: names fail, numbers and the default work.
        assert!(resolve_at(d.path(), Some("agent")).is_err());
        assert_eq!(resolve_at(d.path(), Some("7")).unwrap().uid, 7);
        std::fs::create_dir(d.path().join("etc")).unwrap();
        let passwd = format!("{PASSWD}broken:x:5\n# comment\nsvc:x:999:999::/srv:/bin/false\n");
        std::fs::write(d.path().join("etc/passwd"), passwd).unwrap();
        std::fs::write(d.path().join("etc/group"), GROUP).unwrap();
        let u = resolve_at(d.path(), Some("agent")).unwrap();
        assert_eq!((u.uid, u.gid, u.name.as_str()), (1000, 1001, "agent"));
        assert_eq!(u.groups, [1001, 998]);
        // A uid that has an entry takes its name, home and group from it.
        let u = resolve_at(d.path(), Some("999")).unwrap();
        assert_eq!(
            (u.name.as_str(), u.home.as_str(), u.gid),
            ("svc", "/srv", 999)
        );
        // A gid given overrides the entry's; the supplementary groups still follow the name.
        let u = resolve_at(d.path(), Some("1000:5")).unwrap();
        assert_eq!((u.gid, u.groups.as_slice()), (5, &[5, 998][..]));
        // Short lines are no users.
        assert!(resolve_at(d.path(), Some("broken")).is_err());
    }
}
