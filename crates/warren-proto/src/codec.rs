//! Frame encoding and decoding, async and blocking.

use bytes::{BufMut, Bytes, BytesMut};
use std::io::{Read, Write};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Largest frame (stream id + kind + payload) accepted: 1 MiB + header.
pub const MAX_FRAME: u32 = (1 << 20) + 5;
/// Largest payload a sender puts in one frame; a larger message is split (see [`Kind::Part`]).
pub const MAX_PAYLOAD: usize = 1 << 20;
/// Largest message (a frame with its [`Kind::Part`]s) a reader reassembles. Senders check
/// their messages against it ([`Frame::fits`]) and answer an error instead of sending one that
/// does not fit, so a message of any size never costs the connection.
pub const MAX_MESSAGE: usize = 64 << 20;

/// Frame kinds. The numeric values are the wire format; never renumber.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// daemon → agent: JSON [`crate::Call`]; opens the stream.
    Call = 1,
    /// agent → daemon: JSON [`crate::Event`].
    Event = 2,
    /// daemon → agent: input bytes (stdin, file upload, terminal input).
    Stdin = 3,
    /// agent → daemon: output bytes (stdout, file download, terminal output).
    Stdout = 4,
    /// agent → daemon: stderr bytes.
    Stderr = 5,
    /// daemon → agent: no more input on this stream.
    Eof = 6,
    /// daemon → agent: stop the stream's work (kill the process, abort the transfer).
    Cancel = 7,
    /// daemon → agent: BE u32 more bytes of output the agent may send on this stream.
    Credit = 8,
    /// daemon → agent: JSON [`crate::Control`] for a live stream (e.g. terminal resize).
    Control = 9,
    /// both ways during start-up: JSON [`crate::Init`] / [`crate::InitReply`] on stream 0.
    Init = 10,
    /// both ways: the first [`MAX_PAYLOAD`] bytes of a message too large for one frame. The
    /// parts of a message are consecutive on the wire and end with a frame of the message's
    /// own kind holding the rest; readers hand out the joined message only.
    Part = 11,
}

impl Kind {
    pub fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Call,
            2 => Kind::Event,
            3 => Kind::Stdin,
            4 => Kind::Stdout,
            5 => Kind::Stderr,
            6 => Kind::Eof,
            7 => Kind::Cancel,
            8 => Kind::Credit,
            9 => Kind::Control,
            10 => Kind::Init,
            11 => Kind::Part,
            _ => return None,
        })
    }
}

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("peer closed the connection")]
    Closed,
    #[error("frame of {0} bytes is larger than the limit")]
    TooLarge(u32),
    #[error("message of more than {0} bytes is larger than the limit")]
    MessageTooLarge(usize),
    #[error("a split message on stream {0} was interrupted by stream {1}")]
    BadPart(u32, u32),
    #[error("frame too short")]
    Short,
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    #[error("bad JSON in {kind:?} frame: {source}")]
    Json {
        kind: Kind,
        #[source]
        source: serde_json::Error,
    },
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

/// One frame.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    pub stream: u32,
    pub kind: Kind,
    pub payload: Bytes,
}

impl Frame {
    pub fn new(stream: u32, kind: Kind, payload: impl Into<Bytes>) -> Self {
        Frame {
            stream,
            kind,
            payload: payload.into(),
        }
    }

    /// A frame whose payload is `value` as JSON.
    pub fn json<T: serde::Serialize>(stream: u32, kind: Kind, value: &T) -> Self {
        let payload = serde_json::to_vec(value).expect("protocol types always serialize");
        Frame::new(stream, kind, payload)
    }

    pub fn credit(stream: u32, bytes: u32) -> Self {
        Frame::new(stream, Kind::Credit, bytes.to_be_bytes().to_vec())
    }

    /// Parses the JSON payload.
    pub fn parse<T: serde::de::DeserializeOwned>(&self) -> Result<T, FrameError> {
        serde_json::from_slice(&self.payload).map_err(|source| FrameError::Json {
            kind: self.kind,
            source,
        })
    }

    /// The value of a CREDIT frame.
    pub fn credit_value(&self) -> Result<u32, FrameError> {
        let b: [u8; 4] = self.payload[..].try_into().map_err(|_| FrameError::Short)?;
        Ok(u32::from_be_bytes(b))
    }

    /// Header + payload, ready to write.
    pub fn encode(&self) -> BytesMut {
        let mut buf = BytesMut::with_capacity(9 + self.payload.len());
        self.encode_into(&mut buf);
        buf
    }

