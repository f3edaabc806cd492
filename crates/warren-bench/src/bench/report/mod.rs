//! `--report DIR`: a directory a person can open after a run. It holds
//!
//! - `report.json`: the JSON document `--json` prints,
//! - one SVG file per plot (drawn by [`plots`] with plotters' SVG backend, text as SVG `<text>`,
//!   so no font is needed),
//! - `index.html`: a self-contained page (no external URL, no script) with the text report's
//!   tables as HTML tables and every plot with its caption.
//!
//! Plots are drawn only for what the run measured: latency CDFs of create and exec with the
//! baselines of the same run, the density curve, lazy vs eager image starts, and the cluster's
//! sandboxes per node. Other sections are tables only.

pub mod plots;

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{bail, Context as _};
use serde::Serialize;

use super::Report;
use plots::Series;

/// One plot of a report: its file name in the directory, caption and SVG text.
#[derive(Debug)]
pub struct Plot {
    pub file: String,
    pub caption: String,
    pub svg: String,
}

/// What a report directory is made of.
#[derive(Debug)]
pub struct Page {
    /// The page's heading.
    pub title: String,
    /// The text report (`warren bench` without `--json`), turned into HTML tables.
    pub text: String,
    /// The `--json` document.
    pub json: String,
    pub plots: Vec<Plot>,
}

impl Page {
    /// A page of `text` and the JSON of `value`, without plots.
    pub fn new(title: &str, text: String, value: &impl Serialize) -> anyhow::Result<Page> {
        Ok(Page {
            title: title.to_string(),
            text,
            json: serde_json::to_string_pretty(value).context("serialising the report")?,
            plots: Vec::new(),
        })
    }
}

/// The page of a node run (create, exec, density, …) with its plots.
pub fn node_page(r: &Report) -> anyhow::Result<Page> {
    let mut page = Page::new("warren bench", r.render(), r)?;
    let cdf = |name: &str, own: &[f64], exec: bool| -> Vec<Series> {
        let mut s = vec![Series::cdf(&format!("warren {name}"), own)];
        for b in r.baselines.iter().filter(|b| b.p50().is_some()) {
            if b.name.to_ascii_lowercase().contains("exec") != exec {
                continue;
            }
            if !b.quantiles_ms.is_empty() {
                s.push(Series::cdf(&b.name, &b.quantiles_ms));
            } else if let (Some(p50), Some(p99)) = (b.p50_ms, b.p99_ms) {
                // A baseline script without quantiles: the two points it gave.
                s.push(Series {
                    name: format!("{} (p50, p99 only)", b.name),
                    points: vec![(p50, 0.5), (p99, 0.99)],
                });
            }
        }
        s
    };
    if r.create.is_some() && !r.create_quantiles_ms.is_empty() {
        page.plots.push(Plot {
            file: "create-cdf.svg".into(),
            caption: "Create → first exec latency CDF, with the baselines measured in the same \
                      run (runtimes that start a container)"
                .into(),
            svg: plots::cdf(
                "create → first exec",
                &cdf("create", &r.create_quantiles_ms, false),
            )?,
        });
    }
    if r.exec.is_some() && !r.exec_quantiles_ms.is_empty() {
        page.plots.push(Plot {
            file: "exec-cdf.svg".into(),
            caption: "exec true round trip latency CDF, with the exec baselines measured in the \
                      same run"
                .into(),
            svg: plots::cdf("exec true", &cdf("exec", &r.exec_quantiles_ms, true))?,
        });
    }
    if let Some(c) = r.density_curve.as_ref().filter(|c| !c.points.is_empty()) {
        let line = |name: &str, f: fn(&super::curve::Point) -> f64| Series {
            name: name.to_string(),
            points: c
                .points
                .iter()
                .map(|p| (p.sandboxes as f64, f(p)))
                .collect(),
        };
        page.plots.push(Plot {
            file: "density-curve.svg".into(),
            caption: "Host memory per idle sandbox (and its slab part) against the number of \
                      sandboxes alive"
                .into(),
            svg: plots::lines(
                "density curve",
                "sandboxes alive",
                "MiB per sandbox",
                &[
                    line("host memory", |p| p.mib_per_sandbox),
                    line("slab", |p| p.slab_mib_per_sandbox),
                ],
            )?,
        });
    }
    Ok(page)
}

/// Fails when `dir` exists and is not a directory (checked before a run too, so that a long
/// run does not end in this error).
pub fn usable(dir: &Path) -> anyhow::Result<()> {
    if dir.exists() && !dir.is_dir() {
        bail!("--report {}: exists and is not a directory", dir.display());
    }
    Ok(())
}

/// Writes `page` into `dir` (created if missing): `report.json`, the SVG files, `index.html`.
pub fn write(dir: &Path, page: &Page) -> anyhow::Result<()> {
    usable(dir)?;
    std::fs::create_dir_all(dir)
        .with_context(|| format!("--report: cannot create the directory {}", dir.display()))?;
    let put = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).with_context(|| format!("--report: cannot write {}", p.display()))
    };
    put("report.json", &format!("{}\n", page.json))?;
    for p in &page.plots {
        put(&p.file, &p.svg)?;
    }
    put("index.html", &html(page))?;
    Ok(())
}

