use std::collections::BTreeMap;
use std::path::Path;

use super::*;
use crate::bench::baselines;
use crate::bench::cluster::page::{cluster_page, natural_key};
use crate::bench::cluster::{Burst, ClusterReport, Scale};
use crate::bench::curve::{Curve, MemInfo, Point};
use crate::bench::images::ModeResult;
use crate::bench::images::{images_page, ImagesReport};
use crate::bench::measure::{quantiles, QUANTILES};
use crate::stats::Latency;

/// Samples spread over two decades (so the CDF's x axis is logarithmic).
fn samples(base: f64, n: usize) -> Vec<f64> {
    (0..n)
        .map(|i| base * (1.0 + (i % 50) as f64 * 2.0))
        .collect()
}

fn point(sandboxes: usize, mib: f64) -> Point {
    Point {
        sandboxes,
        step_create_secs: 1.0,
        mib_per_sandbox: mib,
        slab_mib_per_sandbox: mib / 2.0,
        sunreclaim_mib_per_sandbox: mib / 4.0,
        slab_share: 0.5,
        kernel_stack_kib_per_sandbox: 16.0,
        page_tables_kib_per_sandbox: 8.0,
        percpu_kib_per_sandbox: 4.0,
        anon_kib_per_sandbox: 2.0,
        shmem_kib_per_sandbox: 1.0,
        slab_top_kib_per_sandbox: vec![("dentry".into(), 100.0)],
        meminfo: MemInfo::default(),
    }
}

/// A node report with everything that has a plot: create and exec samples, baselines (one
/// create-like, one exec, one with percentiles only, one failed), a density curve.
fn full_report() -> Report {
    let create = samples(2.0, 200);
    let exec = samples(0.1, 1000);
    let q = |base: f64| quantiles(&samples(base, 50));
    let mut baselines = baselines::parse(
        r#"{"name":"podman_run","p50_ms":300,"p99_ms":400,"n":5}
{"name":"bwrap","error":"bwrap is not installed"}"#,
    );
    baselines.push(baselines::Baseline {
        name: "crun_run".into(),
        runtime: Some("crun".into()),
        p50_ms: Some(30.0),
        p99_ms: Some(60.0),
        n: Some(50),
        error: None,
        quantiles_ms: q(20.0),
    });
    baselines.push(baselines::Baseline {
        name: "crun_exec".into(),
        runtime: Some("crun".into()),
        p50_ms: Some(6.0),
        p99_ms: Some(9.0),
        n: Some(50),
        error: None,
        quantiles_ms: q(4.0),
    });
    let mut r = Report {
        create: Some(Latency::from_samples(create.clone())),
        create_quantiles_ms: quantiles(&create),
        exec: Some(Latency::from_samples(exec.clone())),
        exec_quantiles_ms: quantiles(&exec),
        density_curve: Some(Curve {
            requested: vec![1000, 2000, 5000],
            points: vec![point(1000, 0.9), point(2000, 0.95), point(5000, 1.0)],
            stopped_by: None,
            start: MemInfo::default(),
            create_secs: 10.0,
            delete_secs: 5.0,
            created: 5000,
            mib_left_after_delete: 1.0,
            left_after_delete: 0,
        }),
        baselines,
        ..Default::default()
    };
    r.check();
    r
}

fn images_report() -> ImagesReport {
    let mode = |m: &str, secs: f64, mib: u64| ModeResult {
        mode: m.into(),
        sandboxes: 8,
        ok: 8,
        wall_secs: secs,
        process_write_bytes: mib << 20,
        ..Default::default()
    };
    ImagesReport {
        images: 8,
        image_mib: 300,
        read_pct: 10,
        rate_mbps: 100,
        modes: vec![
            mode("lazy", 3.0, 20),
            mode("eager", 12.0, 2400),
            mode("tar", 20.0, 2500),
        ],
        checks: Vec::new(),
    }
}

fn cluster_report() -> ClusterReport {
    let per_node: BTreeMap<String, u64> = (0..12)
        .map(|i| (format!("s{i}"), 1000 + i as u64 * 3))
        .collect();
    ClusterReport {
        scale: Some(Scale {
            nodes: 12,
            create: Burst {
                requested: 12_198,
                created: 12_198,
                failed: 0,
                secs: 10.0,
                per_sec: 1219.8,
                latency: Latency::from_samples(vec![1.0, 2.0, 3.0]),
                first_error: None,
            },
            per_node_max: 1033,
            per_node_min: 1000,
            per_node_mean: 1016.5,
            imbalance: 1.016,
            list_1000: Latency::from_samples(vec![5.0, 6.0]),
            list_found: 1000,
            per_node,
        }),
        ..Default::default()
    }
}

