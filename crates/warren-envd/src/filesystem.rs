//! The `filesystem.Filesystem` service over Warren's file routes. Watching a directory is
//! done by listing it: the streaming `WatchDir` lists every [`WATCH_PERIOD`], the polling
//! watcher lists at each `GetWatcherEvents`, and the difference between two listings is the
//! events (created, written, removed, mode changed; a rename shows as remove + create).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use warren_types::files::DirPage;
use warren_types::{ExecRequest, ExecResult, FileKind, FileStat, MkdirRequest};

use crate::connect::{self, CallKind, Code, Codec, ConnectError, EnvelopeReader};
use crate::pb::filesystem as pb;
use crate::pb::{Empty, Timestamp};
use crate::users::Users;
use crate::v1::{enc, Sandbox};

/// How often a streaming watch lists its directory.
pub const WATCH_PERIOD: Duration = Duration::from_millis(200);
/// Most entries a listing (ListDir with depth, a watch) gathers.
const MAX_ENTRIES: usize = 100_000;
/// Deepest a recursive watch looks.
const MAX_WATCH_DEPTH: u32 = 32;
/// Most polling watchers at once (each holds a listing); past it, the least recently used
/// one goes.
pub(crate) const MAX_WATCHERS: usize = 10_000;
/// Most polling watchers of one sandbox.
pub(crate) const MAX_WATCHERS_PER_SANDBOX: usize = 64;
/// Most streaming `WatchDir` calls open at once on one sandbox. Each lists its directory
/// (up to [`MAX_ENTRIES`] entries) every [`WATCH_PERIOD`] and the node diffs the listings, so
/// without a bound one sandbox's streams could take the node's CPU from every other.
pub(crate) const MAX_WATCH_STREAMS_PER_SANDBOX: usize = 8;

/// A directory's entries, by path relative to it.
type Listing = BTreeMap<String, FileStat>;

struct Watcher {
    sandbox: String,
    path: String,
    recursive: bool,
    include_entry: bool,
    last: Listing,
    /// When it was made or last polled (a tick of [`Watchers::tick`]).
    used: u64,
}

/// Polling watchers by id, and the streaming watches open on each sandbox.
#[derive(Default)]
pub struct Watchers {
    by_id: Mutex<HashMap<String, Watcher>>,
    tick: std::sync::atomic::AtomicU64,
    streams: Arc<Mutex<HashMap<String, usize>>>,
}

/// One open streaming watch of a sandbox, counted in [`Watchers`] until it is dropped (the
/// stream ends, or its client goes away and the body is dropped).
struct StreamSlot {
    streams: Arc<Mutex<HashMap<String, usize>>>,
    sandbox: String,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut m = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = m.get_mut(&self.sandbox) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.sandbox);
            }
        }
    }
}

impl Watchers {
    fn tick(&self) -> u64 {
        self.tick.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// A slot for one more streaming watch of `sandbox`, or `resource_exhausted` when it has
    /// [`MAX_WATCH_STREAMS_PER_SANDBOX`] open.
    fn open_stream(&self, sandbox: &str) -> Result<StreamSlot, ConnectError> {
        let mut m = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        let n = m.entry(sandbox.to_string()).or_default();
        if *n >= MAX_WATCH_STREAMS_PER_SANDBOX {
            return Err(ConnectError::new(
                Code::ResourceExhausted,
                format!(
                    "this sandbox has {MAX_WATCH_STREAMS_PER_SANDBOX} directory watches open; \
                     stop one before starting another"
                ),
            ));
        }
        *n += 1;
        Ok(StreamSlot {
            streams: self.streams.clone(),
            sandbox: sandbox.to_string(),
        })
    }

    /// Drops a sandbox's watchers.
    pub fn forget(&self, sandbox: &str) {
        self.by_id
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|_, w| w.sandbox != sandbox);
    }
}

/// One call of the service.
pub struct Call<'a> {
    pub watchers: &'a Watchers,
    pub users: &'a Users,
    pub sandbox: Sandbox,
    pub user: Option<String>,
    pub kind: CallKind,
    pub headers: HeaderMap,
    pub body: Body,
}

