//! The build context (a directory the API unpacked from the request's tar) and
//! `.dockerignore`: which files `COPY` and `ADD` may take, and how a glob source expands.
//!
//! `.dockerignore` lines are globs over paths relative to the context (`*`, `?`, `[...]`,
//! `**` for any number of directories), `!` re-includes, `#` starts a comment; a pattern that
//! matches a directory excludes everything in it; the last matching line decides.
//!
//! The context is a tar the caller sent, so it may hold symlinks that aim anywhere (`link ->
//! /`). The context lives on the node, so every path read from it is resolved inside it
//! first ([`resolve_in`]), as Docker resolves context paths in their scope: a symlink among
//! a source's parents (or the Dockerfile itself being one) is followed with the context as
//! its root, so no node file outside the context is ever read into a build.

use globset::{GlobBuilder, GlobMatcher};
use std::path::{Path, PathBuf};

use crate::stack::{clean, follow_links, LinkError};
use crate::BuildError;

/// One `.dockerignore` rule.
#[derive(Debug, Clone)]
struct Rule {
    glob: GlobMatcher,
    exclude: bool,
}

/// The build context.
#[derive(Debug, Clone)]
pub struct Context {
    root: PathBuf,
    rules: Vec<Rule>,
}

/// `rel` relative to the context `root`, with every symlink among its parents followed
/// inside the context ([`follow_links`]): a link's absolute target starts at the root, and
/// `..` never climbs above it. The last component is followed too when `follow_last` (a
/// symlink that is itself copied is kept as a symlink). Only paths under `root` whose
/// parents are real directories are ever looked at, so nothing outside the context is
/// touched.
pub fn resolve_in(root: &Path, rel: &Path, follow_last: bool) -> std::io::Result<PathBuf> {
    follow_links(rel, follow_last, |p| {
        let real = root.join(p);
        let m = std::fs::symlink_metadata(&real).ok()?;
        m.file_type().is_symlink().then_some(real)
    })
    .map_err(|e| match e {
        LinkError::TooMany => std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("too many symbolic links resolving {}", rel.display()),
        ),
        LinkError::Read(_, e) => e,
    })
}

/// The text of the context's regular file `rel` (the Dockerfile, `.dockerignore`), its
/// symlinks followed inside the context ([`resolve_in`]).
pub fn read_text(root: &Path, rel: &Path) -> std::io::Result<String> {
    let p = root.join(resolve_in(root, rel, true)?);
    if !std::fs::symlink_metadata(&p)?.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file of the build context",
        ));
    }
    std::fs::read_to_string(p)
}

pub(crate) fn glob(pattern: &str) -> Result<GlobMatcher, BuildError> {
    GlobBuilder::new(pattern)
        .literal_separator(true)
        .backslash_escape(true)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(|e| BuildError::Invalid(format!("bad pattern {pattern:?}: {e}")))
}

