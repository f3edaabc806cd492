//! The host's pressure stall information (PSI, `/proc/pressure/{cpu,memory,io}`): what the
//! function pools and the cluster's load summary read of CPU pressure, and what `/metrics`
//! shows of every resource.
//!
//! A kernel without PSI (`CONFIG_PSI` off, or `psi=0`) has no such files: readers get `None`
//! or nothing, never a zero that would read as "no pressure".

/// One line of a pressure file: the `some` or `full` share (percent) of the last 10 s, and
/// the total stalled time.
#[derive(Debug, Clone, PartialEq)]
pub struct Pressure {
    pub kind: &'static str,
    pub avg10: f64,
    pub total_us: u64,
}

/// The lines of `/proc/pressure/{resource}` (`cpu`, `memory` or `io`); empty without PSI.
pub fn read(resource: &str) -> Vec<Pressure> {
    std::fs::read_to_string(format!("/proc/pressure/{resource}"))
        .map(|t| parse(&t))
        .unwrap_or_default()
}

/// Percent of the last 10 s in which some runnable task waited for a CPU, or `None` where the
/// kernel keeps no PSI.
pub fn cpu_some_avg10() -> Option<f64> {
    read("cpu")
        .into_iter()
        .find(|p| p.kind == "some")
        .map(|p| p.avg10)
}

/// Parses a pressure file (`some avg10=0.00 avg60=0.00 avg300=0.00 total=0`, then `full …`).
pub fn parse(text: &str) -> Vec<Pressure> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let kind = match fields.next() {
            Some("some") => "some",
            Some("full") => "full",
            _ => continue,
        };
        let (mut avg10, mut total_us) = (None, None);
        for f in fields {
            match f.split_once('=') {
                Some(("avg10", v)) => avg10 = v.parse::<f64>().ok(),
                Some(("total", v)) => total_us = v.parse::<u64>().ok(),
                _ => {}
            }
        }
        if let (Some(avg10), Some(total_us)) = (avg10, total_us) {
            out.push(Pressure {
                kind,
                avg10,
                total_us,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pressure_lines_parse() {
        let text = "some avg10=4.89 avg60=7.86 avg300=7.26 total=285717064\n\
                    full avg10=0.00 avg60=0.00 avg300=0.00 total=42\n\
                    garbage\n";
        assert_eq!(
            parse(text),
            vec![
                Pressure {
                    kind: "some",
                    avg10: 4.89,
                    total_us: 285717064
                },
                Pressure {
                    kind: "full",
                    avg10: 0.0,
                    total_us: 42
                },
            ]
        );
        assert!(parse("").is_empty());
        assert!(parse("some avg10=x total=1\n").is_empty());
        assert!(parse("full avg10=1.00\n").is_empty());
    }
}
