//! Resolving a user spec (`name` or `uid[:gid]`) against the sandbox's /etc/passwd.

pub struct User {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    pub home: String,
    pub name: String,
}

pub fn resolve(spec: Option<&str>) -> Result<User, String> {
    let spec = spec.unwrap_or("root");
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let entries: Vec<Vec<&str>> = passwd
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .filter(|f| f.len() >= 7)
        .collect();
    let (uid, gid_override) = match spec.split_once(':') {
        Some((u, g)) => (
            u.parse::<u32>()
                .map_err(|_| format!("bad uid in {spec:?}"))?,
            Some(
                g.parse::<u32>()
                    .map_err(|_| format!("bad gid in {spec:?}"))?,
            ),
        ),
        None => match spec.parse::<u32>() {
            Ok(u) => (u, None),
            Err(_) => {
                let e = entries
                    .iter()
                    .find(|f| f[0] == spec)
                    .ok_or_else(|| format!("no user {spec:?} in the sandbox's /etc/passwd"))?;
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
    let mut groups = vec![gid];
    if !name.is_empty() {
        let group = std::fs::read_to_string("/etc/group").unwrap_or_default();
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
