//! Plain-text tables and small human formats (ages, milliseconds) for command output.

use std::fmt::Write as _;

/// A table of left-aligned columns separated by two spaces; the last column is not padded.
#[derive(Debug, Default)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new<I, S>(header: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Table {
            header: header.into_iter().map(Into::into).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row<I, S>(&mut self, cells: I)
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.rows.push(cells.into_iter().map(Into::into).collect());
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The table as text, one line per row, each ending with a newline.
    pub fn render(&self) -> String {
        let cols = self
            .rows
            .iter()
            .map(Vec::len)
            .chain([self.header.len()])
            .max()
            .unwrap_or(0);
        let mut widths = vec![0usize; cols];
        for row in std::iter::once(&self.header).chain(&self.rows) {
            for (i, cell) in row.iter().enumerate() {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for row in std::iter::once(&self.header).chain(&self.rows) {
            let mut line = String::new();
            for (i, cell) in row.iter().enumerate() {
                if i + 1 == row.len() {
                    line.push_str(cell);
                } else {
                    let pad = widths[i] - cell.chars().count();
                    let _ = write!(line, "{cell}{}  ", " ".repeat(pad));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// A short age: `42s`, `5m`, `3h`, `2d`.
pub fn age(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..=119 => format!("{s}s"),
        120..=7199 => format!("{}m", s / 60),
        7200..=172_799 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

/// Bytes in binary units, as docker prints them: `512B`, `4.0KiB`, `12.3MiB`, `1.50GiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n}B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if v < 10.0 && unit >= 2 {
        format!("{v:.2}{}", UNITS[unit])
    } else {
        format!("{v:.1}{}", UNITS[unit])
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Milliseconds with a precision that suits the size: `0.84`, `12.3`, `1520`.
pub fn ms(v: f64) -> String {
    if v < 10.0 {
        format!("{v:.2}")
    } else if v < 100.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.0}")
    }
}

/// `n` and the noun, singular for one: `count(1, "layer")` is "1 layer".
pub fn count(n: u64, noun: &str) -> String {
    match n {
        1 => format!("1 {noun}"),
        n if noun.ends_with('s') => format!("{n} {noun}es"),
        n => format!("{n} {noun}s"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn counts_agree() {
        assert_eq!(super::count(1, "layer"), "1 layer");
        assert_eq!(super::count(0, "layer"), "0 layers");
        assert_eq!(super::count(3, "step"), "3 steps");
        assert_eq!(super::count(2, "process"), "2 processes");
    }

    #[test]
    fn bytes_in_binary_units() {
        assert_eq!(super::bytes(512), "512B");
        assert_eq!(super::bytes(4096), "4.0KiB");
        assert_eq!(super::bytes(12_900_000), "12.3MiB");
        assert_eq!(super::bytes(3 << 29), "1.50GiB");
    }

    use super::*;

    #[test]
    fn tables_align() {
        let mut t = Table::new(["ID", "STATE", "LABELS"]);
        t.row(["n1-abc", "running", "a=1"]);
        t.row(["n1-abcdef", "stopped", ""]);
        assert_eq!(
            t.render(),
            "ID         STATE    LABELS\n\
             n1-abc     running  a=1\n\
             n1-abcdef  stopped\n"
        );
        assert!(Table::new(["X"]).is_empty());
    }

    #[test]
    fn ages_and_ms() {
        assert_eq!(age(0), "0s");
        assert_eq!(age(119_999), "119s");
        assert_eq!(age(120_000), "2m");
        assert_eq!(age(3 * 3600 * 1000), "3h");
        assert_eq!(age(3 * 86_400 * 1000), "3d");
        assert_eq!(ms(0.8412), "0.84");
        assert_eq!(ms(12.34), "12.3");
        assert_eq!(ms(1520.4), "1520");
    }
}
