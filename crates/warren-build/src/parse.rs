//! The Dockerfile parser: text → instructions (keyword, flags, arguments, heredocs, line).
//!
//! Our own, small and line-oriented, rather than a crate: the Rust crates for Dockerfiles we
//! looked at either lack heredocs and the `escape` directive or bring a grammar engine for what
//! is a few rules (directives at the top, `#` comment lines, the escape character continuing a
//! line, `<<WORD` bodies after the line, a JSON array for the exec form). It never panics on any
//! input (a fuzz target, `fuzz/fuzz_targets/dockerfile.rs`, holds it to that) and every refusal
//! names its line.
//!
//! Nothing is substituted here: `$VAR` expansion depends on the `ARG`s and `ENV`s in force at
//! each instruction, which the planner knows (see [`crate::words`]).

use crate::BuildError;

/// Instructions a Dockerfile may hold.
pub const KEYWORDS: &[&str] = &[
    "FROM",
    "RUN",
    "CMD",
    "LABEL",
    "MAINTAINER",
    "EXPOSE",
    "ENV",
    "ADD",
    "COPY",
    "ENTRYPOINT",
    "VOLUME",
    "USER",
    "WORKDIR",
    "ARG",
    "ONBUILD",
    "STOPSIGNAL",
    "HEALTHCHECK",
    "SHELL",
];

/// Longest Dockerfile accepted (bytes).
pub const MAX_DOCKERFILE: usize = 4 << 20;

/// A parsed Dockerfile.
#[derive(Debug, Clone, PartialEq)]
pub struct Dockerfile {
    /// The escape character (`\` unless `# escape=` says `` ` ``).
    pub escape: char,
    pub instructions: Vec<Instruction>,
}

/// One instruction as written.
#[derive(Debug, Clone, PartialEq)]
pub struct Instruction {
    /// 1-based line of its keyword.
    pub line: usize,
    /// Upper case.
    pub keyword: String,
    /// `--name=value` (or `--name`) options before the arguments.
    pub flags: Vec<(String, Option<String>)>,
    pub args: Args,
    /// Bodies of `<<WORD` here-documents, in order.
    pub heredocs: Vec<Heredoc>,
}

/// The arguments after the flags.
#[derive(Debug, Clone, PartialEq)]
pub enum Args {
    /// The rest of the line, continuations joined (without the escape and newline).
    Shell(String),
    /// A JSON array of strings (`["a", "b"]`).
    Exec(Vec<String>),
}

impl Args {
    pub fn text(&self) -> String {
        match self {
            Args::Shell(s) => s.clone(),
            Args::Exec(v) => serde_json::to_string(v).unwrap_or_default(),
        }
    }
}

/// A here-document: `<<WORD` (expanded), `<<"WORD"`/`<<'WORD'` (verbatim), `<<-WORD`
/// (leading tabs stripped).
#[derive(Debug, Clone, PartialEq)]
pub struct Heredoc {
    pub name: String,
    pub body: String,
    pub expand: bool,
    pub strip_tabs: bool,
}

impl Instruction {
    /// The value of flag `name` (`--name=value`), if given.
    pub fn flag(&self, name: &str) -> Option<&str> {
        self.flags
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_deref().unwrap_or(""))
    }

    /// The instruction as written on one line (for logs and errors).
    pub fn display(&self) -> String {
        let mut s = self.keyword.clone();
        for (k, v) in &self.flags {
            s.push_str(" --");
            s.push_str(k);
            if let Some(v) = v {
                s.push('=');
                s.push_str(v);
            }
        }
        let a = self.args.text();
        if !a.is_empty() {
            s.push(' ');
            s.push_str(&a);
        }
        s
    }
}

fn err(line: usize, message: impl Into<String>) -> BuildError {
    BuildError::Parse {
        line,
        message: message.into(),
    }
}