    /// True when the message fits [`MAX_MESSAGE`] (larger ones must not be sent).
    pub fn fits(&self) -> bool {
        self.payload.len() <= MAX_MESSAGE
    }

    /// Appends the frame to `buf`; a payload over [`MAX_PAYLOAD`] goes out as [`Kind::Part`]
    /// frames followed by the final one, all consecutive.
    pub fn encode_into(&self, buf: &mut BytesMut) {
        let mut rest = &self.payload[..];
        while rest.len() > MAX_PAYLOAD {
            let (part, tail) = rest.split_at(MAX_PAYLOAD);
            put_frame(buf, self.stream, Kind::Part, part);
            rest = tail;
        }
        put_frame(buf, self.stream, self.kind, rest);
    }

    /// Joins a part or final frame onto the parts read before it (`parts`: their stream and
    /// bytes). `Some` once the message is complete.
    fn join(parts: &mut Option<(u32, BytesMut)>, f: Frame) -> Result<Option<Frame>, FrameError> {
        match parts {
            None if f.kind != Kind::Part => return Ok(Some(f)),
            None => {
                *parts = Some((f.stream, BytesMut::from(&f.payload[..])));
                return Ok(None);
            }
            Some((stream, acc)) => {
                if *stream != f.stream {
                    return Err(FrameError::BadPart(*stream, f.stream));
                }
                if acc.len() + f.payload.len() > MAX_MESSAGE {
                    return Err(FrameError::MessageTooLarge(MAX_MESSAGE));
                }
                acc.extend_from_slice(&f.payload);
            }
        }
        if f.kind == Kind::Part {
            return Ok(None);
        }
        let (stream, acc) = parts.take().expect("parts were checked above");
        Ok(Some(Frame {
            stream,
            kind: f.kind,
            payload: acc.freeze(),
        }))
    }

    fn decode_body(len: u32, body: Vec<u8>) -> Result<Frame, FrameError> {
        if len < 5 {
            return Err(FrameError::Short);
        }
        let stream = u32::from_be_bytes([body[0], body[1], body[2], body[3]]);
        let kind = Kind::from_u8(body[4]).ok_or(FrameError::UnknownKind(body[4]))?;
        let payload = Bytes::from(body).slice(5..);
        Ok(Frame {
            stream,
            kind,
            payload,
        })
    }

    /// Reads one message from an async reader (its parts joined).
    pub async fn read_async<R: AsyncRead + Unpin>(r: &mut R) -> Result<Frame, FrameError> {
        let mut parts = None;
        loop {
            let f = Self::read_one_async(r).await?;
            if let Some(f) = Self::join(&mut parts, f)? {
                return Ok(f);
            }
        }
    }

    async fn read_one_async<R: AsyncRead + Unpin>(r: &mut R) -> Result<Frame, FrameError> {
        let mut len = [0u8; 4];
        match r.read_exact(&mut len).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Err(FrameError::Closed)
            }
            Err(e) => return Err(e.into()),
        }
        let len = u32::from_be_bytes(len);
        if len > MAX_FRAME {
            return Err(FrameError::TooLarge(len));
        }
        if len < 5 {
            return Err(FrameError::Short);
        }
        let mut body = vec![0u8; len as usize];
        r.read_exact(&mut body).await.map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                FrameError::Closed
            } else {
                e.into()
            }
        })?;
        Frame::decode_body(len, body)
    }

    /// Writes one frame to an async writer (not flushed).
    pub async fn write_async<W: AsyncWrite + Unpin>(&self, w: &mut W) -> Result<(), FrameError> {
        w.write_all(&self.encode()).await?;
        Ok(())
    }

    /// Reads one message, blocking (its parts joined).
    pub fn read_blocking<R: Read>(r: &mut R) -> Result<Frame, FrameError> {
        let mut parts = None;
        loop {
            let f = Self::read_one_blocking(r)?;
            if let Some(f) = Self::join(&mut parts, f)? {
                return Ok(f);
            }
        }
    }

    fn read_one_blocking<R: Read>(r: &mut R) -> Result<Frame, FrameError> {
        let mut len = [0u8; 4];
        match r.read_exact(&mut len) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Err(FrameError::Closed)
            }
            Err(e) => return Err(e.into()),
        }
        let len = u32::from_be_bytes(len);
        if !(5..=MAX_FRAME).contains(&len) {
            return Err(FrameError::TooLarge(len));
        }
        let mut body = vec![0u8; len as usize];
        r.read_exact(&mut body)?;
        Frame::decode_body(len, body)
    }

    /// Writes one frame, blocking.
    pub fn write_blocking<W: Write>(&self, w: &mut W) -> Result<(), FrameError> {
        w.write_all(&self.encode())?;
        w.flush()?;
        Ok(())
    }
}

