//! Fuzzes the classification of E2B requests (`warren_e2b::route::fuzz_one`): the
//! `--e2b-domain`, the `Host`, `E2b-Sandbox-Id`, `E2b-Sandbox-Port` and `Authorization`
//! headers and the request target, all arbitrary. Each request goes to a sandbox, to E2B's
//! control plane or to Warren's API, or is refused in E2B's error shape; never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    warren_e2b::route::fuzz_one(data);
});