/// Parses a Dockerfile.
pub fn parse(text: &str) -> Result<Dockerfile, BuildError> {
    if text.len() > MAX_DOCKERFILE {
        return Err(err(0, format!("longer than {MAX_DOCKERFILE} bytes")));
    }
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let lines: Vec<&str> = text.split('\n').map(|l| l.trim_end_matches('\r')).collect();
    let mut escape = '\\';
    let mut i = 0;
    // Parser directives: `# key=value` lines at the very top.
    while i < lines.len() {
        let Some(rest) = lines[i].trim_start().strip_prefix('#') else {
            break;
        };
        let Some((k, v)) = rest.split_once('=') else {
            break;
        };
        let k = k.trim().to_ascii_lowercase();
        if k.is_empty() || k.contains(char::is_whitespace) {
            break;
        }
        if k == "escape" {
            escape = match v.trim() {
                "\\" => '\\',
                "`" => '`',
                other => return Err(err(i + 1, format!("invalid escape character {other:?}"))),
            };
        }
        i += 1;
    }
    let mut out = Vec::new();
    while i < lines.len() {
        let first = lines[i];
        let t = first.trim_start();
        if t.is_empty() || t.starts_with('#') {
            i += 1;
            continue;
        }
        let start = i;
        // Join continuation lines (comment and empty lines inside are skipped).
        let mut logical = String::new();
        let mut cur = first;
        loop {
            let trimmed = cur.trim_end();
            if let Some(body) = trimmed.strip_suffix(escape) {
                logical.push_str(body);
                i += 1;
                // Skip comments and blank lines inside a continuation.
                while i < lines.len() {
                    let n = lines[i].trim_start();
                    if n.starts_with('#') || n.is_empty() {
                        i += 1;
                    } else {
                        break;
                    }
                }
                if i >= lines.len() {
                    break;
                }
                cur = lines[i];
            } else {
                logical.push_str(cur);
                i += 1;
                break;
            }
        }
        let logical = logical.trim();
        let (kw, rest) = match logical.find(char::is_whitespace) {
            Some(p) => (&logical[..p], logical[p..].trim_start()),
            None => (logical, ""),
        };
        let keyword = kw.to_ascii_uppercase();
        if !KEYWORDS.contains(&keyword.as_str()) {
            return Err(err(start + 1, format!("unknown instruction {kw:?}")));
        }
        let (flags, rest) = split_flags(rest);
        let names = if matches!(keyword.as_str(), "RUN" | "COPY" | "ADD") {
            heredoc_names(rest)
        } else {
            Vec::new()
        };
        let mut heredocs = Vec::new();
        for (name, expand, strip_tabs) in names {
            let mut body = String::new();
            let mut closed = false;
            while i < lines.len() {
                let l = lines[i];
                i += 1;
                let cmp = if strip_tabs {
                    l.trim_start_matches('\t')
                } else {
                    l
                };
                if cmp == name {
                    closed = true;
                    break;
                }
                body.push_str(cmp);
                body.push('\n');
            }
            if !closed {
                return Err(err(
                    start + 1,
                    format!("here-document <<{name} is not closed"),
                ));
            }
            heredocs.push(Heredoc {
                name,
                body,
                expand,
                strip_tabs,
            });
        }
        let args = if rest.starts_with('[') && heredocs.is_empty() {
            match serde_json::from_str::<Vec<String>>(rest) {
                Ok(v) => Args::Exec(v),
                Err(_) => Args::Shell(rest.to_string()),
            }
        } else {
            Args::Shell(rest.to_string())
        };
        out.push(Instruction {
            line: start + 1,
            keyword,
            flags,
            args,
            heredocs,
        });
    }
    Ok(Dockerfile {
        escape,
        instructions: out,
    })
}

/// Splits leading `--name[=value]` words off `rest`.
fn split_flags(mut rest: &str) -> (Vec<(String, Option<String>)>, &str) {
    let mut flags = Vec::new();
    while let Some(f) = rest.strip_prefix("--") {
        let end = f.find(char::is_whitespace).unwrap_or(f.len());
        let word = &f[..end];
        if word.is_empty() {
            break;
        }
        match word.split_once('=') {
            Some((k, v)) => flags.push((k.to_string(), Some(unquote(v)))),
            None => flags.push((word.to_string(), None)),
        }
        rest = f[end..].trim_start();
    }
    (flags, rest)
}

fn unquote(v: &str) -> String {
    let b = v.as_bytes();
    if b.len() >= 2 && (b[0] == b'"' || b[0] == b'\'') && b[b.len() - 1] == b[0] {
        v[1..v.len() - 1].to_string()
    } else {
        v.to_string()
    }
}

