//! The log output of the daemons (`warrend`, `warren-gateway`): `--log-format text|json` on
//! stderr, filtered by `RUST_LOG` (default `info`). Text has ANSI colours only when stderr
//! is a terminal; JSON is one object per line with the fields of the event and of its spans
//! (a request's `request_id`, see [`crate::request_id`]).

use std::io::IsTerminal;

/// `--log-format`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// The command-line flags of logging, for `#[command(flatten)]`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct LogArgs {
    /// Log lines as plain text or as JSON objects (one per line), on stderr.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// Installs the process's log subscriber.
pub fn init(args: &LogArgs) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match args.log_format {
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(true)
            .init(),
    }
}
