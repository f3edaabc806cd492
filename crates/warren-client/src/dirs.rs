//! Directory copies: the tar routes (`GET|PUT /v1/sandboxes/{id}/files/tar`) and helpers that
//! pack a local directory into an upload or unpack a download into a local directory, streamed
//! (one chunk held at a time), keeping modes, symlinks and mtimes.
//!
//! Local unpacking refuses entries that would leave the destination (`..`, absolute names,
//! writes through symlinks), as the daemon does inside the sandbox.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use futures::{Stream, StreamExt, TryStreamExt};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper::Method;

use crate::client::{enc, seg, Body, Client};
use crate::error::{BoxError, ClientError};
use crate::stream::ByteStream;

const TAR: &str = "application/x-tar";
const CHUNK: usize = 256 << 10;

fn tar_path(id: &str, path: &str) -> String {
    format!("/v1/sandboxes/{}/files/tar?path={}", seg(id), enc(path))
}

/// A `Write` that hands its bytes to an async receiver (from a blocking thread).
struct ChannelWriter(tokio::sync::mpsc::Sender<std::io::Result<Bytes>>);

impl Write for ChannelWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .blocking_send(Ok(Bytes::copy_from_slice(buf)))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "upload stopped"))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A `Read` fed with chunks by an async task (on a blocking thread).
struct ChannelReader {
    rx: tokio::sync::mpsc::Receiver<Bytes>,
    cur: Bytes,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.cur.is_empty() {
            match self.rx.blocking_recv() {
                Some(b) => self.cur = b,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.cur.len());
        buf[..n].copy_from_slice(&self.cur[..n]);
        self.cur = self.cur.slice(n..);
        Ok(n)
    }
}

/// Packs `dir`'s contents (entries named relative to it; symlinks kept as symlinks) into a
/// stream of tar chunks, made on a blocking thread as the stream is read.
pub fn pack_dir(dir: &Path) -> impl Stream<Item = std::io::Result<Bytes>> + Send + 'static {
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(4);
    let dir = dir.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let errors = tx.clone();
        let w = std::io::BufWriter::with_capacity(CHUNK, ChannelWriter(tx));
        let mut b = tar::Builder::new(w);
        b.follow_symlinks(false);
        let r = b
            .append_dir_all(".", &dir)
            .and_then(|()| b.into_inner())
            .and_then(|mut w| w.flush());
        if let Err(e) = r {
            let e = std::io::Error::new(e.kind(), format!("packing {}: {e}", dir.display()));
            let _ = errors.blocking_send(Err(e));
        }
    });
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|c| (c, rx)) })
}

/// Unpacks a tar stream under `dest` (made when missing), keeping modes and mtimes.
pub async fn unpack_into(
    mut stream: impl Stream<Item = Result<Bytes, ClientError>> + Unpin,
    dest: &Path,
) -> Result<(), ClientError> {
    let dest_owned: PathBuf = dest.to_path_buf();
    std::fs::create_dir_all(dest)
        .map_err(|e| ClientError::io(format!("creating {}", dest.display()), e))?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
    let unpack = tokio::task::spawn_blocking(move || {
        let mut a = tar::Archive::new(ChannelReader {
            rx,
            cur: Bytes::new(),
        });
        a.set_preserve_mtime(true);
        a.set_preserve_permissions(true);
        a.set_overwrite(true);
        for entry in a.entries()? {
            let mut entry = entry?;
            // `unpack_in` refuses `..` and writes through symlinks; it answers false for them.
            if !entry.unpack_in(&dest_owned)? {
                let name = entry
                    .path()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default();
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("tar entry {name:?} would leave the destination"),
                ));
            }
        }
        Ok(())
    });
    let mut fed = Ok(());
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(c) => {
                // The unpacker may stop early (an error); then the rest is not needed.
                if tx.send(c).await.is_err() {
                    break;
                }
            }
            Err(e) => {
                fed = Err(e);
                break;
            }
        }
    }
    drop(tx);
    let unpacked = unpack
        .await
        .map_err(|e| ClientError::io("unpacking", std::io::Error::other(e)))?;
    fed?;
    unpacked.map_err(|e| ClientError::io(format!("unpacking into {}", dest.display()), e))
}

