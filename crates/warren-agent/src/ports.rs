//! `Call::Connect`: a TCP connection to a port of the sandbox's loopback, relayed over the
//! daemon's connection (how the daemon reaches ports inside a VM guest, whose loopback it
//! cannot reach otherwise).
//!
//! What the daemon sends (STDIN frames) is written to the connection by a task of its own, so
//! a server busy writing its answer never stops the relay from reading it; what the server
//! sends goes back as STDOUT frames within the daemon's credit. The stream ends with `Done`
//! when the server closes its end, or when the daemon cancels.

use std::net::Ipv4Addr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use warren_proto::{Event, Frame, Kind};
use warren_types::ErrorCode;

use crate::wire::{event, Inbox, Out};

/// Largest STDOUT frame of a relay.
const CHUNK: usize = 64 * 1024;

/// Connects to `127.0.0.1:port` and relays until either end is done.
pub async fn relay(port: u16, window: u32, id: u32, mut inbox: Inbox, out: &Out) -> Event {
    let sock = match tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)).await {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            return Event::error(
                ErrorCode::PortUnreachable,
                format!("nothing listens on port {port} inside the sandbox (connection refused)"),
            )
        }
        Err(e) => {
            return Event::error(
                ErrorCode::PortUnreachable,
                format!("cannot connect to port {port} inside the sandbox: {e}"),
            )
        }
    };
    let _ = sock.set_nodelay(true);
    if !event(out, id, &Event::Connected).await {
        return Event::Done;
    }
    let (mut rd, mut wr) = sock.into_split();
    // Input for the connection: a bounded queue, so a server that stops reading holds the
    // daemon's frames back instead of growing this agent.
    let (input, mut queued) = mpsc::channel::<Option<bytes::Bytes>>(16);
    let writer = tokio::task::spawn_local(async move {
        while let Some(chunk) = queued.recv().await {
            match chunk {
                Some(data) => {
                    if wr.write_all(&data).await.is_err() {
                        return;
                    }
                }
                None => {
                    let _ = wr.shutdown().await;
                    return;
                }
            }
        }
    });
    let mut credit = u64::from(window);
    let mut buf = vec![0u8; CHUNK];
    let end = loop {
        let want = (credit as usize).min(CHUNK);
        tokio::select! {
            frame = inbox.recv() => match frame {
                Some(f) if f.kind == Kind::Stdin => {
                    // A writer that ended (the server stopped reading) drops further input.
                    let _ = input.send(Some(f.payload)).await;
                }
                Some(f) if f.kind == Kind::Eof => {
                    let _ = input.send(None).await;
                }
                Some(f) if f.kind == Kind::Credit => {
                    credit += u64::from(f.credit_value().unwrap_or(0));
                }
                Some(f) if f.kind == Kind::Cancel => break Event::Done,
                Some(_) => {}
                None => break Event::Done,
            },
            read = rd.read(&mut buf[..want]), if want > 0 => match read {
                Ok(0) => break Event::Done,
                Ok(n) => {
                    credit -= n as u64;
                    if out.send(Frame::new(id, Kind::Stdout, buf[..n].to_vec())).await.is_err() {
                        break Event::Done;
                    }
                }
                Err(e) => {
                    break Event::error(
                        ErrorCode::PortUnreachable,
                        format!("the connection to port {port} failed: {e}"),
                    )
                }
            },
        }
    };
    writer.abort();
    end
}
