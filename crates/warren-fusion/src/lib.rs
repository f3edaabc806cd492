//! SandboxFusion's code-runner protocol on top of Warren's function calls.
//!
//! `POST /run_code` is the endpoint RL stacks call to run one program (a reward check, a code
//! tool): code, language, stdin, timeouts, a memory limit, files in, files fetched out.
//! `POST /run_jupyter` runs cells of python in one namespace, as a notebook kernel does
//! ([`JupyterPlan`]), also as one call. This crate owns the protocol only: it parses a request into a [`Plan`] — one
//! [`warren_types::CallRequest`] for the node's function pools, which give every call a fresh
//! environment — and turns the [`warren_types::CallResult`] back into the protocol's answer.
//! It never runs anything and knows nothing of HTTP: the node's and the gateway's handlers
//! call [`parse`], [`Plan::new`] and [`Plan::answer`], and send [`FusionError::status`] with
//! [`FusionError::body`] when a request is refused.
//!
//! Interpreted languages run as one call of their interpreter (Python on a warm interpreter).
//! Compiled languages run a small POSIX-shell driver inside the call that checks the tools the
//! language needs, compiles under the compile timeout, then runs under the run timeout, and
//! leaves each step's status in files the call returns; so compile and run are one call and
//! nothing of it outlives it.

mod error;
mod jupyter;
mod lang;
mod plan;
mod wire;

pub use error::FusionError;
pub use jupyter::{
    parse_jupyter, CellRunResult, JupyterPlan, RunJupyterRequest, RunJupyterResponse,
};
pub use lang::{Language, Toolchain, LANGUAGES};
pub use plan::{Plan, WORKDIR};
pub use wire::{
    parse, CommandRunResult, CommandRunStatus, RunCodeRequest, RunCodeResponse, RunStatus,
};

/// The largest request body a node or a gateway reads (files in ride in it, base64).
pub const MAX_BODY: usize = 32 << 20;

/// A request body over [`MAX_BODY`] (or one that broke off) as the protocol's refusal.
pub fn body_error(e: impl std::fmt::Display) -> FusionError {
    FusionError::invalid(
        &["body"],
        format!("cannot read the body (at most {MAX_BODY} bytes): {e}"),
        "value_error",
    )
}

/// One fuzz input through the whole edge: parse, plan, and answer an empty result. Never
/// panics; used by the `run_code` fuzz target and the seeded property test.
pub fn fuzz_one(data: &[u8]) {
    match parse_jupyter(data).and_then(|r| JupyterPlan::new(&r)) {
        Ok((plan, call)) => {
            let _ = serde_json::to_vec(&call);
            let _ = serde_json::to_vec(&plan.answer(&warren_types::CallResult::default(), None));
        }
        Err(e) => {
            let _ = (e.status(), e.body(), e.retry_after());
        }
    }
    match parse(data).and_then(|r| Plan::new(&r)) {
        Ok((plan, call)) => {
            let _ = serde_json::to_vec(&call);
            let answer = plan.answer(&warren_types::CallResult::default(), None);
            let _ = serde_json::to_vec(&answer);
        }
        Err(e) => {
            let _ = (e.status(), e.body(), e.retry_after());
        }
    }
}

#[cfg(test)]
mod fuzz_tests {
    /// A small deterministic generator (xorshift), so the property test needs no crate.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }
    }

    const SEEDS: &[&str] = &[
        include_str!("../../../fuzz/seeds/run_code/verl.json"),
        include_str!("../../../fuzz/seeds/run_code/cpp.json"),
        include_str!("../../../fuzz/seeds/run_code/jupyter.json"),
    ];
    const PIECES: &[&str] = &[
        "null",
        "-1",
        "1e308",
        "\"\"",
        "[]",
        "{}",
        "\"../../..\"",
        "\"\\u0000\"",
        "\"java\"",
        "\"bash\"",
        "0",
        "\"aGk=\"",
        "{\"x\": null}",
        "\"public class A\"",
        "\"python3\"",
        "[\"1\", \"x =\"]",
        ",",
        ":",
        "\"",
    ];

    #[test]
    fn fuzz_seeded_mutations_never_panic() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for i in 0..4_000 {
            let mut b = SEEDS[i % SEEDS.len()].as_bytes().to_vec();
            for _ in 0..1 + rng.below(4) {
                let at = rng.below(b.len());
                match rng.below(4) {
                    0 => b[at] = rng.next() as u8,
                    1 => {
                        let end = (at + rng.below(12)).min(b.len());
                        b.drain(at..end);
                    }
                    _ => {
                        let p = PIECES[rng.below(PIECES.len())].as_bytes();
                        b.splice(at..at, p.iter().copied());
                    }
                }
                if b.is_empty() {
                    b.push(b'{');
                }
            }
            super::fuzz_one(&b);
        }
    }
}