/// The here-documents an instruction's line opens: `<<WORD`, `<<-WORD`, `<<"WORD"`,
/// `<<'WORD'` (name, expand, strip tabs), in order.
pub fn heredoc_names(line: &str) -> Vec<(String, bool, bool)> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(p) = rest.find("<<") {
        let mut s = &rest[p + 2..];
        // `<<<` is a here-string, not a here-document.
        if s.starts_with('<') {
            rest = s.trim_start_matches('<');
            continue;
        }
        let strip = s.starts_with('-');
        if strip {
            s = &s[1..];
        }
        let (quote, body) = match s.chars().next() {
            Some(q @ ('"' | '\'')) => (Some(q), &s[1..]),
            _ => (None, s),
        };
        let end = body
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.'))
            .unwrap_or(body.len());
        let name = &body[..end];
        let mut after = &body[end..];
        if let Some(q) = quote {
            match after.strip_prefix(q) {
                Some(a) => after = a,
                None => {
                    rest = after;
                    continue;
                }
            }
        }
        if !name.is_empty() {
            out.push((name.to_string(), quote.is_none(), strip));
        }
        rest = after;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instructions_flags_continuations_and_forms() {
        let d = parse(
            "# syntax=docker/dockerfile:1\n\
             FROM base:1 AS b\n\
             # a comment\n\
             RUN apt-get update \\\n  # inside\n  && apt-get install -y x\n\
             COPY --chown=1:2 --from=b a b /dst/\n\
             CMD [\"python3\", \"-m\", \"x\"]\n\
             ENTRYPOINT [not json\n\
             run echo lower\n",
        )
        .unwrap();
        let k: Vec<&str> = d.instructions.iter().map(|i| i.keyword.as_str()).collect();
        assert_eq!(k, ["FROM", "RUN", "COPY", "CMD", "ENTRYPOINT", "RUN"]);
        assert_eq!(d.instructions[1].line, 4);
        assert_eq!(
            d.instructions[1].args,
            Args::Shell("apt-get update   && apt-get install -y x".into())
        );
        assert_eq!(d.instructions[2].flag("chown"), Some("1:2"));
        assert_eq!(d.instructions[2].flag("from"), Some("b"));
        assert_eq!(d.instructions[2].args, Args::Shell("a b /dst/".into()));
        assert_eq!(
            d.instructions[3].args,
            Args::Exec(vec!["python3".into(), "-m".into(), "x".into()])
        );
        assert_eq!(d.instructions[4].args, Args::Shell("[not json".into()));
    }

    #[test]
    fn escape_directive_and_heredocs() {
        let d = parse(
            "# escape=`\nFROM x\nRUN echo a `\n b\nRUN <<EOF\necho one\necho $HOME\nEOF\n\
             COPY <<-'END' /f\n\tliteral $X\n\tEND\nRUN x\n",
        )
        .unwrap();
        assert_eq!(d.escape, '`');
        assert_eq!(d.instructions[1].args, Args::Shell("echo a  b".into()));
        let h = &d.instructions[2].heredocs[0];
        assert_eq!(
            (h.name.as_str(), h.body.as_str(), h.expand),
            ("EOF", "echo one\necho $HOME\n", true)
        );
        let h = &d.instructions[3].heredocs[0];
        assert_eq!((h.body.as_str(), h.expand), ("literal $X\n", false));
        assert_eq!(d.instructions[4].args, Args::Shell("x".into()));
    }

    #[test]
    fn refusals_name_their_line() {
        for (text, line) in [
            ("FROM x\nFOO bar\n", 2),
            ("FROM x\nRUN <<EOF\nnever closed\n", 2),
            ("# escape=x\nFROM x\n", 1),
        ] {
            match parse(text) {
                Err(BuildError::Parse { line: l, .. }) => assert_eq!(l, line, "{text:?}"),
                other => panic!("{text:?}: {other:?}"),
            }
        }
        // Odd input parses or is refused, never panics.
        for t in [
            "",
            "\\",
            "RUN \\",
            "RUN <<",
            "RUN <<\"",
            "COPY --",
            "FROM\u{feff}x",
            "RUN [\"a\"",
        ] {
            let _ = parse(t);
        }
    }

    /// The fuzz target's property in the ordinary suite: 4,000 generated Dockerfiles made of
    /// the syntax's sharp edges parse or are refused, and their arguments substitute, without
    /// a panic.
    #[test]
    fn generated_dockerfiles_never_panic() {
        const BITS: &[&str] = &[
            "FROM ",
            "RUN ",
            "COPY ",
            "ENV ",
            "ARG ",
            "run ",
            "HEALTHCHECK ",
            "<<EOF",
            "<<-'E'",
            "<<\"X\"",
            "EOF",
            "\n",
            "\\\n",
            "\\",
            "`",
            "# escape=`\n",
            "#",
            "\"",
            "'",
            "${",
            "}",
            ":-",
            ":+",
            ":?",
            "$A",
            "$",
            "[",
            "]",
            "[\"a\"]",
            "--from=",
            "--",
            "=",
            " ",
            "\t",
            "\r\n",
            "é",
            "\u{feff}",
            "x",
            "AS b",
            "\0",
        ];
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let vars = vec![("A".to_string(), "v w".to_string())];
        for _ in 0..4000 {
            let n = (next() % 40) as usize;
            let text: String = (0..n)
                .map(|_| BITS[(next() % BITS.len() as u64) as usize])
                .collect();
            if let Ok(df) = parse(&text) {
                for i in &df.instructions {
                    let t = i.args.text();
                    let _ = crate::words::words(&t, &vars, df.escape);
                    let _ = crate::words::pairs(&t, &vars, df.escape, true);
                    let _ = i.display();
                }
            }
        }
    }
}
