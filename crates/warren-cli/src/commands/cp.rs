//! `warren cp SRC DST`: copies a file or a directory between the host and a sandbox,
//! docker-style.
//!
//! One side is `ID:/path` (a sandbox path, absolute), the other a local path or `-` for
//! stdin/stdout. Both sides may be sandboxes. Bytes are streamed, never held whole.
//! Directories go as a tar stream (modes, symlinks and mtimes kept): into `DST/NAME` when
//! `DST` is an existing directory, else as `DST` itself.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use futures::StreamExt;
use tokio::io::AsyncWriteExt;
use warren_client::{Client, FileKind};

use super::Ctx;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Source: ID:/path, a local path, or - for stdin
    pub src: String,
    /// Destination: ID:/path, a local path, or - for stdout
    pub dst: String,
    /// Copy directories (recursive); a directory source is copied recursively anyway
    #[arg(long, short = 'r')]
    pub recursive: bool,
}

/// One side of a copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    Local(PathBuf),
    /// `-`: stdin as a source, stdout as a destination.
    Stdio,
    Sandbox {
        id: String,
        path: String,
    },
}

impl Location {
    /// Reads an argument: `-`, `ID:/path`, or a local path. Paths that start with `/` or `.`
    /// are always local, so a local file whose name holds a colon can be named `./a:b`.
    pub fn parse(s: &str) -> anyhow::Result<Location> {
        if s == "-" {
            return Ok(Location::Stdio);
        }
        if s.is_empty() {
            anyhow::bail!("empty path");
        }
        if s.starts_with('/') || s.starts_with('.') {
            return Ok(Location::Local(PathBuf::from(s)));
        }
        match s.split_once(':') {
            Some((id, path)) if !id.is_empty() && !id.contains('/') => {
                if !path.starts_with('/') {
                    anyhow::bail!("sandbox path in {s:?} must be absolute (ID:/path)");
                }
                Ok(Location::Sandbox {
                    id: id.to_string(),
                    path: path.to_string(),
                })
            }
            _ => Ok(Location::Local(PathBuf::from(s))),
        }
    }
}

/// The last component of a path, for copies into a directory.
fn base_name(path: &str) -> Option<&str> {
    path.trim_end_matches('/')
        .rsplit('/')
        .next()
        .filter(|b| !b.is_empty() && *b != "..")
}

/// Where a file lands in the sandbox: into the directory when `path` ends with `/` or names
/// an existing directory.
async fn remote_target(
    client: &Client,
    id: &str,
    path: &str,
    src_name: Option<&str>,
) -> anyhow::Result<String> {
    let is_dir = path.ends_with('/')
        || match client.stat(id, path).await {
            Ok(st) => st.kind == FileKind::Dir,
            Err(e) if e.is_not_found() => false,
            Err(e) => return Err(e).with_context(|| format!("stat {id}:{path}")),
        };
    if !is_dir {
        return Ok(path.to_string());
    }
    let name = src_name.context("the source has no file name; name the destination file")?;
    Ok(format!("{}/{name}", path.trim_end_matches('/')))
}

/// Where a file lands locally: into the directory when `path` is one.
fn local_target(path: &Path, src_name: Option<&str>) -> anyhow::Result<PathBuf> {
    if path.is_dir() {
        let name = src_name.context("the source has no file name; name the destination file")?;
        Ok(path.join(name))
    } else {
        Ok(path.to_path_buf())
    }
}

/// Is the sandbox path a directory? (Missing: no.)
async fn remote_is_dir(client: &Client, id: &str, path: &str) -> anyhow::Result<bool> {
    match client.stat(id, path).await {
        Ok(st) => Ok(st.kind == FileKind::Dir),
        Err(e) if e.is_not_found() => Ok(false),
        Err(e) => Err(e).with_context(|| format!("stat {id}:{path}")),
    }
}

/// Where a copied directory lands: inside `dst` when it is an existing directory.
fn dir_target(dst_is_dir: bool, dst: &str, src_name: Option<&str>) -> anyhow::Result<String> {
    if !dst_is_dir {
        return Ok(dst.to_string());
    }
    let name = src_name.context("the source has no name; name the destination directory")?;
    Ok(format!("{}/{name}", dst.trim_end_matches('/')))
}

