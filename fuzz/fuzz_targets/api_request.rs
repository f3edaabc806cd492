//! Fuzzes the API edge: arbitrary Content-Type, query string, path parameters and JSON body
//! through `warren_node::api::parse::parse_any`, which must answer `Ok` or a typed error.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The first byte picks the route's body; the rest splits into five fields at 0xff
    // bytes: content type, query, id, pid, body.
    let Some((first, data)) = data.split_first() else {
        return;
    };
    let bodies = warren_node::api::parse::Body::ALL;
    let kind = bodies[*first as usize % bodies.len()];
    let mut parts = data.splitn(5, |b| *b == 0xff);
    let ct = parts.next().unwrap_or_default();
    let query = parts.next().unwrap_or_default();
    let id = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
    let pid = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
    let body = parts.next().unwrap_or_default();
    let _ = warren_node::api::parse::parse_any(ct, query, &id, &pid, kind, body);
});