/// Whether `s` has glob characters.
pub fn is_glob(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

impl Context {
    /// The context at `root`, with its `.dockerignore` (if any) read.
    pub fn open(root: &Path) -> Result<Context, BuildError> {
        let mut rules = Vec::new();
        if let Ok(text) = read_text(root, Path::new(".dockerignore")) {
            for line in text.lines() {
                let l = line.trim();
                if l.is_empty() || l.starts_with('#') {
                    continue;
                }
                let (exclude, pat) = match l.strip_prefix('!') {
                    Some(p) => (false, p.trim()),
                    None => (true, l),
                };
                let pat = clean(Path::new(pat));
                let Some(pat) = pat.to_str() else { continue };
                if pat.is_empty() {
                    continue;
                }
                rules.push(Rule {
                    glob: glob(pat)?,
                    exclude,
                });
            }
        }
        Ok(Context {
            root: root.to_path_buf(),
            rules,
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Whether `.dockerignore` leaves `rel` out (itself or a directory above it matched).
    pub fn ignored(&self, rel: &Path) -> bool {
        let mut verdict = false;
        for r in &self.rules {
            let mut p = Some(rel);
            while let Some(cur) = p {
                if cur.as_os_str().is_empty() {
                    break;
                }
                if r.glob.is_match(cur) {
                    verdict = r.exclude;
                    break;
                }
                p = cur.parent();
            }
        }
        verdict
    }

    /// Every path of the context that is not ignored (relative, sorted).
    pub fn files(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        let mut stack = vec![PathBuf::new()];
        while let Some(rel) = stack.pop() {
            let Ok(rd) = std::fs::read_dir(self.root.join(&rel)) else {
                continue;
            };
            for e in rd.flatten() {
                let r = rel.join(e.file_name());
                if self.ignored(&r) {
                    // A re-included path below an ignored directory is still found.
                    if e.file_type().is_ok_and(|t| t.is_dir())
                        && self.rules.iter().any(|x| !x.exclude)
                    {
                        stack.push(r);
                    }
                    continue;
                }
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(r.clone());
                }
                out.push(r);
            }
        }
        out.sort();
        out
    }

    /// The context paths a `COPY` source names: a glob expands to what it matches, a plain
    /// path must exist (and not be ignored).
    pub fn expand(&self, source: &str) -> Result<Vec<PathBuf>, BuildError> {
        let rel = clean(Path::new(source));
        if is_glob(source) {
            let pat = rel.to_str().unwrap_or_default();
            let g = glob(pat)?;
            let found: Vec<PathBuf> = self.files().into_iter().filter(|p| g.is_match(p)).collect();
            if found.is_empty() {
                return Err(BuildError::Invalid(format!(
                    "no file of the build context matches {source:?}"
                )));
            }
            return Ok(found);
        }
        let named = rel;
        let rel = resolve_in(&self.root, &named, false)
            .map_err(|e| BuildError::Invalid(format!("{source:?}: {e}")))?;
        let p = self.root.join(&rel);
        let ignored = |r: &Path| !r.as_os_str().is_empty() && self.ignored(r);
        if std::fs::symlink_metadata(&p).is_err() || ignored(&named) || ignored(&rel) {
            return Err(BuildError::Invalid(format!(
                "{source:?} is not in the build context{}",
                if ignored(&named) || ignored(&rel) {
                    " (.dockerignore excludes it)"
                } else {
                    ""
                }
            )));
        }
        Ok(vec![rel])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A context whose tar held symlinks out of it (absolute and by `..`), one inside it, a
    /// loop, and a Dockerfile that is a link to a node file.
    fn hostile() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let outside = d.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("secret"), "node secret").unwrap();
        let ctx = d.path().join("ctx");
        std::fs::create_dir_all(ctx.join("real")).unwrap();
        std::fs::write(ctx.join("real/file"), "in context").unwrap();
        symlink(&outside, ctx.join("link")).unwrap();
        symlink("../outside", ctx.join("up")).unwrap();
        symlink("real", ctx.join("inner")).unwrap();
        symlink("/real", ctx.join("abs")).unwrap();
        symlink("b", ctx.join("a")).unwrap();
        symlink("a", ctx.join("b")).unwrap();
        symlink(outside.join("secret"), ctx.join("Dockerfile")).unwrap();
        symlink("real/file", ctx.join("Dockerfile.in")).unwrap();
        (d, ctx, outside)
    }

    #[test]
    fn sources_through_symlinks_stay_in_the_context() {
        let (_d, ctx, outside) = hostile();
        let c = Context::open(&ctx).unwrap();
        let via_host_path = format!("{}/secret", outside.display());
        for escape in ["link/secret", "up/secret", via_host_path.as_str()] {
            let e = c.expand(escape).unwrap_err();
            assert!(matches!(e, BuildError::Invalid(_)), "{escape}: {e}");
        }
        // Links inside the context are followed there, as Docker does.
        assert_eq!(
            c.expand("inner/file").unwrap(),
            vec![PathBuf::from("real/file")]
        );
        assert_eq!(
            c.expand("abs/file").unwrap(),
            vec![PathBuf::from("real/file")]
        );
        // A source that is itself a link is copied as a link (not followed).
        assert_eq!(c.expand("link").unwrap(), vec![PathBuf::from("link")]);
        let e = c.expand("a/x").unwrap_err();
        assert!(e.to_string().contains("too many symbolic links"), "{e}");
    }

    #[test]
    fn a_copy_plan_never_reads_a_node_file() {
        let (_d, ctx, _outside) = hostile();
        let c = Context::open(&ctx).unwrap();
        let under = crate::stack::StackView::default();
        for src in ["link/secret", "up/secret"] {
            let r = crate::copy::plan_copy(
                crate::copy::Source::Context(&c),
                &[src.to_string()],
                &[],
                "/x",
                crate::copy::Options::default(),
                &under,
                None,
            );
            assert!(r.is_err(), "{src} was planned: {:?}", r.map(|p| p.entries));
        }
        let p = crate::copy::plan_copy(
            crate::copy::Source::Context(&c),
            &["inner/file".to_string()],
            &[],
            "/x",
            crate::copy::Options::default(),
            &under,
            None,
        )
        .unwrap();
        let f = p.entries.iter().find(|e| e.dest == Path::new("x")).unwrap();
        assert!(f.src.starts_with(&ctx), "{}", f.src.display());
    }

    #[test]
    fn the_dockerfile_is_read_inside_the_context() {
        let (_d, ctx, _outside) = hostile();
        let e = read_text(&ctx, Path::new("Dockerfile")).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
        assert_eq!(
            read_text(&ctx, Path::new("Dockerfile.in")).unwrap(),
            "in context"
        );
        assert!(read_text(&ctx, Path::new("real")).is_err());
        // A .dockerignore that is a link out of the context is not read either.
        std::fs::write(ctx.join("real/ignore"), "real\n").unwrap();
        symlink("real/ignore", ctx.join(".dockerignore")).unwrap();
        let c = Context::open(&ctx).unwrap();
        assert!(c.ignored(Path::new("real/file")));
    }
}
