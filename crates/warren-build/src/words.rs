//! Variable substitution and word splitting of instruction arguments, as a Dockerfile does
//! it for `ADD COPY ENV EXPOSE FROM LABEL STOPSIGNAL USER VOLUME WORKDIR ARG`: `$NAME`,
//! `${NAME}`, `${NAME:-word}`, `${NAME-word}`, `${NAME:+word}`, `${NAME+word}`; single quotes
//! keep everything literal, double quotes keep spaces, the escape character makes the next
//! character literal. `RUN`, `CMD` and `ENTRYPOINT` are not substituted (their shell does it).

use crate::BuildError;

/// The variables in force: (name, value), later entries winning.
pub type Vars = [(String, String)];

fn lookup<'a>(vars: &'a Vars, name: &str) -> Option<&'a str> {
    vars.iter()
        .rev()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// Splits `text` into words, substituting variables and removing quotes.
pub fn words(text: &str, vars: &Vars, escape: char) -> Result<Vec<String>, BuildError> {
    let mut p = Lexer {
        chars: text.chars().collect(),
        pos: 0,
        vars,
        escape,
    };
    p.words(true)
}

/// Substitutes variables in `text` as one word (quotes removed, spaces kept).
pub fn word(text: &str, vars: &Vars, escape: char) -> Result<String, BuildError> {
    let mut p = Lexer {
        chars: text.chars().collect(),
        pos: 0,
        vars,
        escape,
    };
    Ok(p.words(false)?.into_iter().next().unwrap_or_default())
}

struct Lexer<'a> {
    chars: Vec<char>,
    pos: usize,
    vars: &'a Vars,
    escape: char,
}

fn bad(message: impl Into<String>) -> BuildError {
    BuildError::Invalid(message.into())
}

impl Lexer<'_> {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn words(&mut self, split: bool) -> Result<Vec<String>, BuildError> {
        let mut out = Vec::new();
        let mut cur = String::new();
        let mut started = false;
        while let Some(c) = self.peek() {
            self.pos += 1;
            if split && c.is_whitespace() {
                if started {
                    out.push(std::mem::take(&mut cur));
                    started = false;
                }
                continue;
            }
            started = true;
            if c == self.escape {
                if let Some(n) = self.peek() {
                    self.pos += 1;
                    cur.push(n);
                } else {
                    cur.push(c);
                }
            } else if c == '\'' {
                loop {
                    match self.peek() {
                        Some('\'') => {
                            self.pos += 1;
                            break;
                        }
                        Some(x) => {
                            self.pos += 1;
                            cur.push(x);
                        }
                        None => return Err(bad("unterminated single quote")),
                    }
                }
            } else if c == '"' {
                loop {
                    match self.peek() {
                        Some('"') => {
                            self.pos += 1;
                            break;
                        }
                        Some('$') => {
                            self.pos += 1;
                            cur.push_str(&self.dollar()?);
                        }
                        Some(x) if x == self.escape => {
                            self.pos += 1;
                            match self.peek() {
                                Some(n @ ('"' | '$')) => {
                                    self.pos += 1;
                                    cur.push(n);
                                }
                                Some(n) if n == self.escape => {
                                    self.pos += 1;
                                    cur.push(n);
                                }
                                _ => cur.push(x),
                            }
                        }
                        Some(x) => {
                            self.pos += 1;
                            cur.push(x);
                        }
                        None => return Err(bad("unterminated double quote")),
                    }
                }
            } else if c == '$' {
                cur.push_str(&self.dollar()?);
            } else {
                cur.push(c);
            }
        }
        if started || !split {
            out.push(cur);
        }
        Ok(out)
    }

    /// After a `$`: the substitution (a lone `$` stays).
    fn dollar(&mut self) -> Result<String, BuildError> {
        match self.peek() {
            Some('{') => {
                self.pos += 1;
                let name = self.name();
                if name.is_empty() {
                    return Err(bad("bad substitution: ${ without a name"));
                }
                let val = lookup(self.vars, &name).map(str::to_string);
                match self.peek() {
                    Some('}') => {
                        self.pos += 1;
                        Ok(val.unwrap_or_default())
                    }
                    Some(':') | Some('-') | Some('+') | Some('?') => {
                        let colon = self.peek() == Some(':');
                        if colon {
                            self.pos += 1;
                        }
                        let op = self.peek().ok_or_else(|| bad("bad substitution"))?;
                        self.pos += 1;
                        let word = self.until_brace()?;
                        let set = match &val {
                            Some(v) => !colon || !v.is_empty(),
                            None => false,
                        };
                        match op {
                            '-' => Ok(if set { val.unwrap_or_default() } else { word }),
                            '+' => Ok(if set { word } else { String::new() }),
                            '?' if !set => Err(bad(if word.is_empty() {
                                format!("{name} is not set")
                            } else {
                                format!("{name}: {word}")
                            })),
                            '?' => Ok(val.unwrap_or_default()),
                            other => Err(bad(format!(
                                "unsupported substitution ${{{name}:{other}…}}"
                            ))),
                        }
                    }
                    _ => Err(bad(format!("bad substitution in ${{{name}…"))),
                }
            }
            Some(c) if c.is_ascii_alphabetic() || c == '_' => {
                let name = self.name();
                Ok(lookup(self.vars, &name).unwrap_or_default().to_string())
            }
            _ => Ok("$".to_string()),
        }
    }

    fn name(&mut self) -> String {
        let mut n = String::new();
        while let Some(c) = self.peek() {
            if c.is_ascii_alphanumeric() || c == '_' {
                n.push(c);
                self.pos += 1;
            } else {
                break;
            }
        }
        n
    }

    /// The word of `${NAME:-word}` up to its `}`, itself substituted.
    fn until_brace(&mut self) -> Result<String, BuildError> {
        let mut out = String::new();
        loop {
            match self.peek() {
                Some('}') => {
                    self.pos += 1;
                    return Ok(out);
                }
                Some('$') => {
                    self.pos += 1;
                    out.push_str(&self.dollar()?);
                }
                Some(c) => {
                    self.pos += 1;
                    out.push(c);
                }
                None => return Err(bad("unterminated ${")),
            }
        }
    }
}

