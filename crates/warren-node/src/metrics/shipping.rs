//! The trajectory shipper's figures ([`crate::ship`], `warrend --trajectory-store`): what it
//! sent, how far the store is behind the node's log, and its store errors. They are
//! registered whether or not the node ships (all zero when it does not).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::time::Duration;

/// Upper bounds (seconds) of the shipping lag buckets: a segment waits 0.5 s at most before it
/// is cut, more during a store outage.
const LAG_BUCKETS: [f64; 12] = [
    0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// Shared handles: clones update the same values.
#[derive(Debug, Clone)]
pub struct ShipMetrics {
    pub segments: Counter,
    pub bytes: Counter,
    pub errors: Counter,
    /// Entries committed on the node and not yet in the store, at the shipper's last look.
    pub backlog: Gauge,
    lag_seconds: Histogram,
}

impl Default for ShipMetrics {
    fn default() -> Self {
        ShipMetrics {
            segments: Counter::default(),
            bytes: Counter::default(),
            errors: Counter::default(),
            backlog: Gauge::default(),
            lag_seconds: Histogram::new(LAG_BUCKETS),
        }
    }
}

impl ShipMetrics {
    /// A segment of `bytes` is in the store; its oldest entry was answered `lag` ago.
    pub fn shipped(&self, bytes: u64, lag: Duration) {
        self.segments.inc();
        self.bytes.inc_by(bytes);
        self.lag_seconds.observe(lag.as_secs_f64());
    }

    pub fn register(&self, reg: &mut Registry) {
        reg.register(
            "warren_trajectory_shipped_segments",
            "Trajectory segments written to the trajectory store",
            self.segments.clone(),
        );
        reg.register(
            "warren_trajectory_shipped_bytes",
            "Bytes of trajectory segments written to the trajectory store (outputs uploaded beside them not included)",
            self.bytes.clone(),
        );
        reg.register(
            "warren_trajectory_ship_errors",
            "Trajectory store errors met while shipping (each stops a pass; the next waits a backoff)",
            self.errors.clone(),
        );
        reg.register(
            "warren_trajectory_ship_backlog_entries",
            "Trajectory entries committed on the node and not yet in the trajectory store, at the shipper's last look",
            self.backlog.clone(),
        );
        reg.register(
            "warren_trajectory_ship_lag_seconds",
            "Per segment written: time from the end of its oldest entry's call to the segment being in the store",
            self.lag_seconds.clone(),
        );
    }
}
