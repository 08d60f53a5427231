//! How long to wait before offering the database a write it refused (a
//! full disk, a lost connection) again: one policy, doubling from a quarter
//! of a second up to ten seconds, for every loop that keeps what it could
//! not write and tries again (the event log's appender, a deployment's end
//! record, the recovery at start, and `serve` reaching its database at
//! start), and, with waits of its own (`between`), the webhook's tries of
//! one event. Only counts time: never decides what is retried, what is
//! logged, nor when to give up; each caller does.

use std::time::Duration;

/// The waits between the tries of one write: `FIRST`, then each twice the
/// one before, at most `MAX`.
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
    first: Duration,
    max: Duration,
}

impl Backoff {
    pub const FIRST: Duration = Duration::from_millis(250);
    pub const MAX: Duration = Duration::from_secs(10);

    pub fn new() -> Self {
        Self::between(Self::FIRST, Self::MAX)
    }

    /// Waits from `first`, doubling, up to `max`.
    pub fn between(first: Duration, max: Duration) -> Self {
        Self {
            next: first,
            first,
            max,
        }
    }

    /// The wait before the next try, after a refusal.
    pub fn next_wait(&mut self) -> Duration {
        let wait = self.next;
        self.next = (wait * 2).min(self.max);
        wait
    }

    /// Whether a try was refused since the start or the last `reset`.
    pub fn retried(&self) -> bool {
        self.next > self.first
    }

    /// After a write went through: the next refusal waits `first` again.
    pub fn reset(&mut self) {
        self.next = self.first;
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_of_its_own_double_up_to_their_cap() {
        let s = Duration::from_secs;
        let mut backoff = Backoff::between(Duration::from_millis(500), s(30));
        let waits: Vec<Duration> = (0..8).map(|_| backoff.next_wait()).collect();
        assert_eq!(waits[..2], [Duration::from_millis(500), s(1)]);
        assert_eq!(waits[6..], [s(30), s(30)]);
        assert!(backoff.retried());
        backoff.reset();
        assert_eq!(backoff.next_wait(), Duration::from_millis(500));
    }

    #[test]
    fn waits_double_up_to_the_cap_and_start_over_after_a_success() {
        let ms = Duration::from_millis;
        let mut backoff = Backoff::new();
        assert!(!backoff.retried());
        let waits: Vec<Duration> = (0..8).map(|_| backoff.next_wait()).collect();
        assert_eq!(
            waits,
            [
                ms(250),
                ms(500),
                ms(1000),
                ms(2000),
                ms(4000),
                ms(8000),
                ms(10_000),
                ms(10_000)
            ]
        );
        assert!(backoff.retried());
        backoff.reset();
        assert!(!backoff.retried());
        assert_eq!(backoff.next_wait(), ms(250));
    }
}