impl Call<'_> {
    pub async fn serve(self, method: &str) -> Response {
        let kind = self.kind;
        let r = match method {
            "Stat" => self.stat().await,
            "ListDir" => self.list_dir().await,
            "MakeDir" => self.make_dir().await,
            "Move" => self.mv().await,
            "Remove" => self.remove().await,
            "WatchDir" => self.watch_dir().await,
            "CreateWatcher" => self.create_watcher().await,
            "GetWatcherEvents" => self.get_watcher_events().await,
            "RemoveWatcher" => self.remove_watcher().await,
            other => Err(ConnectError::new(
                Code::Unimplemented,
                format!("filesystem.Filesystem/{other} is not a method of this service"),
            )),
        };
        r.unwrap_or_else(|e| e.into_response(kind))
    }

    async fn unary<M>(&mut self) -> Result<(Codec, M), ConnectError>
    where
        M: prost::Message + Default + serde::de::DeserializeOwned,
    {
        let CallKind::Unary(codec) = self.kind else {
            return Err(ConnectError::invalid(
                "this method is unary: send application/json or application/proto",
            ));
        };
        connect::check_identity(&self.headers, self.kind)?;
        let bytes =
            crate::v1::read_limited(std::mem::take(&mut self.body), connect::MAX_MESSAGE).await?;
        Ok((codec, connect::decode(codec, &bytes)?))
    }

    fn path(&self, p: &str) -> Result<String, ConnectError> {
        resolve_path(p, self.user.as_deref())
    }

    async fn stat(mut self) -> Result<Response, ConnectError> {
        let (codec, req): (_, pb::PathRequest) = self.unary().await?;
        let path = self.path(&req.path)?;
        let st = stat(&self.sandbox, &path).await?;
        Ok(connect::unary_ok(
            codec,
            &pb::EntryResponse {
                entry: Some(entry(&path, &st)),
            },
        ))
    }

    async fn list_dir(mut self) -> Result<Response, ConnectError> {
        let (codec, req): (_, pb::ListDirRequest) = self.unary().await?;
        let path = self.path(&req.path)?;
        let st = stat(&self.sandbox, &path).await?;
        if st.kind != FileKind::Dir {
            return Err(ConnectError::invalid(format!(
                "path {path:?} is not a directory"
            )));
        }
        let listing = walk(&self.sandbox, &path, req.depth.max(1)).await?;
        let entries = listing
            .iter()
            .map(|(rel, st)| entry(&join(&path, rel), st))
            .collect();
        Ok(connect::unary_ok(codec, &pb::ListDirResponse { entries }))
    }

    async fn make_dir(mut self) -> Result<Response, ConnectError> {
        let (codec, req): (_, pb::PathRequest) = self.unary().await?;
        let path = self.path(&req.path)?;
        match stat(&self.sandbox, &path).await {
            Ok(_) => {
                return Err(ConnectError::new(
                    Code::AlreadyExists,
                    format!("directory {path:?} already exists"),
                ))
            }
            Err(e) if e.code == Code::NotFound => {}
            Err(e) => return Err(e),
        }
        let mk = MkdirRequest {
            path: path.clone(),
            parents: true,
            mode: None,
        };
        self.sandbox
            .json_call(Method::POST, "/files/mkdir", Some(&mk))
            .await?;
        let st = stat(&self.sandbox, &path).await?;
        Ok(connect::unary_ok(
            codec,
            &pb::EntryResponse {
                entry: Some(entry(&path, &st)),
            },
        ))
    }

    /// There is no rename route: `mv` runs in the sandbox, as the caller's user.
    async fn mv(mut self) -> Result<Response, ConnectError> {
        let (codec, req): (_, pb::MoveRequest) = self.unary().await?;
        let (src, dst) = (self.path(&req.source)?, self.path(&req.destination)?);
        stat(&self.sandbox, &src).await?;
        let user = self
            .users
            .resolve(&self.sandbox, self.user.as_deref())
            .await?;
        let exec = ExecRequest {
            argv: Some(vec![
                "mv".into(),
                "-f".into(),
                "--".into(),
                src.clone(),
                dst.clone(),
            ]),
            user,
            ..Default::default()
        };
        let r: ExecResult = self
            .sandbox
            .json(Method::POST, "/exec", Some(&exec))
            .await?;
        if r.exit_code != Some(0) {
            let msg = format!("moving {src:?} to {dst:?}: {}", r.stderr.trim());
            let code = if msg.contains("No such file") {
                Code::NotFound
            } else if msg.contains("ermission denied") {
                Code::PermissionDenied
            } else {
                Code::InvalidArgument
            };
            return Err(ConnectError::new(code, msg));
        }
        let st = stat(&self.sandbox, &dst).await?;
        Ok(connect::unary_ok(
            codec,
            &pb::EntryResponse {
                entry: Some(entry(&dst, &st)),
            },
        ))
    }

    async fn remove(mut self) -> Result<Response, ConnectError> {
        let (codec, req): (_, pb::PathRequest) = self.unary().await?;
        let path = self.path(&req.path)?;
        let uri = format!("/files?path={}&recursive=true", enc(&path));
        self.sandbox
            .call(Method::DELETE, &uri, None, Body::empty())
            .await?;
        Ok(connect::unary_ok(codec, &Empty {}))
    }

    async fn create_watcher(mut self) -> Result<Response, ConnectError> {
        let (codec, req): (_, pb::WatchRequest) = self.unary().await?;
        let path = self.path(&req.path)?;
        let last = watch_listing(&self.sandbox, &path, req.recursive).await?;
        let id = ulid::Ulid::new().to_string();
        let mut map = self
            .watchers
            .by_id
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mine = map
            .values()
            .filter(|w| w.sandbox == self.sandbox.id)
            .count();
        if mine >= MAX_WATCHERS_PER_SANDBOX {
            return Err(ConnectError::new(
                Code::ResourceExhausted,
                format!(
                    "sandbox {} has {MAX_WATCHERS_PER_SANDBOX} watchers; remove some first",
                    self.sandbox.id
                ),
            ));
        }
        // Watchers are left behind by sandboxes that end without removing them (a timeout
        // forgets nothing here): the least recently used goes, so leftovers never refuse
        // another tenant's new watcher.
        if map.len() >= MAX_WATCHERS {
            if let Some(old) = map
                .iter()
                .min_by_key(|(_, w)| w.used)
                .map(|(k, _)| k.clone())
            {
                map.remove(&old);
            }
        }
        let used = self.watchers.tick();
        map.insert(
            id.clone(),
            Watcher {
                sandbox: self.sandbox.id.clone(),
                path,
                recursive: req.recursive,
                include_entry: req.include_entry,
                last,
                used,
            },
        );
        Ok(connect::unary_ok(codec, &pb::WatcherId { watcher_id: id }))
    }

    async fn get_watcher_events(mut self) -> Result<Response, ConnectError> {
        let (codec, req): (_, pb::WatcherId) = self.unary().await?;
        let (path, recursive, include) = {
            let map = self
                .watchers
                .by_id
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let w = map
                .get(&req.watcher_id)
                .filter(|w| w.sandbox == self.sandbox.id)
                .ok_or_else(|| watcher_not_found(&req.watcher_id))?;
            (w.path.clone(), w.recursive, w.include_entry)
        };
        let now = watch_listing(&self.sandbox, &path, recursive).await?;
        let events = {
            let mut map = self
                .watchers
                .by_id
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let w = map
                .get_mut(&req.watcher_id)
                .ok_or_else(|| watcher_not_found(&req.watcher_id))?;
            let ev = diff(&w.path, &w.last, &now, include);
            w.last = now;
            w.used = self.watchers.tick();
            ev
        };
        Ok(connect::unary_ok(
            codec,
            &pb::GetWatcherEventsResponse { events },
        ))
    }

    async fn remove_watcher(mut self) -> Result<Response, ConnectError> {
        let (codec, req): (_, pb::WatcherId) = self.unary().await?;
        let mut map = self
            .watchers
            .by_id
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match map.get(&req.watcher_id) {
            Some(w) if w.sandbox == self.sandbox.id => {
                map.remove(&req.watcher_id);
                Ok(connect::unary_ok(codec, &Empty {}))
            }
            _ => Err(watcher_not_found(&req.watcher_id)),
        }
    }

    async fn watch_dir(mut self) -> Result<Response, ConnectError> {
        let CallKind::Stream(codec) = self.kind else {
            return Err(ConnectError::invalid(
                "WatchDir streams: send application/connect+json or application/connect+proto",
            ));
        };
        connect::check_identity(&self.headers, self.kind)?;
        let bytes =
            crate::v1::read_limited(std::mem::take(&mut self.body), connect::MAX_MESSAGE + 5)
                .await?;
        let mut r = EnvelopeReader::default();
        r.push(&bytes);
        let frame = r
            .next_frame()?
            .ok_or_else(|| ConnectError::invalid("the request stream holds no message"))?;
        r.finish()?;
        let req: pb::WatchRequest = connect::decode(codec, &frame.payload)?;
        let path = self.path(&req.path)?;
        let slot = self.watchers.open_stream(&self.sandbox.id)?;
        let first = watch_listing(&self.sandbox, &path, req.recursive).await?;
        let keepalive = self
            .headers
            .get("keepalive-ping-interval")
            .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok())
            .filter(|s| *s > 0)
            .map(|s| Duration::from_secs(s.min(3600)));
        let deadline = connect::timeout(&self.headers)?.map(|t| tokio::time::Instant::now() + t);
        let sb = self.sandbox.clone();
        struct St {
            sb: Sandbox,
            path: String,
            recursive: bool,
            include: bool,
            last: Listing,
            queue: std::collections::VecDeque<Bytes>,
            since_keepalive: Duration,
            done: bool,
            _slot: StreamSlot,
        }
        let start = connect::stream_message(
            codec,
            &pb::WatchDirResponse {
                event: Some(pb::WatchEvent::Start(Empty {})),
            },
        );
        let st = St {
            sb,
            path,
            recursive: req.recursive,
            include: req.include_entry,
            last: first,
            queue: [start].into(),
            since_keepalive: Duration::ZERO,
            done: false,
            _slot: slot,
        };
        let body = futures::stream::unfold(st, move |mut st| async move {
            loop {
                if let Some(b) = st.queue.pop_front() {
                    return Some((Ok::<_, std::convert::Infallible>(b), st));
                }
                if st.done {
                    return None;
                }
                if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
                    st.done = true;
                    let e = ConnectError::new(Code::DeadlineExceeded, "the watch's timeout passed");
                    st.queue.push_back(connect::end_stream(Some(&e)));
                    continue;
                }
                tokio::time::sleep(WATCH_PERIOD).await;
                st.since_keepalive += WATCH_PERIOD;
                match watch_listing(&st.sb, &st.path, st.recursive).await {
                    Ok(now) => {
                        for ev in diff(&st.path, &st.last, &now, st.include) {
                            let msg = pb::WatchDirResponse {
                                event: Some(pb::WatchEvent::Filesystem(ev)),
                            };
                            st.queue.push_back(connect::stream_message(codec, &msg));
                        }
                        st.last = now;
                    }
                    Err(e) => {
                        st.done = true;
                        st.queue.push_back(connect::end_stream(Some(&e)));
                    }
                }
                if keepalive.is_some_and(|k| st.since_keepalive >= k) {
                    st.since_keepalive = Duration::ZERO;
                    let msg = pb::WatchDirResponse {
                        event: Some(pb::WatchEvent::Keepalive(Empty {})),
                    };
                    st.queue.push_back(connect::stream_message(codec, &msg));
                }
            }
        });
        Ok((
            StatusCode::OK,
            [(header::CONTENT_TYPE, codec.stream_content_type())],
            Body::from_stream(body),
        )
            .into_response())
    }
}

