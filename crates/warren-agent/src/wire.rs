//! The agent's side of one connection, as every call handler sees it: frames out to the
//! daemon, frames in for one stream.

use tokio::sync::mpsc;
use warren_proto::{Event, Frame, Kind};
use warren_types::ErrorCode;

/// Frames to the daemon.
pub type Out = mpsc::Sender<Frame>;
/// Frames from the daemon for one stream.
pub type Inbox = mpsc::Receiver<Frame>;

/// Sends an event; false when the daemon is gone. An answer too large for the protocol is
/// replaced by an error (the connection outlives any answer).
pub async fn event(out: &Out, stream: u32, ev: &Event) -> bool {
    let mut f = Frame::json(stream, Kind::Event, ev);
    if !f.fits() {
        f = Frame::json(
            stream,
            Kind::Event,
            &Event::error(
                ErrorCode::InvalidRequest,
                format!(
                    "the answer is larger than {} bytes; ask for less (e.g. a page of a listing)",
                    warren_proto::MAX_MESSAGE
                ),
            ),
        );
    }
    out.send(f).await.is_ok()
}
