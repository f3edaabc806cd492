//! Warren's integration tests. Everything lives under `tests/`: each test starts its own
//! `warrend` (from `$WARREN_BIN_DIR`, default `<repo>/target/release`) with a private socket,
//! state directory and node name, drives real sandboxes through `warren-client`, and tears
//! everything down again. They need root; without it (or without the binaries) each test
//! prints `SKIP: <why>` and returns.
//!
//! `tests/zz_leaks.rs` runs last and checks that the daemons of the run left no cgroups,
//! agent processes or mounts behind.