/// Copies a directory when the source is one; false when it is not (a file copy follows).
async fn copy_dir(client: &Client, src: &Location, dst: &Location) -> anyhow::Result<bool> {
    match (src, dst) {
        (Location::Local(local), Location::Sandbox { id, path }) if local.is_dir() => {
            let name = std::fs::canonicalize(local)
                .ok()
                .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
            let is_dir = remote_is_dir(client, id, path).await?;
            let target = dir_target(is_dir, path, name.as_deref())?;
            client
                .upload_dir(id, local, &target)
                .await
                .with_context(|| format!("copying {} to {id}:{target}", local.display()))?;
            Ok(true)
        }
        (Location::Sandbox { id, path }, Location::Local(local)) => {
            if !remote_is_dir(client, id, path).await? {
                return Ok(false);
            }
            let target = dir_target(local.is_dir(), &local.to_string_lossy(), base_name(path))?;
            client
                .download_dir(id, path, &target)
                .await
                .with_context(|| format!("copying {id}:{path} to {target}"))?;
            Ok(true)
        }
        (
            Location::Sandbox {
                id: sid,
                path: spath,
            },
            Location::Sandbox { id, path },
        ) => {
            if !remote_is_dir(client, sid, spath).await? {
                return Ok(false);
            }
            let is_dir = remote_is_dir(client, id, path).await?;
            let target = dir_target(is_dir, path, base_name(spath))?;
            let tar = client
                .read_tar(sid, spath)
                .await
                .with_context(|| format!("reading {sid}:{spath}"))?;
            client
                .write_tar(id, &target, tar)
                .await
                .with_context(|| format!("copying {sid}:{spath} to {id}:{target}"))?;
            Ok(true)
        }
        _ => Ok(false),
    }
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<i32> {
    let src = Location::parse(&args.src)?;
    let dst = Location::parse(&args.dst)?;
    let client = ctx.client()?;
    if copy_dir(&client, &src, &dst).await? {
        return Ok(0);
    }
    match (src, dst) {
        (Location::Sandbox { id, path }, Location::Local(local)) => {
            let target = local_target(&local, base_name(&path))?;
            client
                .download_to(&id, &path, &target)
                .await
                .with_context(|| format!("copying {id}:{path} to {}", target.display()))?;
        }
        (Location::Sandbox { id, path }, Location::Stdio) => {
            let mut stream = client
                .read_file(&id, &path)
                .await
                .with_context(|| format!("reading {id}:{path}"))?;
            let mut out = tokio::io::stdout();
            while let Some(chunk) = stream.next().await {
                out.write_all(&chunk.with_context(|| format!("reading {id}:{path}"))?)
                    .await?;
            }
            out.flush().await?;
        }
        (Location::Local(local), Location::Sandbox { id, path }) => {
            let name = local
                .file_name()
                .and_then(|n| n.to_str())
                .map(str::to_string);
            let target = remote_target(&client, &id, &path, name.as_deref()).await?;
            client
                .upload_from(&id, &local, &target, None)
                .await
                .with_context(|| format!("copying {} to {id}:{target}", local.display()))?;
        }
        (Location::Stdio, Location::Sandbox { id, path }) => {
            client
                .write_file_from(&id, &path, None, tokio::io::stdin())
                .await
                .with_context(|| format!("writing stdin to {id}:{path}"))?;
        }
        (
            Location::Sandbox {
                id: sid,
                path: spath,
            },
            Location::Sandbox { id, path },
        ) => {
            let target = remote_target(&client, &id, &path, base_name(&spath)).await?;
            let st = client
                .stat(&sid, &spath)
                .await
                .with_context(|| format!("stat {sid}:{spath}"))?;
            let stream = client
                .read_file(&sid, &spath)
                .await
                .with_context(|| format!("reading {sid}:{spath}"))?;
            client
                .write_file_sized(&id, &target, Some(st.mode), Some(st.size), stream)
                .await
                .with_context(|| format!("copying {sid}:{spath} to {id}:{target}"))?;
        }
        _ => anyhow::bail!("one side must be a sandbox path, written ID:/path"),
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sb(id: &str, path: &str) -> Location {
        Location::Sandbox {
            id: id.into(),
            path: path.into(),
        }
    }

    #[test]
    fn locations_parse() {
        assert_eq!(
            Location::parse("n1-abc:/etc/passwd").unwrap(),
            sb("n1-abc", "/etc/passwd")
        );
        assert_eq!(Location::parse("n1-abc:/").unwrap(), sb("n1-abc", "/"));
        assert_eq!(Location::parse("-").unwrap(), Location::Stdio);
        assert_eq!(
            Location::parse("file.txt").unwrap(),
            Location::Local("file.txt".into())
        );
        assert_eq!(
            Location::parse("./a:b").unwrap(),
            Location::Local("./a:b".into())
        );
        assert_eq!(
            Location::parse("/tmp/a:b").unwrap(),
            Location::Local("/tmp/a:b".into())
        );
        assert_eq!(
            Location::parse("dir/a:b").unwrap(),
            Location::Local("dir/a:b".into())
        );
        assert!(Location::parse("n1-abc:relative").is_err());
        assert!(Location::parse("").is_err());
    }

    #[test]
    fn targets() {
        assert_eq!(base_name("/a/b.txt"), Some("b.txt"));
        assert_eq!(base_name("/a/dir/"), Some("dir"));
        assert_eq!(base_name("/"), None);
        let dir = std::env::temp_dir();
        assert_eq!(local_target(&dir, Some("x")).unwrap(), dir.join("x"));
        let file = dir.join("warren-cp-test-no-such-file");
        assert_eq!(local_target(&file, Some("x")).unwrap(), file);
        assert!(local_target(&dir, None).is_err());
        assert_eq!(
            dir_target(false, "/w/repo", Some("src")).unwrap(),
            "/w/repo"
        );
        assert_eq!(dir_target(true, "/w/", Some("src")).unwrap(), "/w/src");
        assert!(dir_target(true, "/w", None).is_err());
    }
}
