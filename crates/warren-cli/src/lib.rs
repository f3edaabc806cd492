//! The `warren` command's parts, shared with `warren-bench`: one module per subcommand
//! ([`commands`]), latency statistics ([`stats`]) and plain-text tables ([`table`]).

pub mod commands;
pub mod progress;
pub mod stats;
pub mod table;

/// Drives `main` on a multi-threaded runtime and makes its answer the process's exit code;
/// an error is printed as `NAME: error` and exits 1.
pub fn run_main(
    name: &str,
    main: impl std::future::Future<Output = anyhow::Result<i32>>,
) -> std::process::ExitCode {
    run_main_with(name, 1, |e| format!("{e:#}"), main)
}

/// [`run_main`] with the exit code of the command's own failures and how an error is printed.
pub fn run_main_with(
    name: &str,
    failure: u8,
    explain: impl Fn(&anyhow::Error) -> String,
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
            return ExitCode::from(failure);
        }
    };
    let result = runtime.block_on(main);
    // A blocked stdin reader (shell, exec) must not hold the process open.
    runtime.shutdown_background();
    match result {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("{name}: {}", explain(&e));
            ExitCode::from(failure)
        }
    }
}