impl Client {
    /// `GET /v1/sandboxes/{id}/files/tar?path=`: a directory tree (or one file) of the
    /// sandbox as a tar stream.
    pub async fn read_tar(&self, id: &str, path: &str) -> Result<ByteStream, ClientError> {
        let reply = self
            .send(
                Method::GET,
                &tar_path(id, path),
                crate::client::empty_body(),
                None,
            )
            .await?;
        Ok(reply.into_stream())
    }

    /// `PUT /v1/sandboxes/{id}/files/tar?path=`: unpacks the tar stream `body` under the
    /// sandbox directory `path` (made when missing).
    pub async fn write_tar<S, E>(&self, id: &str, path: &str, body: S) -> Result<(), ClientError>
    where
        S: Stream<Item = Result<Bytes, E>> + Send + 'static,
        E: Into<BoxError> + 'static,
    {
        let frames = body
            .map_ok(Frame::data)
            .map_err(|e| std::io::Error::other(e.into()));
        let body: Body = StreamBody::new(frames).boxed_unsync();
        self.send(
            Method::PUT,
            &tar_path(id, path),
            crate::client::Payload::stream(body),
            Some(TAR),
        )
        .await?
        .drain()
        .await
    }

    /// Copies the local directory `local`'s contents into the sandbox directory `remote`
    /// (made when missing), keeping modes, symlinks and mtimes.
    pub async fn upload_dir(
        &self,
        id: &str,
        local: impl AsRef<Path>,
        remote: &str,
    ) -> Result<(), ClientError> {
        let local = local.as_ref();
        let md = std::fs::metadata(local)
            .map_err(|e| ClientError::io(format!("reading {}", local.display()), e))?;
        if !md.is_dir() {
            return Err(ClientError::io(
                format!("{} is not a directory", local.display()),
                std::io::Error::from(std::io::ErrorKind::NotADirectory),
            ));
        }
        self.write_tar(id, remote, pack_dir(local)).await
    }

    /// Copies the sandbox directory `remote`'s contents into the local directory `local`
    /// (made when missing), keeping modes, symlinks and mtimes.
    pub async fn download_dir(
        &self,
        id: &str,
        remote: &str,
        local: impl AsRef<Path>,
    ) -> Result<(), ClientError> {
        let stream = self.read_tar(id, remote).await?;
        unpack_into(stream, local.as_ref()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_directory_packs_and_unpacks_with_modes_symlinks_and_mtimes() {
        let src = tempfile::tempdir().unwrap();
        std::fs::create_dir(src.path().join("sub")).unwrap();
        std::fs::write(src.path().join("sub/run.sh"), "echo hi\n").unwrap();
        std::fs::set_permissions(
            src.path().join("sub/run.sh"),
            std::fs::Permissions::from_mode(0o751),
        )
        .unwrap();
        std::os::unix::fs::symlink("sub/run.sh", src.path().join("link")).unwrap();
        let t = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_500_000_000);
        std::fs::File::options()
            .write(true)
            .open(src.path().join("sub/run.sh"))
            .unwrap()
            .set_modified(t)
            .unwrap();
        let chunks: Vec<Bytes> = pack_dir(src.path()).try_collect().await.unwrap();
        let dst = tempfile::tempdir().unwrap();
        let target = dst.path().join("copy");
        let stream = futures::stream::iter(chunks.into_iter().map(Ok));
        unpack_into(stream, &target).await.unwrap();
        let md = std::fs::metadata(target.join("sub/run.sh")).unwrap();
        assert_eq!((md.mode() & 0o7777, md.mtime()), (0o751, 1_500_000_000));
        assert_eq!(
            std::fs::read_link(target.join("link")).unwrap(),
            Path::new("sub/run.sh")
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn unpacking_refuses_to_leave_the_destination() {
        let outside = tempfile::tempdir().unwrap();
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        h.set_mode(0o777);
        b.append_link(&mut h, "esc", outside.path()).unwrap();
        let mut h = tar::Header::new_gnu();
        h.set_size(1);
        h.set_mode(0o644);
        b.append_data(&mut h, "esc/owned", &b"x"[..]).unwrap();
        let tar = Bytes::from(b.into_inner().unwrap());
        let dst = tempfile::tempdir().unwrap();
        let r = unpack_into(futures::stream::iter([Ok(tar)]), dst.path()).await;
        assert!(r.is_err(), "{r:?}");
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
    }
}