fn put_frame(buf: &mut BytesMut, stream: u32, kind: Kind, payload: &[u8]) {
    buf.reserve(9 + payload.len());
    buf.put_u32(5 + payload.len() as u32);
    buf.put_u32(stream);
    buf.put_u8(kind as u8);
    buf.put_slice(payload);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_round_trip_async_and_blocking() {
        let frames = vec![
            Frame::new(1, Kind::Stdout, &b"hello"[..]),
            Frame::credit(7, 65536),
            Frame::new(u32::MAX, Kind::Eof, Bytes::new()),
        ];
        let mut wire = Vec::new();
        for f in &frames {
            wire.extend_from_slice(&f.encode());
        }
        let mut r = &wire[..];
        for f in &frames {
            assert_eq!(&Frame::read_async(&mut r).await.unwrap(), f);
        }
        assert!(matches!(
            Frame::read_async(&mut r).await,
            Err(FrameError::Closed)
        ));
        let mut r = &wire[..];
        for f in &frames {
            assert_eq!(&Frame::read_blocking(&mut r).unwrap(), f);
        }
        assert_eq!(frames[1].credit_value().unwrap(), 65536);
    }

    #[tokio::test]
    async fn messages_of_any_size_around_the_frame_limit_round_trip() {
        let sizes = [
            0,
            1,
            MAX_PAYLOAD - 1,
            MAX_PAYLOAD,
            MAX_PAYLOAD + 1,
            2 * MAX_PAYLOAD,
            2 * MAX_PAYLOAD + 7,
            5 * MAX_PAYLOAD - 3,
        ];
        let mut wire = BytesMut::new();
        let mut sent = Vec::new();
        for (i, n) in sizes.iter().enumerate() {
            let payload: Vec<u8> = (0..*n).map(|b| (b % 251) as u8).collect();
            let f = Frame::new(i as u32 + 1, Kind::Event, payload);
            assert!(f.fits());
            f.encode_into(&mut wire);
            // Every frame on the wire stays within the frame limit.
            sent.push(f);
        }
        let mut r = &wire[..];
        while !r.is_empty() {
            let len = u32::from_be_bytes(r[..4].try_into().unwrap());
            assert!(len <= MAX_FRAME);
            r = &r[4 + len as usize..];
        }
        let mut r = &wire[..];
        for f in &sent {
            assert_eq!(&Frame::read_async(&mut r).await.unwrap(), f);
        }
        let mut r = &wire[..];
        for f in &sent {
            assert_eq!(&Frame::read_blocking(&mut r).unwrap(), f);
        }
        assert!(!Frame::new(1, Kind::Event, vec![0u8; MAX_MESSAGE + 1]).fits());
    }

    #[tokio::test]
    async fn hostile_frames_are_errors_not_panics() {
        let cases: Vec<Vec<u8>> = vec![
            vec![0, 0, 0, 1, 0],
            vec![0xff, 0xff, 0xff, 0xff],
            vec![0, 0, 0, 5, 0, 0, 0, 1, 99],
            vec![0, 0, 0, 9, 0, 0],
        ];
        for c in cases {
            let mut r = &c[..];
            assert!(Frame::read_async(&mut r).await.is_err());
        }
        // Parts of one message interrupted by another stream, and a message over the limit.
        let mut wire = BytesMut::new();
        put_frame(&mut wire, 1, Kind::Part, b"ab");
        put_frame(&mut wire, 2, Kind::Event, b"cd");
        let mut r = &wire[..];
        assert!(matches!(
            Frame::read_async(&mut r).await,
            Err(FrameError::BadPart(1, 2))
        ));
        let mut wire = BytesMut::new();
        for _ in 0..=MAX_MESSAGE / MAX_PAYLOAD {
            put_frame(&mut wire, 1, Kind::Part, &[b'x'; MAX_PAYLOAD]);
        }
        let mut r = &wire[..];
        assert!(matches!(
            Frame::read_async(&mut r).await,
            Err(FrameError::MessageTooLarge(_))
        ));
        let f = Frame::new(1, Kind::Credit, &b"ab"[..]);
        assert!(f.credit_value().is_err());
        let f = Frame::new(1, Kind::Event, &b"{nope"[..]);
        assert!(f.parse::<crate::Event>().is_err());
    }
}
