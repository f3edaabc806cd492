//! The connection: the socket's reader and writer tasks, the table of open streams, and the
//! calls that are answered by one event (ping, network set-up).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;
use tokio::sync::{mpsc, watch};
use warren_proto::{Call, Event, Frame, Kind};
use warren_types::ErrorCode;

use super::streams::Stream;
use super::unexpected;
use crate::RuntimeError;

/// What a connection's calls share: the writer's queue and the table of open streams.
pub(super) struct Inner {
    pub(super) tx: mpsc::Sender<Frame>,
    pub(super) streams: Mutex<HashMap<u32, mpsc::UnboundedSender<Frame>>>,
    next: AtomicU32,
    closed: watch::Receiver<bool>,
}

/// A connection to one agent. Cheap to clone.
#[derive(Clone)]
pub struct AgentConn {
    pub(super) inner: Arc<Inner>,
}

impl std::fmt::Debug for AgentConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentConn")
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl AgentConn {
    /// Starts serving a connected stream whose start-up handshake is done.
    pub fn new(stream: UnixStream) -> Self {
        let (mut rd, mut wr) = stream.into_split();
        let (tx, mut rx) = mpsc::channel::<Frame>(1024);
        let (closed_tx, closed) = watch::channel(false);
        let inner = Arc::new(Inner {
            tx,
            streams: Mutex::new(HashMap::new()),
            next: AtomicU32::new(1),
            closed,
        });
        // The writer batches what is queued (up to 1 MiB) into one write.
        tokio::spawn(async move {
            let mut buf = bytes::BytesMut::with_capacity(1 << 16);
            while let Some(f) = rx.recv().await {
                buf.clear();
                f.encode_into(&mut buf);
                while buf.len() < (1 << 20) {
                    match rx.try_recv() {
                        Ok(f) => f.encode_into(&mut buf),
                        Err(_) => break,
                    }
                }
                if wr.write_all(&buf).await.is_err() {
                    return;
                }
            }
        });
        let weak = Arc::downgrade(&inner);
        tokio::spawn(async move {
            while let Ok(frame) = Frame::read_async(&mut rd).await {
                let Some(inner) = weak.upgrade() else { break };
                let tx = inner
                    .streams
                    .lock()
                    .expect("streams lock")
                    .get(&frame.stream)
                    .cloned();
                if let Some(tx) = tx {
                    let _ = tx.send(frame);
                }
            }
            if let Some(inner) = weak.upgrade() {
                inner.streams.lock().expect("streams lock").clear();
            }
            let _ = closed_tx.send(true);
        });
        AgentConn { inner }
    }

    /// True once the connection is gone.
    pub fn is_closed(&self) -> bool {
        *self.inner.closed.borrow()
    }

    /// Resolves when the connection is gone.
    pub async fn closed(&self) {
        let mut rx = self.inner.closed.clone();
        let _ = rx.wait_for(|c| *c).await;
    }

    /// Opens a stream for `call` and sends the call on it.
    pub(super) async fn open(&self, call: &Call) -> Result<Stream, RuntimeError> {
        if self.is_closed() {
            return Err(RuntimeError::AgentLost);
        }
        let frame = Frame::json(0, Kind::Call, call);
        if !frame.fits() {
            // Never sent: the agent's connection outlives any request.
            return Err(RuntimeError::Agent {
                code: ErrorCode::InvalidRequest,
                message: format!(
                    "the request is {} bytes encoded, more than the {} bytes a call may carry",
                    frame.payload.len(),
                    warren_proto::MAX_MESSAGE
                ),
            });
        }
        let id = self.inner.next.fetch_add(1, Ordering::Relaxed).max(1);
        let (tx, rx) = mpsc::unbounded_channel();
        self.inner
            .streams
            .lock()
            .expect("streams lock")
            .insert(id, tx);
        let s = Stream::new(id, rx, self.clone());
        s.send(Frame::new(id, Kind::Call, frame.payload)).await?;
        Ok(s)
    }

    /// A call answered by one final event (an `Error` event is returned as `Err`).
    pub(super) async fn simple(&self, call: Call) -> Result<Event, RuntimeError> {
        let mut s = self.open(&call).await?;
        loop {
            let ev = s.next_event().await?;
            if ev.is_final() {
                return Ok(ev);
            }
        }
    }

    /// Round trip to the agent.
    pub async fn ping(&self) -> Result<u32, RuntimeError> {
        match self.simple(Call::Ping).await? {
            Event::Pong { pid, .. } => Ok(pid),
            other => Err(unexpected(&other)),
        }
    }

    /// Configures a VM guest's network interface (`None` takes its address away) and writes
    /// its `/etc/resolv.conf`.
    pub async fn guest_network(
        &self,
        config: Option<warren_proto::GuestNet>,
        resolv_conf: String,
    ) -> Result<(), RuntimeError> {
        self.simple(Call::Network {
            config,
            resolv_conf: Some(resolv_conf),
        })
        .await
        .map(|_| ())
    }
}
