//! SandboxFusion's `POST /run_jupyter` through a gateway: placed like a function call on a
//! node of the cluster and answered in the protocol's shape — cells in one namespace, files in
//! and out, an exception as the cell's error, a run cut short by its total timeout, nothing
//! of one run seen by the next, and refusals in the protocol's shape.

use base64::Engine as _;
use serde_json::{json, Value};

use crate::harness::{http, Cluster};

/// `warren_fusion::MAX_BODY` (this crate does not link warren-fusion).
fn warren_fusion_max_body() -> usize {
    32 << 20
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// A cell that defines `sleeping()`: the pids of the `sleep` processes it can see.
const PROBE: &str = r#"
import os
def sleeping():
    found = []
    for p in filter(str.isdigit, os.listdir('/proc')):
        try:
            if open(f'/proc/{p}/cmdline', 'rb').read().startswith(b'sleep'):
                found.append(p)
        except OSError:
            pass
    return found
"#;

async fn jupyter(port: u16, body: &Value) -> (u16, Value) {
    let (status, text) = http(port, "POST", "/run_jupyter", &body.to_string()).await;
    let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    (status, v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_jupyter_through_a_gateway() {
    let Some(c) = Cluster::start(2, 1, |_| Vec::new()).await else {
        return;
    };
    let port = c.gateways[0].port;
    let node_names: Vec<&str> = c.nodes.iter().map(|d| d.node.as_str()).collect();

    // Cells share one namespace; each has its own output, display and error; a file given
    // in is readable and one written is fetched back.
    let (status, v) = jupyter(
        port,
        &json!({
            "cells": [
                "a = 6\nprint('in', open('in.txt').read())",
                "import sys; print('to stderr', file=sys.stderr); a * 7",
                "open('out.txt', 'w').write(str(a) * 2)\n1 / 0",
                "a + 1",
            ],
            "files": {"in.txt": b64("hello")},
            "fetch_files": ["out.txt"],
        }),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["status"], "Success", "{v}");
    let cells = v["cells"].as_array().expect("cells");
    assert_eq!(cells.len(), 4, "{v}");
    assert_eq!(cells[0]["stdout"], "in hello\n", "{v}");
    assert_eq!(cells[1]["stderr"], "to stderr\n", "{v}");
    assert_eq!(cells[1]["display"][0]["text/plain"], "42", "{v}");
    assert_eq!(cells[2]["error"][0]["ename"], "ZeroDivisionError", "{v}");
    assert_eq!(
        cells[3]["display"][0]["text/plain"], "7",
        "a cell after an exception still runs: {v}"
    );
    assert_eq!(v["files"]["out.txt"], b64("66"), "{v}");
    let ran_on = v["executor_pod_name"].as_str().expect("executor_pod_name");
    assert!(
        node_names.contains(&ran_on),
        "ran on {ran_on}, not a node of the cluster {node_names:?}"
    );

    // Nothing of one run reaches the next: a file, a variable, a process.
    let (_, v) = jupyter(
        port,
        &json!({"cells": [
            "open('/tmp/left-behind', 'w').write('x')\nimport subprocess\n\
             subprocess.Popen(['sleep', '300'])\nsecret = 1",
        ]}),
    )
    .await;
    assert_eq!(v["status"], "Success", "{v}");
    for _ in 0..4 {
        let (_, v) = jupyter(
            port,
            &json!({"cells": [
                PROBE,
                "(os.path.exists('/tmp/left-behind'), 'secret' in globals(), sleeping())",
            ]}),
        )
        .await;
        assert_eq!(v["status"], "Success", "{v}");
        assert_eq!(
            v["cells"][1]["display"][0]["text/plain"], "(False, False, [])",
            "a later run saw an earlier one: {v}"
        );
    }

    // A run cut short by its total timeout answers the cells that ended.
    let (status, v) = jupyter(
        port,
        &json!({
            "cells": ["print('first')", "import time\ntime.sleep(60)", "print('never')"],
            "total_timeout": 2,
        }),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["status"], "Failed", "{v}");
    assert_eq!(v["cells"][0]["stdout"], "first\n", "{v}");
    assert!(
        v["cells"].as_array().unwrap().len() < 3,
        "the last cell cannot have run: {v}"
    );

    // A body over 2 MiB (files in ride in it) is taken as a node takes it, up to its limit.
    let big = "x".repeat(3 << 20);
    let (status, v) = jupyter(
        port,
        &json!({
            "cells": ["print(len(open('big.txt').read()))"],
            "files": {"big.txt": b64(&big)},
        }),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["cells"][0]["stdout"], format!("{}\n", 3 << 20), "{v}");
    let (status, v) = jupyter(
        port,
        &json!({"cells": [], "files": {"huge": "x".repeat(warren_fusion_max_body() + 1)}}),
    )
    .await;
    assert_eq!(status, 422, "{v}");
    assert_eq!(v["detail"][0]["loc"][0], "body", "{v}");

    // Refusals in the protocol's shape: a body that does not validate (by the gateway
    // itself), and an image no node has.
    let (status, v) = jupyter(port, &json!({"cells": "not a list"})).await;
    assert_eq!(status, 422, "{v}");
    assert_eq!(v["detail"][0]["loc"][0], "body", "{v}");
    let (status, v) = jupyter(port, &json!({"cells": [], "kernel": "r"})).await;
    assert_eq!(status, 422, "a kernel other than python: {v}");
    let (status, v) = jupyter(
        port,
        &json!({"cells": ["1"], "image": format!("nosuch{}:1", std::process::id())}),
    )
    .await;
    assert!((400..600).contains(&status), "{status} {v}");
    assert!(
        v["detail"].is_string() || v["detail"].is_array(),
        "a refusal in the protocol's shape: {v}"
    );
    assert!(v["code"].is_string(), "with Warren's code beside: {v}");
}
