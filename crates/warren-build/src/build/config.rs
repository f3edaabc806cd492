//! Instruction arguments that become image configuration: command forms, durations, healthchecks.

use warren_types::{Healthcheck, ImageConfig};

use super::invalid;
use crate::parse::{Args, Instruction};
use crate::BuildError;

/// `CMD`/`ENTRYPOINT` as an argv: the exec form as is, the shell form through the shell.
pub(super) fn command(args: &Args, c: &ImageConfig) -> Vec<String> {
    match args {
        Args::Exec(v) => v.clone(),
        Args::Shell(s) => {
            let mut v = c
                .shell
                .clone()
                .unwrap_or_else(|| vec!["/bin/sh".into(), "-c".into()]);
            v.push(s.clone());
            v
        }
    }
}

/// `30s`, `1m30s`, `500ms`, `1h`.
pub(super) fn duration(s: &str) -> Option<f64> {
    let mut total = 0.0;
    let mut num = String::new();
    let mut chars = s.chars().peekable();
    let mut any = false;
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() || c == '.' {
            num.push(c);
            continue;
        }
        let n: f64 = num.parse().ok()?;
        num.clear();
        let unit = match c {
            'h' => 3600.0,
            'm' if chars.peek() == Some(&'s') => {
                chars.next();
                0.001
            }
            'm' => 60.0,
            's' => 1.0,
            _ => return None,
        };
        total += n * unit;
        any = true;
    }
    (any && num.is_empty()).then_some(total)
}

fn ms(secs: f64) -> u64 {
    (secs * 1000.0).round() as u64
}

pub(super) fn healthcheck(ins: &Instruction) -> Result<Healthcheck, BuildError> {
    let text = ins.args.text();
    let t = text.trim();
    if t.eq_ignore_ascii_case("none") {
        return Ok(Healthcheck {
            test: vec!["NONE".into()],
            ..Default::default()
        });
    }
    let rest = t
        .strip_prefix("CMD")
        .or_else(|| t.strip_prefix("cmd"))
        .ok_or_else(|| invalid(ins, "expected HEALTHCHECK [options] CMD command, or NONE"))?
        .trim_start();
    let test = match serde_json::from_str::<Vec<String>>(rest) {
        Ok(v) if rest.starts_with('[') => {
            let mut t = vec!["CMD".to_string()];
            t.extend(v);
            t
        }
        _ => vec!["CMD-SHELL".into(), rest.to_string()],
    };
    let mut h = Healthcheck {
        test,
        ..Default::default()
    };
    for (k, v) in &ins.flags {
        let v = v.as_deref().unwrap_or("");
        let bad = || invalid(ins, format!("--{k}={v}"));
        match k.as_str() {
            "interval" => h.interval_ms = Some(ms(duration(v).ok_or_else(bad)?)),
            "timeout" => h.timeout_ms = Some(ms(duration(v).ok_or_else(bad)?)),
            "start-period" => h.start_period_ms = Some(ms(duration(v).ok_or_else(bad)?)),
            "retries" => h.retries = Some(v.parse().map_err(|_| bad())?),
            "start-interval" => {}
            _ => return Err(bad()),
        }
    }
    Ok(h)
}
