//! Latency summaries: percentiles (nearest rank), mean, min and max of millisecond samples.

use serde::Serialize;

/// The `p`-th percentile (0-100) of sorted samples by nearest rank; 0 when empty.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The mean of samples; 0 when empty.
pub fn mean(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        0.0
    } else {
        xs.iter().sum::<f64>() / xs.len() as f64
    }
}

/// A summary of latency samples in milliseconds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Latency {
    pub n: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub mean_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
}

impl Latency {
    pub fn from_samples(mut samples: Vec<f64>) -> Latency {
        samples.sort_by(f64::total_cmp);
        Latency {
            n: samples.len(),
            p50_ms: percentile(&samples, 50.0),
            p99_ms: percentile(&samples, 99.0),
            mean_ms: mean(&samples),
            min_ms: samples.first().copied().unwrap_or(0.0),
            max_ms: samples.last().copied().unwrap_or(0.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let xs: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&xs, 50.0), 50.0);
        assert_eq!(percentile(&xs, 99.0), 99.0);
        assert_eq!(percentile(&xs, 100.0), 100.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
        let l = Latency::from_samples(vec![3.0, 1.0, 2.0]);
        assert_eq!(
            (l.n, l.p50_ms, l.p99_ms, l.mean_ms, l.min_ms, l.max_ms),
            (3, 2.0, 3.0, 2.0, 1.0, 3.0)
        );
    }
}
