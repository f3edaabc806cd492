//! Terminal sessions as stored: timestamped input and output chunks, each kept like exec
//! output (inline when small, a blob when large, digest and size only past the budget).

use serde::{Deserialize, Serialize};
use warren_types::{OutputEncoding, TerminalChunk, TerminalOutcome, TerminalStream};

use super::{Blob, Blobs, Room, StoredOutput};

/// One chunk as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredChunk {
    pub at_ms: u64,
    pub stream: TerminalStream,
    pub data: StoredOutput,
}

/// A part of a terminal session as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredTerminal {
    pub chunks: Vec<StoredChunk>,
    #[serde(default)]
    pub ended: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
}

impl StoredTerminal {
    /// A part holding `chunks` (at, stream, bytes), their bytes kept while `room` has room.
    pub fn new(
        chunks: &[(u64, TerminalStream, Vec<u8>)],
        room: &mut Room,
        blobs: &mut Vec<Blob>,
    ) -> StoredTerminal {
        StoredTerminal {
            chunks: chunks
                .iter()
                .map(|(at_ms, stream, bytes)| StoredChunk {
                    at_ms: *at_ms,
                    stream: *stream,
                    data: StoredOutput::kept_if(room.keep(bytes.len()), bytes, blobs),
                })
                .collect(),
            ended: false,
            exit_code: None,
            signal: None,
        }
    }

    /// As the export shows it: each chunk as text when its bytes are UTF-8, else base64.
    pub fn exported(&self, blobs: &Blobs) -> TerminalOutcome {
        TerminalOutcome {
            chunks: self
                .chunks
                .iter()
                .map(|c| {
                    let bytes = c.data.bytes(blobs);
                    let (data, encoding) = match std::str::from_utf8(&bytes) {
                        Ok(s) => (s.to_string(), OutputEncoding::Utf8),
                        Err(_) => (
                            OutputEncoding::Base64.encode(&bytes),
                            OutputEncoding::Base64,
                        ),
                    };
                    TerminalChunk {
                        at_ms: c.at_ms,
                        stream: c.stream,
                        data,
                        encoding,
                        len: c.data.len,
                        sha256: c.data.sha256.clone(),
                        omitted: c.data.omitted,
                    }
                })
                .collect(),
            ended: self.ended,
            exit_code: self.exit_code,
            signal: self.signal,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_chunks_export_as_text_and_binary_as_base64() {
        let mut blobs = Vec::new();
        let chunks = vec![
            (1, TerminalStream::Input, b"ls\r".to_vec()),
            (2, TerminalStream::Output, vec![0xff, 0x00]),
            (3, TerminalStream::Output, b"done".to_vec()),
        ];
        let mut room = Room::new(5, false);
        let t = StoredTerminal::new(&chunks, &mut room, &mut blobs);
        let out = t.exported(&Blobs::new());
        assert_eq!(out.chunks[0].data, "ls\r");
        assert_eq!(out.chunks[0].encoding, OutputEncoding::Utf8);
        assert_eq!(out.chunks[1].data, "/wA=");
        assert_eq!(out.chunks[1].encoding, OutputEncoding::Base64);
        // Past the budget: digest and size only.
        assert!(out.chunks[2].omitted && out.chunks[2].data.is_empty());
        assert_eq!(out.chunks[2].len, 4);
    }
}
