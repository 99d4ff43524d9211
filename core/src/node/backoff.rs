//! Capped exponential backoff with jitter, for whatever restarts after a
//! failure (supervised actors, the embedded checkpointer). What stayed up
//! long enough earns a reset.

use std::time::{Duration, Instant};

use rand::Rng;

#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    max: Duration,
    /// Up time after which the next failure starts from `base` again.
    reset_after: Duration,
    attempt: u32,
    last_start: Option<Instant>,
}

/// The longest wait between two restarts: whatever failed because a
/// dependency was away is running again at most this long after it
/// returns (the fault suite holds a node to 10 s).
pub const MAX_DELAY: Duration = Duration::from_secs(5);

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new(Duration::from_millis(100), MAX_DELAY)
    }
}

impl Backoff {
    pub fn new(base: Duration, max: Duration) -> Self {
        Backoff {
            base,
            max,
            reset_after: Duration::from_secs(60),
            attempt: 0,
            last_start: None,
        }
    }

    /// Records that the child (re)started now.
    pub fn started(&mut self) {
        self.last_start = Some(Instant::now());
    }

    /// Delay before the next restart.
    pub fn next_delay(&mut self) -> Duration {
        if self
            .last_start
            .is_some_and(|t| t.elapsed() >= self.reset_after)
        {
            self.attempt = 0;
        }
        let exp = self.base.saturating_mul(1u32 << self.attempt.min(16));
        self.attempt = self.attempt.saturating_add(1);
        let capped = exp.min(self.max);
        // ±20 % jitter so restarts of many children do not synchronise.
        let jitter = rand::rng().random_range(0.8..1.2);
        capped.mul_f64(jitter).min(self.max)
    }

    pub fn attempts(&self) -> u32 {
        self.attempt
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_and_caps() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let d1 = b.next_delay();
        let d2 = b.next_delay();
        assert!(d1 >= Duration::from_millis(80) && d1 <= Duration::from_millis(120));
        assert!(d2 >= Duration::from_millis(160) && d2 <= Duration::from_millis(240));
        for _ in 0..10 {
            assert!(b.next_delay() <= Duration::from_secs(1));
        }
        assert_eq!(b.attempts(), 12);
    }
}