/// Writes the page when `dir` is given and says where it went (on stderr: stdout keeps the
/// report itself).
pub fn write_if(
    dir: Option<&Path>,
    page: impl FnOnce() -> anyhow::Result<Page>,
) -> anyhow::Result<()> {
    if let Some(dir) = dir {
        write(dir, &page()?)?;
        eprintln!(
            "bench: report written to {}",
            dir.join("index.html").display()
        );
    }
    Ok(())
}

/// `s` with `&`, `<`, `>` and quotes escaped for HTML text and attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = "body{font-family:sans-serif;margin:2em;max-width:70em;color:#222}\
table{border-collapse:collapse;margin:0.5em 0 1.2em}\
th,td{border:1px solid #ccc;padding:0.2em 0.6em;text-align:left}\
th{background:#f0f0f0}\
td.PASS{color:#060}td.MISS,td.FAIL,td.NO{color:#a00;font-weight:bold}\
p{margin:0.3em 0}figure{margin:1.5em 0}img{max-width:100%;border:1px solid #ddd}\
figcaption{font-size:0.9em;color:#444}";

/// The self-contained `index.html` of a page.
pub fn html(page: &Page) -> String {
    let mut out = String::new();
    let title = escape(&page.title);
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>{title}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n<h1>{title}</h1>\n"
    );
    out.push_str("<h2>Summary</h2>\n");
    for block in blocks(&page.text) {
        match block {
            Block::Line(l) => {
                let _ = writeln!(out, "<p>{}</p>", escape(&l));
            }
            Block::Table(rows) => {
                out.push_str("<table>\n");
                for (i, row) in rows.iter().enumerate() {
                    out.push_str("<tr>");
                    for cell in row {
                        if i == 0 {
                            let _ = write!(out, "<th>{}</th>", escape(cell));
                        } else if ["PASS", "MISS", "FAIL", "NO"].contains(&cell.as_str()) {
                            let _ = write!(out, "<td class=\"{cell}\">{cell}</td>");
                        } else {
                            let _ = write!(out, "<td>{}</td>", escape(cell));
                        }
                    }
                    out.push_str("</tr>\n");
                }
                out.push_str("</table>\n");
            }
        }
    }
    if !page.plots.is_empty() {
        out.push_str("<h2>Plots</h2>\n");
    }
    for p in &page.plots {
        let caption = escape(&p.caption);
        let _ = write!(
            out,
            "<figure>\n<img src=\"{}\" alt=\"{caption}\">\n<figcaption>{caption}</figcaption>\n</figure>\n",
            escape(&p.file)
        );
    }
    out.push_str(
        "<p>The numbers as JSON: <a href=\"report.json\">report.json</a>.</p>\n</body>\n</html>\n",
    );
    out
}

/// A piece of the text report: a line of prose, or a table (its header row first).
#[derive(Debug, PartialEq)]
enum Block {
    Line(String),
    Table(Vec<Vec<String>>),
}

/// Where the columns of a table header line start (in chars), when `line` is one: the cells of
/// [`crate::table::Table`] are separated by two spaces or more, and the benches' headers begin
/// with an upper-case word ("BENCH", "CHECK", "NEIGHBOUR RUNS").
fn header_columns(line: &[char]) -> Option<Vec<usize>> {
    let mut starts = vec![0];
    let mut spaces = 0;
    for (i, &c) in line.iter().enumerate() {
        if c == ' ' {
            spaces += 1;
        } else {
            if spaces >= 2 {
                starts.push(i);
            }
            spaces = 0;
        }
    }
    let first: String = line[..starts.get(1).copied()?].iter().collect();
    let first = first.trim_end();
    let upper = !first.is_empty()
        && first.starts_with(|c: char| c.is_ascii_uppercase())
        && first.chars().all(|c| c.is_ascii_uppercase() || c == ' ');
    upper.then_some(starts)
}

/// The cells of `line` as a row of a table whose columns start at `starts`, or `None` when the
/// line does not fit (it is prose that follows the table).
fn row_cells(line: &[char], starts: &[usize]) -> Option<Vec<String>> {
    if line.len() <= starts[1] {
        return None;
    }
    let mut cells = Vec::with_capacity(starts.len());
    for (k, &s) in starts.iter().enumerate() {
        if s >= line.len() {
            cells.push(String::new());
            continue;
        }
        if k > 0 && (line[s - 1] != ' ' || line[s - 2] != ' ' || line[s] == ' ') {
            // A cell may be empty (then only spaces are here); anything else is not a row.
            let blank = line[s - 2..].iter().take(3).all(|&c| c == ' ');
            if !blank {
                return None;
            }
        }
        let end = starts
            .get(k + 1)
            .copied()
            .unwrap_or(line.len())
            .min(line.len());
        cells.push(line[s..end].iter().collect::<String>().trim().to_string());
    }
    Some(cells)
}

/// The text report cut into lines of prose and tables.
fn blocks(text: &str) -> Vec<Block> {
    let lines: Vec<Vec<char>> = text.lines().map(|l| l.chars().collect()).collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = &lines[i];
        i += 1;
        if line.iter().all(|c| c.is_whitespace()) {
            continue;
        }
        if let Some(starts) = header_columns(line) {
            let header = row_cells(line, &starts).unwrap_or_default();
            let mut rows = vec![header];
            while let Some(cells) = lines.get(i).and_then(|l| row_cells(l, &starts)) {
                rows.push(cells);
                i += 1;
            }
            out.push(Block::Table(rows));
        } else {
            out.push(Block::Line(line.iter().collect()));
        }
    }
    out
}

#[cfg(test)]
mod tests;
