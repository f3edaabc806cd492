//! The build context (a directory the API unpacked from the request's tar) and
//! `.dockerignore`: which files `COPY` and `ADD` may take, and how a glob source expands.
//!
//! `.dockerignore` lines are globs over paths relative to the context (`*`, `?`, `[...]`,
//! `**` for any number of directories), `!` re-includes, `#` starts a comment; a pattern that
//! matches a directory excludes everything in it; the last matching line decides.

use globset::{GlobBuilder, GlobMatcher};
use std::path::{Path, PathBuf};

use crate::stack::clean;
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
        if let Ok(text) = std::fs::read_to_string(root.join(".dockerignore")) {
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
        let p = self.root.join(&rel);
        if std::fs::symlink_metadata(&p).is_err()
            || (!rel.as_os_str().is_empty() && self.ignored(&rel))
        {
            return Err(BuildError::Invalid(format!(
                "{source:?} is not in the build context{}",
                if self.ignored(&rel) {
                    " (.dockerignore excludes it)"
                } else {
                    ""
                }
            )));
        }
        Ok(vec![rel])
    }
}
