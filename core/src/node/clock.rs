//! Injectable time. Production reads the system clock; tests move a manual
//! clock across month boundaries or retry delays without sleeping.
//!
//! The node's clock ([`SystemClock`]) is the wall clock read once, at start,
//! and advanced from then on by the monotonic clock. Every instant the node
//! writes or compares (received times, lease expiries, webhook retry times,
//! the future/retention bounds of `occurred_at`, partitions to create) comes
//! from it, so a step of the machine's wall clock while the node runs — an
//! hour ahead and back, a leap smear gone wrong, an operator's `date -s` —
//! changes none of them: leases keep their length, retries their delays,
//! received times never go backwards. Durations (timeouts, deadlines,
//! backoff, rate limits) use the monotonic clock directly. What the node
//! does not follow is a correction: a wall clock that was wrong at start
//! and is stepped right later is followed at the next start;
//! [`Clock::wall_drift`] tells how far apart the two are (the node warns).

use std::{sync::Arc, time::Instant};

use chrono::{DateTime, Duration, Utc};
use parking_lot::Mutex;

pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    fn now(&self) -> DateTime<Utc>;

    /// How far the machine's wall clock is from this clock (positive: the
    /// wall clock is ahead); `None` for a clock that is not the system's.
    fn wall_drift(&self) -> Option<Duration> {
        None
    }
}

pub type SharedClock = Arc<dyn Clock>;

/// The wall clock at start, advanced by the monotonic clock (see the
/// module docs).
#[derive(Debug, Clone, Copy)]
pub struct SystemClock {
    wall_at_start: DateTime<Utc>,
    started: Instant,
}

impl Default for SystemClock {
    fn default() -> Self {
        SystemClock {
            wall_at_start: Utc::now(),
            started: Instant::now(),
        }
    }
}

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        // Fits: a process runs for less than 292,000 years.
        self.wall_at_start + Duration::from_std(self.started.elapsed()).unwrap_or(Duration::MAX)
    }

    fn wall_drift(&self) -> Option<Duration> {
        Some(Utc::now() - self.now())
    }
}

/// A clock that only moves when told to.
#[derive(Debug)]
pub struct ManualClock {
    now: Mutex<DateTime<Utc>>,
}

impl ManualClock {
    pub fn new(start: DateTime<Utc>) -> Arc<Self> {
        Arc::new(Self {
            now: Mutex::new(start),
        })
    }

    pub fn set(&self, to: DateTime<Utc>) {
        *self.now.lock() = to;
    }

    pub fn advance(&self, by: Duration) {
        *self.now.lock() += by;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.now.lock()
    }
}

pub fn system() -> SharedClock {
    Arc::new(SystemClock::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_system_clock_follows_the_monotonic_clock_from_the_wall_at_start() {
        let clock = SystemClock::default();
        let a = clock.now();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let b = clock.now();
        assert!(b - a >= Duration::milliseconds(20), "{a} {b}");
        // With an unstepped wall clock the two agree.
        let drift = clock.wall_drift().unwrap();
        assert!(drift.abs() < Duration::milliseconds(100), "{drift}");
        // A wall clock stepped since start shows as drift, not as time.
        let stepped = SystemClock {
            wall_at_start: Utc::now() - Duration::hours(1),
            started: Instant::now(),
        };
        assert!(stepped.wall_drift().unwrap() > Duration::minutes(59));
        assert!(Utc::now() - stepped.now() > Duration::minutes(59));
    }
}
