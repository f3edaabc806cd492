//! Fuzzes SandboxFusion's `/run_code` and `/run_jupyter` edges: arbitrary bytes through
//! `warren_fusion::parse` and `Plan::new`, and `parse_jupyter` and `JupyterPlan::new`, whose
//! answers must be `Ok` or a refusal in the protocol's shape; a plan's answer to an empty call
//! result must not panic either.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    warren_fusion::fuzz_one(data);
});