fn watcher_not_found(id: &str) -> ConnectError {
    ConnectError::new(Code::NotFound, format!("watcher {id:?} not found"))
}

/// An absolute path for the SDK's path: relative ones (and `~`) are under the user's home,
/// `/home/<user>` for a named user, `/root` otherwise.
pub fn resolve_path(p: &str, user: Option<&str>) -> Result<String, ConnectError> {
    let home = match user {
        Some(u) if !u.is_empty() && u != "root" && !u.bytes().all(|b| b.is_ascii_digit()) => {
            format!("/home/{u}")
        }
        _ => "/root".to_string(),
    };
    let abs = if p.starts_with('/') {
        p.to_string()
    } else if p == "~" {
        home
    } else if let Some(rest) = p.strip_prefix("~/") {
        format!("{home}/{rest}")
    } else if p.is_empty() {
        return Err(ConnectError::invalid("path is empty"));
    } else {
        format!("{home}/{p}")
    };
    warren_types::validate::sandbox_path(&abs).map_err(|e| crate::v1::from_api(&e))
}

fn join(dir: &str, rel: &str) -> String {
    if dir == "/" {
        format!("/{rel}")
    } else {
        format!("{dir}/{rel}")
    }
}

pub async fn stat(sb: &Sandbox, path: &str) -> Result<FileStat, ConnectError> {
    sb.json(
        Method::GET,
        &format!("/files/stat?path={}", enc(path)),
        None::<&()>,
    )
    .await
}

