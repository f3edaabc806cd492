//! Sizes and durations as people write them on a command line: `512M`, `1G`, `1.5GiB`,
//! `65536K` (binary units, as the Python SDK reads them; a plain number is MiB) and `90s`,
//! `5m`, `1h30m`, `1.5h`, `2d` (a plain number is seconds).

/// MiB per unit (lower case, with or without `b` / `i` / `ib`).
fn mib_per(unit: &str) -> Option<f64> {
    Some(match unit {
        "" | "m" | "mi" | "mb" | "mib" => 1.0,
        "k" | "ki" | "kb" | "kib" => 1.0 / 1024.0,
        "g" | "gi" | "gb" | "gib" => 1024.0,
        "t" | "ti" | "tb" | "tib" => 1024.0 * 1024.0,
        _ => return None,
    })
}

/// Splits `1.5GiB` into (1.5, "gib").
fn number_and_unit(s: &str) -> Option<(f64, String)> {
    let s = s.trim();
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let n: f64 = s[..end].parse().ok()?;
    n.is_finite()
        .then(|| (n, s[end..].trim().to_ascii_lowercase()))
}

/// A size in whole MiB: `512` (MiB), `512M`, `1G`, `1.5GiB`, `65536K`.
pub fn parse_mib(s: &str) -> Result<u64, String> {
    let bad = || format!("expected a size like 512 (MiB), 512M, 1G or 1.5GiB, got {s:?}");
    if s.trim_start().starts_with('-') {
        return Err(format!("{s:?} is negative: a size is 1 MiB or more"));
    }
    let (n, unit) = number_and_unit(s).ok_or_else(bad)?;
    let mib = n * mib_per(&unit).ok_or_else(bad)?;
    if mib < 1.0 {
        return Err(format!("{s:?} is less than 1 MiB"));
    }
    if mib > u64::MAX as f64 / 2.0 {
        return Err(format!("{s:?} is too large"));
    }
    Ok(mib.floor() as u64)
}

/// A duration in seconds: `90` (seconds), `90s`, `5m`, `1h30m`, `1.5h`, `2d`, `500ms`.
pub fn parse_secs(s: &str) -> Result<f64, String> {
    let bad = || format!("expected a duration like 90 (seconds), 90s, 5m, 1h30m or 2d, got {s:?}");
    let t = s.trim();
    if t.is_empty() {
        return Err(bad());
    }
    if t.starts_with('-') {
        return Err(format!("{s:?} is negative: a duration is 0 or more"));
    }
    if let Ok(n) = t.parse::<f64>() {
        return (n.is_finite() && n >= 0.0).then_some(n).ok_or_else(bad);
    }
    let mut total = 0.0;
    let mut rest = t;
    while !rest.is_empty() {
        let end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let n: f64 = rest[..end].parse().map_err(|_| bad())?;
        let after = &rest[end..];
        let uend = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let per = match after[..uend].to_ascii_lowercase().as_str() {
            "ms" => 0.001,
            "s" | "sec" | "secs" => 1.0,
            "m" | "min" | "mins" => 60.0,
            "h" | "hr" | "hrs" => 3600.0,
            "d" => 86400.0,
            _ => return Err(bad()),
        };
        total += n * per;
        rest = &after[uend..];
    }
    total.is_finite().then_some(total).ok_or_else(bad)
}

/// A duration in whole seconds (rounded up; `0.5s` is 1).
pub fn parse_whole_secs(s: &str) -> Result<u64, String> {
    let secs = parse_secs(s)?;
    if secs > u64::MAX as f64 / 2.0 {
        return Err(format!("{s:?} is too long"));
    }
    Ok(secs.ceil() as u64)
}

/// A number of CPUs (or any positive quantity): more than 0, fractions allowed.
pub fn parse_positive(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(n) if n.is_finite() && n > 0.0 => Ok(n),
        Ok(_) => Err(format!("{s:?} is not more than 0")),
        Err(_) => Err(format!("expected a number like 1 or 0.5, got {s:?}")),
    }
}

/// A count: a whole number, 0 or more.
pub fn parse_count(s: &str) -> Result<u64, String> {
    if s.trim_start().starts_with('-') {
        return Err(format!("{s:?} is negative: a count is 0 or more"));
    }
    s.trim()
        .parse::<u64>()
        .map_err(|_| format!("expected a whole number like 512, got {s:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negative_values_are_named_as_such() {
        for e in [
            parse_mib("-5").unwrap_err(),
            parse_secs("-5").unwrap_err(),
            parse_whole_secs("-1m").unwrap_err(),
            parse_count("-5").unwrap_err(),
        ] {
            assert!(e.contains("negative"), "{e}");
        }
        assert!(parse_positive("-1")
            .unwrap_err()
            .contains("not more than 0"));
        assert!(parse_positive("0").is_err());
        assert_eq!(parse_positive("0.5"), Ok(0.5));
        assert_eq!(parse_count("7"), Ok(7));
        assert!(parse_count("x").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_mib("512"), Ok(512));
        assert_eq!(parse_mib("512M"), Ok(512));
        assert_eq!(parse_mib("512m"), Ok(512));
        assert_eq!(parse_mib("512MiB"), Ok(512));
        assert_eq!(parse_mib("1G"), Ok(1024));
        assert_eq!(parse_mib("1.5GiB"), Ok(1536));
        assert_eq!(parse_mib("10G"), Ok(10240));
        assert_eq!(parse_mib("65536K"), Ok(64));
        assert_eq!(parse_mib("1T"), Ok(1 << 20));
        for bad in ["", "M", "12Q", "-5", "1.2.3G", "512K", "nan"] {
            assert!(parse_mib(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_secs("90"), Ok(90.0));
        assert_eq!(parse_secs("2.5"), Ok(2.5));
        assert_eq!(parse_secs("90s"), Ok(90.0));
        assert_eq!(parse_secs("5m"), Ok(300.0));
        assert_eq!(parse_secs("1h30m"), Ok(5400.0));
        assert_eq!(parse_secs("1.5h"), Ok(5400.0));
        assert_eq!(parse_secs("2d"), Ok(172800.0));
        assert_eq!(parse_secs("500ms"), Ok(0.5));
        assert_eq!(parse_whole_secs("5m"), Ok(300));
        assert_eq!(parse_whole_secs("0.5s"), Ok(1));
        for bad in ["", "s", "5x", "-1", "5m3", "1..2s"] {
            assert!(parse_secs(bad).is_err(), "{bad}");
        }
    }
}
