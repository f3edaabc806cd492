//! The agent's side of one connection, as every call handler sees it: frames out to the
//! daemon, frames in for one stream.

use tokio::sync::mpsc;
use warren_proto::{Event, Frame, Kind};
use warren_types::ErrorCode;

/// Frames to the daemon.
pub type Out = mpsc::Sender<Frame>;
/// Frames from the daemon for one stream.
pub type Inbox = mpsc::Receiver<Frame>;

/// Sends a start-up answer on the (blocking) control socket; a lost daemon is noticed later.
pub fn send_init(ctl: &mut std::os::unix::net::UnixStream, reply: &warren_proto::InitReply) {
    let _ = Frame::json(0, Kind::Init, reply).write_blocking(ctl);
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use warren_proto::{Call, FrameError, MAX_FRAME, MAX_PAYLOAD};

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn events_and_calls_round_trip_through_the_wire_format() {
        let events = [
            Event::Started { pid: 42 },
            Event::error(ErrorCode::NotFound, "no background process 7"),
            Event::Done,
        ];
        let mut wire = Vec::new();
        for (i, ev) in events.iter().enumerate() {
            wire.extend_from_slice(&Frame::json(i as u32, Kind::Event, ev).encode());
        }
        let call = Call::Kill { pid: 9, signal: 15 };
        wire.extend_from_slice(&Frame::json(77, Kind::Call, &call).encode());
        let mut r = &wire[..];
        for (i, ev) in events.iter().enumerate() {
            let f = Frame::read_blocking(&mut r).unwrap();
            assert_eq!((f.stream, f.kind), (i as u32, Kind::Event));
            assert_eq!(
                serde_json::to_value(f.parse::<Event>().unwrap()).unwrap(),
                serde_json::to_value(ev).unwrap()
            );
        }
        let f = Frame::read_blocking(&mut r).unwrap();
        assert!(matches!(
            f.parse::<Call>().unwrap(),
            Call::Kill { pid: 9, signal: 15 }
        ));
        assert!(matches!(
            Frame::read_blocking(&mut r),
            Err(FrameError::Closed)
        ));
    }

    #[test]
    fn a_message_larger_than_a_frame_goes_in_parts_and_comes_back_whole() {
        let payload: Vec<u8> = (0..MAX_PAYLOAD * 2 + 17).map(|i| i as u8).collect();
        let f = Frame::new(5, Kind::Stdout, payload.clone());
        let wire = f.encode();
        assert_eq!(
            wire.len(),
            payload.len() + 3 * 9,
            "three frames on the wire"
        );
        let back = Frame::read_blocking(&mut &wire[..]).unwrap();
        assert_eq!(back, f);
        let back = rt().block_on(Frame::read_async(&mut &wire[..])).unwrap();
        assert_eq!(back, f);
    }

    #[test]
    fn oversized_cut_or_interleaved_frames_are_errors_not_panics() {
        // A length over the limit is refused before anything is allocated for it.
        let mut wire = (MAX_FRAME + 1).to_be_bytes().to_vec();
        wire.extend_from_slice(&[0; 16]);
        assert!(matches!(
            Frame::read_blocking(&mut &wire[..]),
            Err(FrameError::TooLarge(_))
        ));
        // A frame cut in the middle.
        let whole = Frame::new(1, Kind::Stdin, &b"hello"[..]).encode();
        assert!(Frame::read_blocking(&mut &whole[..whole.len() - 2]).is_err());
        // A length shorter than the header.
        assert!(Frame::read_blocking(&mut &[0u8, 0, 0, 2, 1, 2][..]).is_err());
        // An unknown kind.
        let mut bad = whole.to_vec();
        bad[8] = 0xee;
        assert!(matches!(
            Frame::read_blocking(&mut &bad[..]),
            Err(FrameError::UnknownKind(0xee))
        ));
        // The parts of one message interrupted by another stream.
        let mut wire = Frame::new(1, Kind::Stdout, vec![0u8; MAX_PAYLOAD + 1]).encode();
        wire.truncate(9 + MAX_PAYLOAD);
        wire.extend_from_slice(&Frame::new(2, Kind::Stdout, &b"x"[..]).encode());
        assert!(matches!(
            Frame::read_blocking(&mut &wire[..]),
            Err(FrameError::BadPart(1, 2))
        ));
    }

    #[test]
    fn an_answer_too_large_for_the_protocol_becomes_an_error() {
        rt().block_on(async {
            let (tx, mut rx) = tokio::sync::mpsc::channel(4);
            let small = Event::Started { pid: 1 };
            assert!(event(&tx, 3, &small).await);
            let f = rx.recv().await.unwrap();
            assert_eq!((f.stream, f.kind), (3, Kind::Event));
            assert!(matches!(
                f.parse::<Event>().unwrap(),
                Event::Started { pid: 1 }
            ));

            let big = Event::error(ErrorCode::Internal, "x".repeat(warren_proto::MAX_MESSAGE));
            assert!(event(&tx, 4, &big).await);
            let f = rx.recv().await.unwrap();
            assert!(f.fits());
            match f.parse::<Event>().unwrap() {
                Event::Error { code, message } => {
                    assert_eq!(code, ErrorCode::InvalidRequest);
                    assert!(message.contains("larger than"), "{message}");
                }
                other => panic!("{other:?}"),
            }
            drop(rx);
            assert!(
                !event(&tx, 5, &small).await,
                "false once the daemon is gone"
            );
        });
    }
}