/// A directory's entries `depth` levels down (1: its own), by path relative to it.
async fn walk(sb: &Sandbox, dir: &str, depth: u32) -> Result<Listing, ConnectError> {
    let mut out = Listing::new();
    let mut todo = vec![(String::new(), 1u32)];
    while let Some((rel, level)) = todo.pop() {
        let abs = if rel.is_empty() {
            dir.to_string()
        } else {
            join(dir, &rel)
        };
        let mut after: Option<String> = None;
        loop {
            let mut uri = format!("/files/list?path={}&limit=10000", enc(&abs));
            if let Some(a) = &after {
                uri.push_str(&format!("&after={}", enc(a)));
            }
            let page: DirPage = match sb.json(Method::GET, &uri, None::<&()>).await {
                Ok(p) => p,
                // A directory removed while walked is no error of the walk.
                Err(e) if e.code == Code::NotFound && !rel.is_empty() => break,
                Err(e) => return Err(e),
            };
            for st in page.entries {
                let r = if rel.is_empty() {
                    st.name.clone()
                } else {
                    format!("{rel}/{}", st.name)
                };
                if st.kind == FileKind::Dir && level < depth {
                    todo.push((r.clone(), level + 1));
                }
                out.insert(r, st);
                if out.len() > MAX_ENTRIES {
                    return Err(ConnectError::new(
                        Code::ResourceExhausted,
                        format!("more than {MAX_ENTRIES} entries under {dir:?}"),
                    ));
                }
            }
            match page.next {
                Some(n) => after = Some(n),
                None => break,
            }
        }
    }
    Ok(out)
}

