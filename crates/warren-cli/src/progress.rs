//! Progress for long work, shown on stderr only when it is a terminal (scripts and pipes get
//! the plain summary lines alone).

use std::io::IsTerminal as _;
use std::time::Duration;

/// A spinner with the elapsed time, cleared when dropped; `None` off a terminal.
pub struct Spinner(Option<indicatif::ProgressBar>);

impl Spinner {
    pub fn start(what: impl Into<String>) -> Spinner {
        if !std::io::stderr().is_terminal() {
            return Spinner(None);
        }
        let pb = indicatif::ProgressBar::new_spinner();
        if let Ok(style) = indicatif::ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
            pb.set_style(style);
        }
        pb.set_message(what.into());
        pb.enable_steady_tick(Duration::from_millis(120));
        Spinner(Some(pb))
    }

    /// Changes what the spinner says.
    #[allow(dead_code)]
    pub fn say(&self, what: impl Into<String>) {
        if let Some(pb) = &self.0 {
            pb.set_message(what.into());
        }
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        if let Some(pb) = self.0.take() {
            pb.finish_and_clear();
        }
    }
}
