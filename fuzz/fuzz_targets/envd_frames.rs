//! Fuzzes envd's Connect framing: arbitrary bytes, cut into chunks at arbitrary points, go
//! through `warren_envd::connect::EnvelopeReader`, and every whole message is decoded as the
//! requests that carry client data, in JSON and in protobuf. Each step must answer `Ok` or a
//! Connect error, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use warren_envd::connect::{decode, Codec, EnvelopeReader};
use warren_envd::pb::{filesystem as fs, process};

fuzz_target!(|data: &[u8]| {
    // The first byte is the chunk size the body arrives in (1-256) and the message limit's
    // scale; the rest is the body.
    let Some((first, body)) = data.split_first() else {
        return;
    };
    let chunk = *first as usize + 1;
    let mut reader = EnvelopeReader::new(chunk * 64);
    for piece in body.chunks(chunk) {
        reader.push(piece);
        loop {
            match reader.next_frame() {
                Ok(Some(frame)) => {
                    for codec in [Codec::Json, Codec::Proto] {
                        let p = &frame.payload;
                        // Every request message the server reads.
                        let _ = decode::<process::StartRequest>(codec, p);
                        let _ = decode::<process::StreamInputRequest>(codec, p);
                        let _ = decode::<process::SendSignalRequest>(codec, p);
                        let _ = decode::<process::SendInputRequest>(codec, p);
                        let _ = decode::<process::UpdateRequest>(codec, p);
                        let _ = decode::<process::SelectorOnly>(codec, p);
                        let _ = decode::<warren_envd::pb::Empty>(codec, p);
                        let _ = decode::<fs::EntryInfo>(codec, p);
                        let _ = decode::<fs::WatchRequest>(codec, p);
                        let _ = decode::<fs::PathRequest>(codec, p);
                        let _ = decode::<fs::ListDirRequest>(codec, p);
                        let _ = decode::<fs::MoveRequest>(codec, p);
                        let _ = decode::<fs::WatcherId>(codec, p);
                    }
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
    let _ = reader.finish();
});
