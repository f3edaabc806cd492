//! `warren cp SRC DST`: copies one file between the host and a sandbox, docker-style.
//!
//! One side is `ID:/path` (a sandbox path, absolute), the other a local path or `-` for
//! stdin/stdout. Both sides may be sandboxes. Bytes are streamed, never held whole.
//! Directories are not copied.

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

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<i32> {
    let src = Location::parse(&args.src)?;
    let dst = Location::parse(&args.dst)?;
    let client = ctx.client()?;
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
    }
}
