//! The agent's side of one connection, as every call handler sees it: frames out to the
//! daemon, frames in for one stream.

use tokio::sync::mpsc;
use warren_proto::{Event, Frame, Kind};

/// Frames to the daemon.
pub type Out = mpsc::Sender<Frame>;
/// Frames from the daemon for one stream.
pub type Inbox = mpsc::Receiver<Frame>;

/// Sends an event; false when the daemon is gone.
pub async fn event(out: &Out, stream: u32, ev: &Event) -> bool {
    out.send(Frame::json(stream, Kind::Event, ev)).await.is_ok()
}