/// The SVG files in `dir`, by name.
fn svgs(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".svg"))
        .collect();
    v.sort();
    v
}

/// Parses an SVG file (panics when it is not XML) and counts its series (the polylines drawn
/// 2 px wide: axes and ticks are 1 px) and its bars (rectangles filled with the bar colour).
fn count(dir: &Path, file: &str) -> (usize, usize) {
    let text = std::fs::read_to_string(dir.join(file)).unwrap();
    let doc = roxmltree::Document::parse(&text).unwrap_or_else(|e| panic!("{file}: {e}"));
    let tagged = |tag: &str, attr: &str, value: &str| {
        doc.descendants()
            .filter(|n| n.tag_name().name() == tag && n.attribute(attr) == Some(value))
            .count()
    };
    (
        tagged("polyline", "stroke-width", "2"),
        tagged("rect", "fill", "#1F77B4"),
    )
}

/// Checks the directory's common shape: JSON parses, index.html names every SVG written.
fn check_dir(dir: &Path) -> String {
    let json = std::fs::read_to_string(dir.join("report.json")).unwrap();
    serde_json::from_str::<serde_json::Value>(&json).expect("report.json is JSON");
    let html = std::fs::read_to_string(dir.join("index.html")).unwrap();
    for svg in svgs(dir) {
        assert!(
            html.contains(&format!("<img src=\"{svg}\"")),
            "index.html does not show {svg}"
        );
    }
    assert!(!html.contains("http://") && !html.contains("https://") && !html.contains("<script"));
    html
}

#[test]
fn a_full_node_report_has_cdfs_with_baselines_and_the_density_curve() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("out/report");
    write(&dir, &node_page(&full_report()).unwrap()).unwrap();
    assert_eq!(
        svgs(&dir),
        ["create-cdf.svg", "density-curve.svg", "exec-cdf.svg"]
    );
    let html = check_dir(&dir);
    // create: warren, podman_run (percentiles only), crun_run; exec: warren, crun_exec.
    assert_eq!(count(&dir, "create-cdf.svg").0, 3);
    assert_eq!(count(&dir, "exec-cdf.svg").0, 2);
    assert_eq!(count(&dir, "density-curve.svg").0, 2);
    let create = std::fs::read_to_string(dir.join("create-cdf.svg")).unwrap();
    assert!(create.contains("crun_run") && create.contains("podman_run (p50, p99 only)"));
    assert!(create.contains("log scale"), "the create range is wide");
    assert!(!create.contains("bwrap"), "a failed baseline has no curve");
    // The summary tables are HTML tables, the prose is paragraphs.
    assert!(
        html.contains("<th>BENCH</th><th>N</th><th>P50 ms</th>"),
        "{html}"
    );
    assert!(html.contains("<td>create</td><td>200</td>"), "{html}");
    assert!(html.contains("<th>BASELINE</th>"), "{html}");
    assert!(html.contains("<td>bwrap is not installed</td>"), "{html}");
    assert!(
        html.contains("<th>SANDBOXES</th><th>MiB/SANDBOX</th>"),
        "{html}"
    );
    assert!(html.contains("<p>density curve: 5000 created"), "{html}");
    assert!(html.contains("<td class=\"MISS\">MISS</td>"), "{html}");
    assert_eq!(html.matches("<figcaption>").count(), 3);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap()).unwrap();
    assert_eq!(
        json["create_quantiles_ms"].as_array().unwrap().len(),
        QUANTILES
    );
    assert_eq!(json["create"]["n"], 200);
}

#[test]
fn images_and_cluster_reports_have_bars() {
    let tmp = tempfile::tempdir().unwrap();
    let images = images_report();
    write(
        tmp.path(),
        &images_page(&images, "MODE  OK\nlazy  8/8\n".into()).unwrap(),
    )
    .unwrap();
    assert_eq!(svgs(tmp.path()), ["images-wall.svg", "images-written.svg"]);
    check_dir(tmp.path());
    assert_eq!(count(tmp.path(), "images-wall.svg").1, 3);
    assert_eq!(count(tmp.path(), "images-written.svg").1, 3);

    let tmp = tempfile::tempdir().unwrap();
    let cluster = cluster_report();
    write(
        tmp.path(),
        &cluster_page(&cluster, cluster.render()).unwrap(),
    )
    .unwrap();
    assert_eq!(svgs(tmp.path()), ["cluster-balance.svg"]);
    let html = check_dir(tmp.path());
    assert_eq!(count(tmp.path(), "cluster-balance.svg").1, 12);
    assert!(html.contains("<th>PHASE</th>"), "{html}");
    assert!(html.contains("<p>scale: per node min 1000"), "{html}");
}