async fn watch_listing(sb: &Sandbox, path: &str, recursive: bool) -> Result<Listing, ConnectError> {
    let st = stat(sb, path).await?;
    if st.kind != FileKind::Dir {
        return Err(ConnectError::invalid(format!(
            "path {path:?} is not a directory"
        )));
    }
    walk(sb, path, if recursive { MAX_WATCH_DEPTH } else { 1 }).await
}

/// The events that turn listing `a` into listing `b`.
fn diff(dir: &str, a: &Listing, b: &Listing, include: bool) -> Vec<pb::FilesystemEvent> {
    let ev = |name: &str, t: pb::EventType, st: Option<&FileStat>| pb::FilesystemEvent {
        name: name.to_string(),
        r#type: t as i32,
        entry: if include {
            st.map(|s| entry(&join(dir, name), s))
        } else {
            None
        },
    };
    let mut out = Vec::new();
    for (name, old) in a {
        if !b.contains_key(name) {
            out.push(ev(name, pb::EventType::Remove, None));
        } else if let Some(new) = b.get(name) {
            if new.kind != old.kind {
                out.push(ev(name, pb::EventType::Remove, None));
                out.push(ev(name, pb::EventType::Create, Some(new)));
            } else if new.size != old.size || new.mtime_ms != old.mtime_ms {
                out.push(ev(name, pb::EventType::Write, Some(new)));
            } else if new.mode != old.mode {
                out.push(ev(name, pb::EventType::Chmod, Some(new)));
            }
        }
    }
    for (name, new) in b {
        if !a.contains_key(name) {
            out.push(ev(name, pb::EventType::Create, Some(new)));
            if new.kind == FileKind::File && new.size > 0 {
                out.push(ev(name, pb::EventType::Write, Some(new)));
            }
        }
    }
    out
}

