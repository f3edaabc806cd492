//! The skip rule of every test that needs root, a built binary or a tool `scripts/setup.sh`
//! installs: on a developer's machine the test says why it cannot run and returns; under
//! `CI=true` (the suite on a machine `scripts/setup.sh` prepared) that is a failure.
//! Included by path into each test crate's helpers.

/// Reports that a test cannot run here because of `why`. Returns (so the caller returns)
/// only when not under `CI=true`; there it fails the test.
pub fn skip(why: impl std::fmt::Display) {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("this test cannot run under CI=true: {why}");
    }
    println!("SKIP: {why}");
}
