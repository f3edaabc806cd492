//! The `warren` command's parts, shared with `warren-bench`: one module per subcommand
//! ([`commands`]), latency statistics ([`stats`]) and plain-text tables ([`table`]).

pub mod commands;
pub mod stats;
pub mod table;

/// Drives `main` on a multi-threaded runtime and makes its answer the process's exit code;
/// an error is printed as `NAME: error` and exits 1.
pub fn run_main(
    name: &str,
    main: impl std::future::Future<Output = anyhow::Result<i32>>,
) -> std::process::ExitCode {
    use std::process::ExitCode;
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{name}: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(main);
    // A blocked stdin reader (shell, exec) must not hold the process open.
    runtime.shutdown_background();
    match result {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("{name}: {e:#}");
            ExitCode::FAILURE
        }
    }
}