#[test]
fn an_empty_report_has_no_plot() {
    let tmp = tempfile::tempdir().unwrap();
    write(tmp.path(), &node_page(&Report::default()).unwrap()).unwrap();
    assert!(svgs(tmp.path()).is_empty());
    let html = check_dir(tmp.path());
    assert!(!html.contains("<img") && !html.contains("<h2>Plots</h2>"));
    // Nothing measured, nothing plotted, even with baselines (no own curve to compare).
    let r = Report {
        baselines: full_report().baselines,
        ..Default::default()
    };
    write(tmp.path(), &node_page(&r).unwrap()).unwrap();
    assert!(svgs(tmp.path()).is_empty());
}

#[test]
fn a_page_without_plots_has_its_tables() {
    let tmp = tempfile::tempdir().unwrap();
    let text = "MODE         N\nplain HTTP   1000\nTLS + token  1000\nPASS tls overhead = 0.1 ms\n";
    let page = Page::new(
        "warren bench tls",
        text.into(),
        &serde_json::json!({"tls": 1}),
    )
    .unwrap();
    write(tmp.path(), &page).unwrap();
    let html = check_dir(tmp.path());
    assert!(svgs(tmp.path()).is_empty());
    assert!(html.contains("<td>TLS + token</td><td>1000</td>"), "{html}");
    assert!(html.contains("<p>PASS tls overhead = 0.1 ms</p>"), "{html}");
    assert!(html.contains("<title>warren bench tls</title>"), "{html}");
}

#[test]
fn names_are_escaped_in_the_page_and_the_plots() {
    let tmp = tempfile::tempdir().unwrap();
    let mut r = full_report();
    r.baselines[2].name = "<b>crun_run & co</b>".into();
    write(tmp.path(), &node_page(&r).unwrap()).unwrap();
    let html = check_dir(tmp.path());
    assert!(
        html.contains("&lt;b&gt;crun_run &amp; co&lt;/b&gt;"),
        "{html}"
    );
    assert!(!html.contains("<b>"));
    // The SVG still parses, with the name as text.
    assert_eq!(count(tmp.path(), "create-cdf.svg").0, 3);
    let svg = std::fs::read_to_string(tmp.path().join("create-cdf.svg")).unwrap();
    assert!(svg.contains("&lt;b&gt;crun_run"));
}

#[test]
fn a_file_in_the_way_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("taken");
    std::fs::write(&file, "x").unwrap();
    let e = write(&file, &node_page(&Report::default()).unwrap()).unwrap_err();
    let msg = format!("{e:#}");
    assert!(
        msg.contains("taken") && msg.contains("not a directory"),
        "{msg}"
    );
    let below = write(&file.join("sub"), &node_page(&Report::default()).unwrap()).unwrap_err();
    assert!(
        format!("{below:#}").contains("cannot create the directory"),
        "{below:#}"
    );
}

#[test]
fn quantiles_and_tables() {
    assert!(quantiles(&[]).is_empty());
    let q = quantiles(&[3.0, 1.0, 2.0]);
    assert_eq!(q.len(), QUANTILES);
    assert_eq!((q[0], q[50], q[100]), (1.0, 2.0, 3.0));
    let s = plots::Series::cdf("x", &q);
    assert_eq!((s.points[0], s.points[100]), ((1.0, 0.0), (3.0, 1.0)));

    let mut t = crate::table::Table::new(["CHECK", "VALUE", "NOTE"]);
    t.row(["a  b", "1", ""]);
    t.row(["long metric name", "", "x"]);
    let text = format!("first: line\n{}after: the table\n", t.render());
    assert_eq!(
        blocks(&text),
        [
            Block::Line("first: line".into()),
            Block::Table(vec![
                vec!["CHECK".into(), "VALUE".into(), "NOTE".into()],
                vec!["a  b".into(), "1".into(), "".into()],
                vec!["long metric name".into(), "".into(), "x".into()],
            ]),
            Block::Line("after: the table".into()),
        ]
    );
    // Columns are counted in characters, not bytes (`bench vm` names rows with arrows).
    let mut t = crate::table::Table::new(["BENCH", "N"]);
    t.row(["cold boot → first exec", "8"]);
    let Block::Table(rows) = &blocks(&t.render())[0] else {
        panic!("not a table")
    };
    assert_eq!(rows[1], ["cold boot → first exec", "8"]);
    assert_eq!(natural_key("s12"), ("s", 12));
    assert!(natural_key("s3") < natural_key("s12"));
}