/// `KEY=value` pairs of `ENV`, `LABEL`, `ARG` (values substituted, quotes removed). The old
/// `ENV KEY value` form (one pair, the rest of the line is the value) is taken when the first
/// word has no `=`.
pub fn pairs(
    text: &str,
    vars: &Vars,
    escape: char,
    legacy: bool,
) -> Result<Vec<(String, Option<String>)>, BuildError> {
    let ws = words(text, vars, escape)?;
    if legacy && ws.first().is_some_and(|w| !w.contains('=')) && ws.len() > 1 {
        let key = ws[0].clone();
        let rest = text.trim_start()[text.trim_start().find(char::is_whitespace).unwrap_or(0)..]
            .trim_start();
        return Ok(vec![(key, Some(word(rest, vars, escape)?))]);
    }
    Ok(ws
        .into_iter()
        .map(|w| match w.split_once('=') {
            Some((k, v)) => (k.to_string(), Some(v.to_string())),
            None => (w, None),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v() -> Vec<(String, String)> {
        vec![
            ("A".into(), "one".into()),
            ("E".into(), String::new()),
            ("A".into(), "two".into()),
        ]
    }

    #[test]
    fn substitution_and_quotes() {
        let w = |t: &str| words(t, &v(), '\\').unwrap();
        assert_eq!(w("$A ${A}x"), ["two", "twox"]);
        assert_eq!(w("'$A' \"$A b\" \\$A"), ["$A", "two b", "$A"]);
        assert_eq!(
            w("${E:-d} ${E-d}x ${N:-$A} ${A:+set} ${N+set}x"),
            ["d", "x", "two", "set", "x"]
        );
        assert_eq!(w("a$ $1"), ["a$", "$1"]);
        assert!(words("${N:?missing}", &v(), '\\').is_err());
        assert!(words("'open", &v(), '\\').is_err());
        assert_eq!(word("  a  $A ", &v(), '\\').unwrap(), "  a  two ");
    }

    #[test]
    fn env_pairs_both_forms() {
        let p = pairs("K=v Q=\"a b\" N", &v(), '\\', true).unwrap();
        assert_eq!(
            p,
            [
                ("K".into(), Some("v".into())),
                ("Q".into(), Some("a b".into())),
                ("N".into(), None)
            ]
        );
        let p = pairs("KEY value with $A", &v(), '\\', true).unwrap();
        assert_eq!(p, [("KEY".into(), Some("value with two".into()))]);
    }
}