/// envd's entry for a Warren stat.
pub fn entry(path: &str, st: &FileStat) -> pb::EntryInfo {
    let name = path.rsplit('/').next().unwrap_or("").to_string();
    let (t, c) = match st.kind {
        FileKind::File => (pb::FileType::File, '-'),
        FileKind::Dir => (pb::FileType::Directory, 'd'),
        FileKind::Symlink => (pb::FileType::Symlink, 'L'),
        FileKind::Other => (pb::FileType::Unspecified, '?'),
    };
    let mut permissions = String::with_capacity(10);
    permissions.push(c);
    for shift in [6, 3, 0] {
        let bits = (st.mode >> shift) & 7;
        permissions.push(if bits & 4 != 0 { 'r' } else { '-' });
        permissions.push(if bits & 2 != 0 { 'w' } else { '-' });
        permissions.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    let id_name = |id: u32| {
        if id == 0 {
            "root".to_string()
        } else {
            id.to_string()
        }
    };
    pb::EntryInfo {
        name,
        r#type: t as i32,
        path: path.to_string(),
        size: st.size.min(i64::MAX as u64) as i64,
        mode: st.mode & 0o777,
        permissions,
        owner: id_name(st.uid),
        group: id_name(st.gid),
        modified_time: Some(Timestamp::from_millis(st.mtime_ms)),
        symlink_target: st.link_target.clone(),
        metadata: HashMap::new(),
        is_symlink: st.kind == FileKind::Symlink,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(kind: FileKind, size: u64, mtime: i64, mode: u32) -> FileStat {
        FileStat {
            name: String::new(),
            kind,
            size,
            mode,
            uid: 0,
            gid: 0,
            mtime_ms: mtime,
            link_target: None,
        }
    }

    #[test]
    fn listings_differ_by_events() {
        let mut a = Listing::new();
        a.insert("keep".into(), st(FileKind::File, 1, 1, 0o644));
        a.insert("gone".into(), st(FileKind::File, 1, 1, 0o644));
        a.insert("grow".into(), st(FileKind::File, 1, 1, 0o644));
        a.insert("chmod".into(), st(FileKind::File, 1, 1, 0o644));
        let mut b = a.clone();
        b.remove("gone");
        b.insert("grow".into(), st(FileKind::File, 2, 2, 0o644));
        b.insert("chmod".into(), st(FileKind::File, 1, 1, 0o600));
        b.insert("new".into(), st(FileKind::File, 0, 3, 0o644));
        let ev: Vec<(String, i32)> = diff("/d", &a, &b, false)
            .into_iter()
            .map(|e| (e.name, e.r#type))
            .collect();
        assert_eq!(
            ev,
            vec![
                ("chmod".into(), pb::EventType::Chmod as i32),
                ("gone".into(), pb::EventType::Remove as i32),
                ("grow".into(), pb::EventType::Write as i32),
                ("new".into(), pb::EventType::Create as i32),
            ]
        );
        let with_entry = diff("/d", &a, &b, true);
        assert_eq!(
            with_entry
                .iter()
                .find(|e| e.name == "new")
                .unwrap()
                .entry
                .as_ref()
                .unwrap()
                .path,
            "/d/new"
        );
    }

    #[test]
    fn relative_paths_are_under_the_users_home() {
        assert_eq!(
            resolve_path("a.txt", Some("user")).unwrap(),
            "/home/user/a.txt"
        );
        assert_eq!(resolve_path("~/x", None).unwrap(), "/root/x");
        assert_eq!(resolve_path("/tmp/../etc", Some("user")).unwrap(), "/etc");
        assert_eq!(
            resolve_path("", None).unwrap_err().code,
            Code::InvalidArgument
        );
        assert_eq!(
            resolve_path("/../..", None).unwrap_err().code,
            Code::InvalidArgument
        );
    }

    #[test]
    fn entries_look_like_envds() {
        let e = entry("/tmp/d", &st(FileKind::Dir, 4096, 1500, 0o755));
        assert_eq!(e.name, "d");
        assert_eq!(e.permissions, "drwxr-xr-x");
        assert_eq!(
            e.modified_time,
            Some(Timestamp {
                seconds: 1,
                nanos: 500_000_000
            })
        );
        assert_eq!(e.owner, "root");
    }
}
