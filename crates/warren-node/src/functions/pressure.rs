//! The node's CPU pressure, from the kernel's pressure stall information (PSI).

/// Percent of the last 10 s in which some runnable task waited for a CPU, or `None` where the
/// kernel keeps no PSI (`CONFIG_PSI` off, or `psi=0`).
pub fn cpu_some_avg10() -> Option<f64> {
    parse(&std::fs::read_to_string("/proc/pressure/cpu").ok()?)
}

/// `some avg10=` of a PSI file.
fn parse(text: &str) -> Option<f64> {
    let line = text.lines().find(|l| l.starts_with("some "))?;
    line.split_whitespace()
        .find_map(|f| f.strip_prefix("avg10="))?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_some_avg10() {
        let t = "some avg10=4.89 avg60=7.86 avg300=7.26 total=285717064\n\
                 full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
        assert_eq!(parse(t), Some(4.89));
        assert_eq!(parse("full avg10=1.00\n"), None);
        assert_eq!(parse("some avg10=x\n"), None);
        assert_eq!(parse(""), None);
    }
}
