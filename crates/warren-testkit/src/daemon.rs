//! A node daemon for the tests of its clients (`warren-client`, the `warren` CLI): the node's
//! real router ([`warren_node::router`], the one `warrend` serves) over the fake runtime and
//! fake agent of [`warren_node::testing`], served on a Unix socket in a temporary directory.
//!
//! What the fake agent answers (command output, exit codes, files, terminals) is described on
//! [`warren_node::testing`]; everything between the socket and the agent is the node's own
//! code. The daemon also counts the connections it accepted and records every request line,
//! for tests of what a client sends. It never starts a process or a sandbox of the host.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use axum::serve::ListenerExt;
use warren_node::Node;

pub use warren_node::testing::{FakeFile, FakeFiles, FakeRuntime};

/// Request lines (`METHOD /path?query`) in the order they arrived.
type Log = Arc<Mutex<Vec<String>>>;

/// A node serving its API on `unix://<dir>/warren.sock` until dropped.
pub struct FakeDaemon {
    node: Node,
    runtime: Arc<FakeRuntime>,
    sock: PathBuf,
    requests: Log,
    connections: Arc<AtomicUsize>,
    server: tokio::task::JoinHandle<()>,
    dir: tempfile::TempDir,
}

impl FakeDaemon {
    /// Starts a node `n1` with the default configuration over a fresh fake runtime. Call it
    /// inside the Tokio runtime that is to run the node (its tasks live there).
    pub async fn start() -> FakeDaemon {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let (manager, runtime) = warren_node::testing::manager_in(dir.path(), |_| {});
        let node = Node::new(manager, None);
        let sock = dir.path().join("warren.sock");
        let requests = Log::default();
        let connections = Arc::new(AtomicUsize::new(0));
        let counter = connections.clone();
        let listener = tokio::net::UnixListener::bind(&sock)
            .expect("binding the socket")
            .tap_io(move |_| {
                counter.fetch_add(1, Ordering::Relaxed);
            });
        let app = warren_node::router(node.clone()).layer(axum::middleware::from_fn_with_state(
            requests.clone(),
            record,
        ));
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeDaemon {
            node,
            runtime,
            sock,
            requests,
            connections,
            server,
            dir,
        }
    }

    /// The daemon's address, as clients take it (`unix:///…/warren.sock`).
    pub fn url(&self) -> String {
        format!("unix://{}", self.sock.display())
    }

    /// A directory that lives as long as the daemon (the socket and the state are in it).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The node served, to prepare or inspect its state beside the API.
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// The fake runtime under the node: what it was asked to do, what its agents counted.
    pub fn runtime(&self) -> &FakeRuntime {
        &self.runtime
    }

    /// The files of sandbox `id` (written into it, or kept there by a test).
    pub fn files(&self, id: &str) -> FakeFiles {
        self.runtime.instance(id).files.clone()
    }

    /// Every request so far as `METHOD /path?query`, in the order they arrived.
    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::Relaxed)
    }
}

impl Drop for FakeDaemon {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn record(State(log): State<Log>, req: Request, next: Next) -> Response {
    log.lock()
        .unwrap()
        .push(format!("{} {}", req.method(), req.uri()));
    next.run(req).await
}

#[cfg(test)]
mod tests {
    /// A method a path does not take: 405 with the API's JSON error and an `Allow` header
    /// naming the methods the path does take, on every path of the node's route table (as on
    /// a gateway, `warren-gateway/src/routes_tests.rs`; the check is [`crate::routes`]).
    #[tokio::test]
    async fn the_node_answers_a_wrong_method_with_405_and_allow_on_every_path() {
        let dir = tempfile::tempdir().unwrap();
        let (m, _) = warren_node::testing::manager_in(dir.path(), |_| {});
        let app = warren_node::router(warren_node::Node::new(m, None));
        let tried =
            crate::routes::wrong_methods_answer_405(app, warren_node::ROUTES.iter().copied()).await;
        assert!(tried > 100, "only {tried} wrong methods tried");
    }

    /// The daemon serves over its socket, and records and counts what reached it.
    #[tokio::test]
    async fn the_daemon_serves_the_node_on_its_socket() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let d = super::FakeDaemon::start().await;
        assert!(d.url().starts_with("unix:///"), "{}", d.url());
        let mut s = tokio::net::UnixStream::connect(d.dir().join("warren.sock"))
            .await
            .unwrap();
        s.write_all(b"GET /v1/health?x=1 HTTP/1.1\r\nhost: n1\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.contains("\"container\""), "{answer}");
        assert_eq!(d.requests(), ["GET /v1/health?x=1"]);
        assert_eq!(d.connections(), 1);
    }
}
