//! Reaching a TCP port inside a sandbox: [`Instance::connect_port`](crate::Instance) hands
//! out a byte stream to `127.0.0.1:<port>` as the sandbox sees it. What flows over it (HTTP,
//! an upgrade) is the caller's business; this module never sees HTTP.
//!
//! A container's stream is a plain TCP socket made inside the sandbox's network namespace
//! ([`connect_in_netns`]): a socket keeps the namespace it was created in, so only its
//! creation needs to be there. That happens on a thread of its own that joins the namespace,
//! makes the socket and ends: no runtime thread ever changes namespace, and no thread is left
//! in one. The connect itself then runs on the async runtime like any other.
//!
//! A VM's guest loopback is out of the host's reach whatever its network: its stream is
//! relayed by the guest's agent over the agent connection ([`relayed`], `Call::Connect`).

use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::OwnedFd;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tracing::debug;

use crate::agent::{ExecStream, StdinSink, StreamItem};
use crate::error::RuntimeError;

/// A byte stream to a port inside a sandbox.
pub trait PortIo: AsyncRead + AsyncWrite + Send + Unpin + 'static {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> PortIo for T {}

/// A connection to a port inside a sandbox, as [`crate::Instance::connect_port`] hands it out.
pub type PortStream = Box<dyn PortIo>;

/// How long a connect to a port inside a sandbox may take. A loopback connect is answered
/// at once (accepted or refused); only a listener whose queue is full makes it wait.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The error of a connect to `port` that failed with `e`.
pub(crate) fn unreachable(port: u16, e: &std::io::Error) -> RuntimeError {
    let message = if e.kind() == std::io::ErrorKind::ConnectionRefused {
        format!("nothing listens on port {port} inside the sandbox (connection refused)")
    } else {
        format!("cannot connect to port {port} inside the sandbox: {e}")
    };
    RuntimeError::PortUnreachable { port, message }
}

/// The error of a connect to `port` that was not answered in time.
pub(crate) fn connect_timed_out(port: u16) -> RuntimeError {
    RuntimeError::PortUnreachable {
        port,
        message: format!(
            "port {port} inside the sandbox did not accept the connection within {} s \
             (its listener's queue is full)",
            CONNECT_TIMEOUT.as_secs()
        ),
    }
}

/// A TCP socket made in the network namespace `netns` (an open `/proc/<pid>/ns/net`), on a
/// thread that ends right after.
pub(crate) async fn socket_in_netns(netns: OwnedFd) -> Result<OwnedFd, RuntimeError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("warren-netns".into())
        .spawn(move || {
            // This thread joins the sandbox's namespace and ends: nothing else ever runs on it.
            let made = warren_sys::ns::setns(&netns, warren_sys::ns::Namespaces::CLONE_NEWNET)
                .and_then(|()| warren_sys::net::tcp_socket());
            let _ = tx.send(made);
        })
        .map_err(|e| RuntimeError::io("a thread for the sandbox's network namespace", e))?;
    let made = rx
        .await
        .map_err(|_| RuntimeError::Protocol(crate::ProtocolError::NetnsThread))?;
    Ok(made?)
}

/// Connects to `127.0.0.1:port` in the network namespace `netns`.
pub(crate) async fn connect_in_netns(
    netns: OwnedFd,
    port: u16,
) -> Result<tokio::net::TcpStream, RuntimeError> {
    let fd = socket_in_netns(netns).await?;
    let socket = tokio::net::TcpSocket::from_std_stream(std::net::TcpStream::from(fd));
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    match tokio::time::timeout(CONNECT_TIMEOUT, socket.connect(addr)).await {
        Ok(Ok(stream)) => {
            // Requests and answers are often small: no Nagle delay on either.
            let _ = stream.set_nodelay(true);
            Ok(stream)
        }
        Ok(Err(e)) => Err(unreachable(port, &e)),
        Err(_) => Err(connect_timed_out(port)),
    }
}

/// Bytes buffered in each direction of a relayed connection.
const RELAY_BUFFER: usize = 256 * 1024;

/// A port reached through the agent ([`crate::AgentConn::connect_port`]) as a byte stream:
/// one end of an in-memory pipe whose other end a task pumps to the agent (`sink`) and from
/// it (`from`). The relay ends when the port's side closes, or when the stream is dropped
/// (its end of input reaches the port; the server's close then ends the rest).
pub(crate) fn relayed(mut from: ExecStream, mut sink: StdinSink) -> PortStream {
    let (ours, theirs) = tokio::io::duplex(RELAY_BUFFER);
    let (mut rd, mut wr) = tokio::io::split(theirs);
    tokio::spawn(async move {
        let up = tokio::spawn(async move {
            let mut buf = bytes::BytesMut::with_capacity(64 * 1024);
            loop {
                buf.reserve(64 * 1024);
                match rd.read_buf(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        if sink.write(buf.split().freeze()).await.is_err() {
                            return;
                        }
                    }
                }
            }
            let _ = sink.close().await;
        });
        while let Some(item) = from.next().await {
            match item {
                Ok(StreamItem::Stdout(data)) => {
                    if wr.write_all(&data).await.is_err() {
                        break;
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    debug!(error = %e, "relayed port connection ended");
                    break;
                }
            }
        }
        let _ = wr.shutdown().await;
        up.abort();
        // Dropping `from` cancels the agent's side if it is still relaying.
    });
    Box::new(ours)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn own_netns() -> OwnedFd {
        std::fs::File::open("/proc/thread-self/ns/net")
            .expect("open our own network namespace")
            .into()
    }

    /// The daemon's own namespace stands in for a sandbox's: the socket is made on another
    /// thread that joins it (allowed for root only, like every setns).
    #[tokio::test]
    async fn connects_through_a_namespace_thread_and_refuses_closed_ports() {
        if !nix::unistd::geteuid().is_root() {
            assert!(
                std::env::var_os("CI").is_none(),
                "needs root (setns) and CI is set"
            );
            eprintln!("skipped: needs root for setns");
            return;
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 4];
            s.read_exact(&mut buf).await.unwrap();
            s.write_all(&buf).await.unwrap();
        });
        let mut c = connect_in_netns(own_netns(), port).await.unwrap();
        c.write_all(b"ping").await.unwrap();
        let mut back = [0u8; 4];
        c.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"ping");
        server.await.unwrap();

        // Bind and drop: nothing listens there now.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = closed.local_addr().unwrap().port();
        drop(closed);
        let e = connect_in_netns(own_netns(), port).await.unwrap_err();
        assert!(
            matches!(e, RuntimeError::PortUnreachable { port: p, .. } if p == port),
            "{e}"
        );
        assert_eq!(e.code(), warren_types::ErrorCode::PortUnreachable);
        assert!(e.to_string().contains("nothing listens"), "{e}");
    }
}
